"""The policy node: ROS 2 topics in, the sim-trained ``Policy`` in the middle, safe joint commands out.

Subscriptions (decoded and validated; a bad message is counted in ``rejected`` and dropped, never
turned into a command): cameras (sensor_msgs/Image), joint states (sensor_msgs/JointState),
instruction (std_msgs/String), e-stop (std_msgs/Bool). Inference runs in its own thread on the
newest complete observation and queues actions (an action chunk (T, A) queues T steps); the control
loop ticks at ``control_rate_hz``, pops one action (or holds), maps it to a joint target, runs the
safety filter and publishes, so the command stream never waits for the model.

Observation built for the policy: ``rgb`` (1, V, H, W, 3) uint8 in camera order (absent without
cameras), ``state`` (1, 2J) float32 = joint positions then velocities (zeros where the robot sends
none) or, with ``state_source: topic``, the vector from the state topic; ``instruction`` [str].
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from real_robot import messages as m
from real_robot.config import RobotConfig
from real_robot.safety import Decision, SafetyFilter
from real_robot.transport.base import QoS, Transport
from robo_rl.errors import ConfigError

log = logging.getLogger(__name__)


class PolicyNode:
    def __init__(self, robot: RobotConfig, policy: Any, transport: Transport,
                 clock: Callable[[], float] = time.monotonic, reactive: bool = False,
                 recorder: Any = None) -> None:
        """``reactive``: send a command as soon as a joint state arrives, inferring when the queue is
        empty (an action chunk then runs open-loop, as in the simulator; latency benchmark and
        ``eval --via-ros``); a deployment uses ``start()``'s fixed-rate control loop."""
        self.robot = robot
        self.reactive = reactive
        self.recorder = recorder  # a real_robot.recorder.BagRecorder, or None
        self.policy = policy
        self.transport = transport
        self.clock = clock
        # a hold of velocity (twist) or raw controller (passthrough) commands is the zero command
        self.safety = SafetyFilter(robot.safety, fk=robot.forward_kinematics(),
                                   hold_zero=robot.action_mode in ("ee_twist", "passthrough"))
        self.rejected: Counter[str] = Counter()
        self.sent = 0
        self.missed_ticks = 0
        self._lock = threading.Lock()
        self._images: list[tuple[np.ndarray, float] | None] = [None] * len(robot.cameras)
        self._joints: tuple[np.ndarray, np.ndarray, float] | None = None
        self._state: tuple[np.ndarray, float] | None = None
        self._instruction = robot.default_instruction
        self._queue: deque[np.ndarray] = deque()  # bounded by the inference loop (it refills below 2)
        self._obs_seq = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._subs = [transport.subscribe(robot.joint_states_topic, "sensor_msgs/msg/JointState", self._on_joints),
                      transport.subscribe(robot.instruction_topic, "std_msgs/msg/String", self._on_instruction),
                      transport.subscribe(robot.estop_topic, "std_msgs/msg/Bool", self._on_estop)]
        if robot.state_source == "topic":
            self._subs.append(transport.subscribe(robot.state_topic, "std_msgs/msg/Float64MultiArray", self._on_state))
        for i, cam in enumerate(robot.cameras):
            self._subs.append(transport.subscribe(cam.topic, "sensor_msgs/msg/Image",
                                                  lambda raw, t, i=i: self._on_image(i, raw, t), QoS.sensor_data()))
        self._pub = transport.publisher(robot.command_topic, robot.command_type)

    # -- subscriptions ------------------------------------------------------------------------------
    def _reject(self, kind: str, err: Exception) -> None:
        self.rejected[kind] += 1
        log.warning("rejected %s message: %s", kind, err)

    def _record(self, topic: str, raw: bytes) -> None:
        if self.recorder is not None:
            self._recorder_call(self.recorder.write, topic, raw, time.time_ns())

    def _recorder_call(self, method: Callable[..., None], *args: Any) -> None:
        """Call a recorder method; a failing recorder (full disk) is counted, never stops control."""
        try:
            method(*args)
        except Exception as err:
            self.rejected["record_error"] += 1
            if self.rejected["record_error"] == 1:
                log.error("recording failed (%s: %s); control goes on unrecorded", type(err).__name__, err)

    def _on_image(self, i: int, raw: bytes, _t: float) -> None:
        cam = self.robot.cameras[i]
        self._record(cam.topic, raw)
        try:
            rgb = m.image_to_rgb(m.deserialize(raw, "sensor_msgs/msg/Image"), (cam.height, cam.width))
        except m.MessageError as err:
            return self._reject("image", err)
        with self._lock:
            self._images[i] = (rgb, self.clock())
            self._obs_seq += 1

    def _on_joints(self, raw: bytes, _t: float) -> None:
        self._record(self.robot.joint_states_topic, raw)
        try:
            q, qd = m.joints_in_order(m.deserialize(raw, "sensor_msgs/msg/JointState"), list(self.robot.joint_names))
        except m.MessageError as err:
            return self._reject("joint_states", err)
        with self._lock:
            self._joints = (q, qd if qd is not None else np.zeros_like(q), self.clock())
            self._obs_seq += 1
        if self.reactive:
            if not self._queue:
                self.infer_once()
            self.control_tick()

    def _on_state(self, raw: bytes, _t: float) -> None:
        self._record(self.robot.state_topic, raw)
        try:
            x = np.asarray(m.deserialize(raw, "std_msgs/msg/Float64MultiArray").data, dtype=np.float64)
            if not np.all(np.isfinite(x)):
                raise m.MessageError("state holds non-finite values")
        except m.MessageError as err:
            return self._reject("state", err)
        with self._lock:
            self._state = (x, self.clock())

    def _on_instruction(self, raw: bytes, _t: float) -> None:
        self._record(self.robot.instruction_topic, raw)
        try:
            self._instruction = str(m.deserialize(raw, "std_msgs/msg/String").data)
        except m.MessageError as err:
            self._reject("instruction", err)

    def _on_estop(self, raw: bytes, _t: float) -> None:
        try:
            engaged = bool(m.deserialize(raw, "std_msgs/msg/Bool").data)
        except m.MessageError as err:
            # an unreadable e-stop message is treated as a stop request
            self._reject("estop", err)
            engaged = True
        self.safety.estop(engaged)
        if engaged:
            self._queue.clear()

    # -- start-up checks ----------------------------------------------------------------------------
    def _inputs(self) -> list[tuple[str, str, bool]]:
        """(topic, expected type, required for an observation) of every subscription."""
        r = self.robot
        out = [(r.joint_states_topic, "sensor_msgs/msg/JointState", True),
               (r.instruction_topic, "std_msgs/msg/String", False), (r.estop_topic, "std_msgs/msg/Bool", False)]
        out += [(cam.topic, "sensor_msgs/msg/Image", True) for cam in r.cameras]
        if r.state_source == "topic":
            out.append((r.state_topic, "std_msgs/msg/Float64MultiArray", True))
        return out

    def check_types(self) -> None:
        """One-line ConfigError if a discovered peer uses one of our topics with another message type."""
        for topic, expected, _ in self._inputs():
            wrong = self.transport.endpoint_types(topic, "publisher") - {expected}
            if wrong:
                raise ConfigError(f"topic {topic} is published as {', '.join(sorted(wrong))}; robot config "
                                  f"'{self.robot.name}' subscribes to it as {expected}")
        wrong = self.transport.endpoint_types(self.robot.command_topic, "subscriber") - {self.robot.command_type}
        if wrong:
            raise ConfigError(f"the robot's controller listens on {self.robot.command_topic} for {', '.join(sorted(wrong))}"
                              f", robot config '{self.robot.name}' sends command_type {self.robot.command_type}")

    def wait_ready(self, timeout_s: float, poll_s: float = 0.05) -> None:
        """Block until every required input has delivered a valid message; before any command is sent.

        Raises a one-line ConfigError for a topic type mismatch (as soon as discovery shows it) or,
        after ``timeout_s``, naming each input that never arrived (a missing camera, no joint states).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_types()
            if self.observation() is not None:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(poll_s)
        with self._lock:
            have = {self.robot.joint_states_topic: self._joints is not None, self.robot.state_topic: self._state is not None}
            have.update({cam.topic: img is not None for cam, img in zip(self.robot.cameras, self._images)})
        missing = []
        for topic, typ, required in self._inputs():
            if required and not have.get(topic, False):
                pubs = self.transport.endpoint_types(topic, "publisher")
                missing.append(f"{topic} ({typ}; {'publishers seen but no valid message' if pubs else 'no publisher'})")
        rejected = f"; rejected so far: {dict(self.rejected)}" if self.rejected else ""
        raise ConfigError(f"robot '{self.robot.name}': nothing valid within {timeout_s:g} s on {', '.join(missing)}"
                          f"{rejected}; check the drivers or the robot config's topics")

    # -- observation and inference ------------------------------------------------------------------
    def observation(self) -> tuple[dict[str, Any], float] | None:
        """(Observation with B = 1, age in seconds of its oldest part), or None before data arrives."""
        with self._lock:
            if self._joints is None or any(img is None for img in self._images):
                return None
            q, qd, tj = self._joints
            imgs = [img for img in self._images if img is not None]
            stamps = [tj] + [t for _, t in imgs]
            if self.robot.state_source == "topic":
                if self._state is None:
                    return None
                state, ts = self._state
                stamps.append(ts)
            else:
                state = np.concatenate([q, qd])
            obs: dict[str, Any] = {"state": state[None].astype(np.float32), "instruction": [self._instruction]}
            if imgs:
                obs["rgb"] = np.stack([rgb for rgb, _ in imgs])[None]
        return obs, self.clock() - min(stamps)

    def infer_once(self) -> bool:
        """Run the policy on the newest observation and queue its action(s). False if no data or it failed."""
        got = self.observation()
        if got is None:
            return False
        obs, _ = got
        try:
            with torch.no_grad():
                out = self.policy.act({k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in obs.items()},
                                      deterministic=True)
            actions = np.asarray(torch.as_tensor(out.actions).detach().cpu(), dtype=np.float64)[0]
            if actions.ndim not in (1, 2) or actions.shape[-1] != self.robot.command_dim or not len(actions):
                raise ValueError(f"policy action of shape {actions.shape}; robot '{self.robot.name}' takes "
                                 f"({self.robot.command_dim},) or a chunk (T, {self.robot.command_dim})")
        except Exception as err:  # the robot must get a safe stop, whatever the model does
            self.rejected["policy_error"] += 1
            log.error("policy raised %s: %s", type(err).__name__, err)
            self._queue.clear()
            self._queue.append(np.full(self.robot.command_dim, np.nan))
            return False
        for a in np.atleast_2d(actions):
            self._queue.append(a)
        return True

    # -- control ------------------------------------------------------------------------------------
    def control_tick(self) -> Decision | None:
        """One control period: next queued action -> joint target -> safety -> publish."""
        got = self.observation()
        if got is None or self._joints is None:
            return None
        _, age = got
        q = self._joints[0]
        action = self._queue.popleft() if self._queue else None
        target: np.ndarray | None
        if self.robot.action_mode == "ee_twist":
            # velocity commands: the reference for the change limit is the last twist sent (zero at start)
            q = np.zeros(6)
            target = np.zeros(6) if action is None else action
        elif self.robot.action_mode == "passthrough":
            # raw controller actions (e.g. joint deltas): no memory between steps, a hold is the zero action
            self.safety.last = None
            q = np.zeros_like(q)
            target = q if action is None else action
        elif action is None:
            target = self.safety.last if self.safety.last is not None else q
        elif self.robot.action_mode == "delta_joint":
            target = q + action
        else:
            target = action
        decision = self.safety(target, q, age)
        self._publish(decision.command)
        if self.recorder is not None and (decision.held or decision.interventions):
            self._recorder_call(self.recorder.intervention, decision.held, decision.interventions, time.time_ns())
        return decision

    def safe_tick(self) -> Decision | None:
        """``control_tick`` that never raises: on any error (a recorder's disk, a transport hiccup) it
        counts ``control_error`` and tries to send a hold, so the control thread keeps running."""
        try:
            return self.control_tick()
        except Exception as err:
            self.rejected["control_error"] += 1
            log.error("control tick raised %s: %s; holding", type(err).__name__, err)
            try:
                # (with hold_zero the hold is the zero command whatever is measured)
                measured = self._joints[0] if self._joints is not None else np.zeros(self.robot.command_dim)
                decision = self.safety.hold(measured, ["control_error"])
                self._publish(decision.command)
                return decision
            except Exception as err2:
                log.error("could not send the hold: %s: %s", type(err2).__name__, err2)
                return None

    def _publish(self, command: np.ndarray) -> None:
        now = time.time()
        if self.robot.command_type == "std_msgs/msg/Float64MultiArray":
            msg = m.float64_array(command)
        elif self.robot.action_mode == "ee_twist":
            msg = m.twist_stamped(command[:3], command[3:], now, self.robot.twist_frame)
        else:
            msg = m.joint_trajectory(list(self.robot.joint_names), command[None], 1.0 / self.robot.control_rate_hz, now)
        cdr = m.serialize(msg, self.robot.command_type)
        self._pub.publish(cdr)
        self._record(self.robot.command_topic, cdr)
        self.sent += 1

    def start(self) -> None:
        """Inference and control threads (control at ``control_rate_hz``)."""
        def infer_loop() -> None:
            seen = -1
            while not self._stop.is_set():
                if self._obs_seq != seen and len(self._queue) < 2 and self.infer_once():
                    seen = self._obs_seq
                else:
                    time.sleep(0.001)

        def control_loop() -> None:
            period = 1.0 / self.robot.control_rate_hz
            nxt = time.monotonic()
            while not self._stop.is_set():
                self.safe_tick()
                nxt += period
                late = time.monotonic() - nxt
                if late > 0:
                    # overran (GC pause, slow publish): drop the missed ticks instead of sending them
                    # back to back, which would move the arm max_delta per tick at many ticks per period
                    skipped = int(late // period) + 1
                    self.missed_ticks += skipped
                    nxt += skipped * period
                    log.warning("control loop %.0f ms late: skipped %d tick(s)", 1000 * late, skipped)
                time.sleep(max(0.0, nxt - time.monotonic()))

        self._threads = [threading.Thread(target=infer_loop, daemon=True, name="infer"),
                         threading.Thread(target=control_loop, daemon=True, name="control")]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop the loops and send one hold command (the last safe target; the zero command for twist and
        passthrough control)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2.0)
        if self.safety.hold_zero:
            self._publish(np.zeros(self.robot.command_dim))  # velocity control: stop
        elif self.safety.last is not None:
            self._publish(self.safety.last)
        for s in self._subs:
            s.close()
