"""The robot's side of ROS 2, without a policy: validated inputs in, safe commands out.

``RosBridge`` implements ``robo_rl.contracts.RobotBridge``. Subscriptions (decoded and validated; a bad
message is counted in ``rejected`` under its reason and dropped, never turned into a command; each reason
is logged at most once per 10 s): cameras (sensor_msgs/Image, sensor-data QoS), joint states
(sensor_msgs/JointState), the state vector (std_msgs/Float64MultiArray, with ``state_source: topic``),
instruction (std_msgs/String), e-stop (std_msgs/Bool: True latches; only ``reset_estop`` releases).
Every command goes through the safety filter (``send_action``, ``send_hold``). ``PolicyNode`` adds the
policy and its loops; ``RobotEnv`` makes a bridge a VecEnv with B = 1.

Observation: ``rgb`` (1, V, H, W, 3) uint8 in camera order (absent without cameras), ``state`` (1, 2J)
float32 = joint positions then velocities (zeros where the robot sends none) or, with
``state_source: topic``, the vector from the state topic; ``instruction`` [str].
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from real_robot import messages as m
from real_robot.config import RobotConfig
from real_robot.diagnostics import LoopTiming
from real_robot.safety import Decision, SafetyFilter, ThrottledLog
from real_robot.transport.base import QoS, Transport
from robo_rl.contracts import Observation
from robo_rl.errors import ConfigError

log = logging.getLogger(__name__)


class RosBridge:
    """A robot behind ROS 2 topics (``robo_rl.contracts.RobotBridge``)."""

    def __init__(self, robot: RobotConfig, transport: Transport, clock: Callable[[], float] = time.monotonic,
                 recorder: Any = None, state_dim: int | None = None, node_name: str = "robo_rl_policy") -> None:
        """``recorder``: a ``real_robot.recorder.BagRecorder`` (every input and command), or None;
        ``state_dim``: the policy's state length, enforced on the state topic."""
        self.robot = robot
        self.recorder = recorder
        self.transport = transport
        self.clock = clock
        self.state_dim = state_dim
        self.node_name = node_name
        # a hold of velocity (twist) or raw controller (passthrough) commands is the zero command
        self.safety = SafetyFilter(robot.safety, fk=robot.forward_kinematics(),
                                   hold_zero=robot.action_mode in ("ee_twist", "passthrough"))
        self.rejected: Counter[str] = Counter()
        self.received: Counter[str] = Counter()  # valid messages per input (joint_states, state, camera i)
        self.sent = 0
        self.missed_ticks = 0  # control ticks a loop over this bridge skipped (reported in diagnostics)
        self.timing = LoopTiming()
        self._log = ThrottledLog(log)
        self._lock = threading.Lock()
        self._images: list[tuple[np.ndarray, float] | None] = [None] * len(robot.cameras)
        self._joints: tuple[np.ndarray, np.ndarray, float] | None = None
        self._state: tuple[np.ndarray, float] | None = None
        self._instruction = robot.default_instruction
        self._obs_seq = 0  # counts joint states and images received
        self._obs_event = threading.Event()  # set on each input
        self._joints_seen = threading.Condition()  # notified on each valid joint state
        self._subs = [transport.subscribe(robot.joint_states_topic, "sensor_msgs/msg/JointState", self._on_joints),
                      transport.subscribe(robot.instruction_topic, "std_msgs/msg/String", self._on_instruction),
                      transport.subscribe(robot.estop_topic, "std_msgs/msg/Bool", self._on_estop)]
        if robot.state_source == "topic":
            self._subs.append(transport.subscribe(robot.state_topic, "std_msgs/msg/Float64MultiArray", self._on_state))
        for i, cam in enumerate(robot.cameras):
            self._subs.append(transport.subscribe(cam.topic, "sensor_msgs/msg/Image",
                                                  lambda raw, t, i=i: self._on_image(i, raw, t), QoS.sensor_data()))
        self._pub = transport.publisher(robot.command_topic, robot.command_type)
        self._diag_pub = transport.publisher("/diagnostics", "diagnostic_msgs/msg/DiagnosticArray")

    # -- RobotBridge ----------------------------------------------------------------------------------
    def connect(self, timeout_s: float = 30.0) -> None:
        """Wait until every required input delivered a valid message (``wait_ready``)."""
        self.wait_ready(timeout_s)

    def get_observation(self) -> Observation:
        """The newest complete observation (B = 1); ConfigError naming the missing inputs before one exists."""
        got = self.observation()
        if got is None:
            self.wait_ready(0.0)
            raise ConfigError(f"robot '{self.robot.name}': no complete observation yet")  # raced with wait_ready
        return got[0]

    def send_action(self, action: np.ndarray | None) -> Decision | None:
        """Map one action (command_dim,) to a target under the robot's action mode, filter it for safety and
        publish the result (None: a hold). Returns the filter's decision (None before any joint state)."""
        got = self.observation()
        if got is None or self._joints is None:
            return None
        target, ref = self._target(action, self._joints[0])
        decision = self.safety(target, ref, got[1])
        self._publish(decision.command)
        self._note(decision)
        return decision

    def stop(self) -> Decision | None:
        """One hold: the robot's safe stop (``send_hold``)."""
        return self.send_hold("stopped")

    def disconnect(self) -> None:
        """Close the subscriptions."""
        for s in self._subs:
            s.close()
        self._subs = []

    def joint_states_received(self) -> int:
        """Valid joint states received so far (a sequence number for lockstep loops)."""
        return self.received["joint_states"]

    def wait_joint_state(self, after: int, timeout_s: float) -> bool:
        """Block until more than ``after`` joint states were received; False on timeout."""
        with self._joints_seen:
            return self._joints_seen.wait_for(lambda: self.received["joint_states"] > after, timeout=timeout_s)

    # -- hooks ---------------------------------------------------------------------------------------
    def _joints_arrived(self) -> None:
        """Called after each valid joint state (the policy node infers and commands here when reactive)."""

    def _drop_queued(self) -> None:
        """Forget commands queued for later (an e-stop, its reset)."""

    # -- subscriptions ------------------------------------------------------------------------------
    def _reject(self, kind: str, err: Exception) -> None:
        self.rejected[kind] += 1
        self._log(logging.WARNING, kind, "rejected %s message: %s", kind, err)

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

    def _stamp_time(self, header: Any) -> float:
        """The node-clock time an input counts from: arrival, or its header stamp with ``stale_by: header``
        (a stamp further than ``stale_ms`` in the future raises MessageError)."""
        now = self.clock()
        if self.robot.stale_by != "header":
            return now
        age = time.time() - m.stamp_seconds(header)
        if age * 1000.0 < -self.robot.safety.stale_ms:
            raise m.MessageError(f"header stamp {-age:.3f} s in the future (clocks not synced? use stale_by: arrival)")
        return now - max(0.0, age)

    def _on_image(self, i: int, raw: bytes, _t: float) -> None:
        cam = self.robot.cameras[i]
        self._record(cam.topic, raw)
        try:
            msg = m.deserialize(raw, "sensor_msgs/msg/Image")
            rgb = m.image_to_rgb(msg, (cam.height, cam.width))
            t = self._stamp_time(msg.header)
        except m.MessageError as err:
            return self._reject("image", err)
        with self._lock:
            self._images[i] = (rgb, t)
            self._obs_seq += 1
            self.received[f"camera{i}"] += 1
        self._obs_event.set()

    def _on_joints(self, raw: bytes, _t: float) -> None:
        self._record(self.robot.joint_states_topic, raw)
        try:
            msg = m.deserialize(raw, "sensor_msgs/msg/JointState")
            q, qd = m.joints_in_order(msg, list(self.robot.joint_names))
            t = self._stamp_time(msg.header)
        except m.MessageError as err:
            return self._reject("joint_states", err)
        with self._lock:
            self._joints = (q, qd if qd is not None else np.zeros_like(q), t)
            self._obs_seq += 1
            self.received["joint_states"] += 1
        self._obs_event.set()
        with self._joints_seen:
            self._joints_seen.notify_all()
        self._joints_arrived()

    def _on_state(self, raw: bytes, _t: float) -> None:
        self._record(self.robot.state_topic, raw)
        try:
            x = m.state_vector(m.deserialize(raw, "std_msgs/msg/Float64MultiArray"), self.state_dim)
        except m.MessageError as err:
            return self._reject("state", err)
        with self._lock:
            self._state = (x, self.clock())
            self.received["state"] += 1
        self._obs_event.set()

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
            self._drop_queued()

    def reset_estop(self) -> tuple[bool, str]:
        """Release the latched e-stop if every input is fresh (the reset service's handler)."""
        got = self.observation()
        fresh = got is not None and got[1] * 1000.0 <= self.robot.safety.stale_ms
        self._drop_queued()
        return self.safety.reset_estop(fresh)

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

    def wait_ready(self, timeout_s: float, poll_s: float = 0.05, cancel: threading.Event | None = None) -> None:
        """Block until every required input has delivered a valid message; before any command is sent.

        Raises a one-line ConfigError for a topic type mismatch (as soon as discovery shows it) or,
        after ``timeout_s``, naming each input that never arrived (a missing camera, no joint states).
        Returns early, without raising, once ``cancel`` is set."""
        deadline = time.monotonic() + timeout_s
        while cancel is None or not cancel.is_set():
            self.check_types()
            if self.observation() is not None:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(poll_s)
        else:
            return
        with self._lock:
            have = {self.robot.joint_states_topic: self._joints is not None, self.robot.state_topic: self._state is not None}
            have.update({cam.topic: img is not None for cam, img in zip(self.robot.cameras, self._images)})
        missing = []
        for topic, typ, required in self._inputs():
            if required and not have.get(topic, False):
                pubs = self.transport.endpoint_types(topic, "publisher")
                missing.append(f"{topic} ({typ}; {'publishers seen but no valid message' if pubs else 'no publisher'})")
        rejected = f"; rejected so far: {dict(self.rejected)}" if self.rejected else ""
        check = getattr(self.transport, "interop_problem", None)
        hint = (check() if callable(check) else None) or "check the drivers or the robot config's topics"
        within = f"within {timeout_s:g} s" if timeout_s > 0 else "yet"
        raise ConfigError(f"robot '{self.robot.name}': nothing valid {within} on {', '.join(missing)}"
                          f"{rejected}; {hint}")

    # -- observation ----------------------------------------------------------------------------------
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

    # -- commands -------------------------------------------------------------------------------------
    def _target(self, action: np.ndarray | None, q: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """(joint target, the reference position) for one action under the robot's action mode."""
        if self.robot.action_mode == "ee_twist":
            # velocity commands: the reference for the change limit is the last twist sent (zero at start)
            return (np.zeros(6) if action is None else action), np.zeros(6)
        if self.robot.action_mode == "passthrough":
            # raw controller actions (e.g. joint deltas): no memory between steps, a hold is the zero action
            self.safety.last = None
            zero = np.zeros_like(q)
            return (zero if action is None else action), zero
        if action is None:
            return (self.safety.last if self.safety.last is not None else q), q
        if self.robot.action_mode == "delta_joint":
            return q + action, q
        return action, q

    def _note(self, decision: Decision) -> None:
        if self.recorder is not None and (decision.held or decision.interventions):
            self._recorder_call(self.recorder.intervention, decision.held, decision.interventions, time.time_ns())

    def send_hold(self, reason: str) -> Decision | None:
        """Publish one hold (counted under ``reason``); None if even that failed (logged)."""
        try:
            # (with hold_zero the hold is the zero command whatever is measured)
            measured = self._joints[0] if self._joints is not None else np.zeros(self.robot.command_dim)
            decision = self.safety.hold(measured, [reason])
            self._publish(decision.command)
            self._note(decision)
            return decision
        except Exception as err:
            self._log(logging.ERROR, "hold_failed", "could not send the hold: %s: %s", type(err).__name__, err)
            return None

    def _publish(self, command: np.ndarray) -> None:
        """Publish a (J,) command, or (T, J) points as one trajectory (``control_rate_hz`` apart)."""
        now = time.time()
        if self.robot.command_type == "std_msgs/msg/Float64MultiArray":
            msg = m.float64_array(command)
        elif self.robot.action_mode == "ee_twist":
            msg = m.twist_stamped(command[:3], command[3:], now, self.robot.twist_frame)
        else:
            msg = m.joint_trajectory(list(self.robot.joint_names), np.atleast_2d(command),
                                     1.0 / self.robot.control_rate_hz, now)
        cdr = m.serialize(msg, self.robot.command_type)
        self._pub.publish(cdr)
        self._record(self.robot.command_topic, cdr)
        self.sent += 1

    def flush(self, timeout_s: float = 0.2) -> bool:
        """Wait until the robot acknowledged the commands sent (the final hold before an exit)."""
        try:
            return bool(self._pub.flush(timeout_s))
        except Exception as err:
            self._log(logging.ERROR, "flush", "could not confirm the last command: %s: %s", type(err).__name__, err)
            return False

    def diagnostics(self) -> dict[str, Any]:
        """Counters, input ages (ms) and loop timing, as published on ``/diagnostics``."""
        now = self.clock()
        with self._lock:
            ages = {"age_ms/joint_states": self._joints[2] if self._joints else None,
                    "age_ms/state": self._state[1] if self._state and self.robot.state_source == "topic" else None}
            ages.update({f"age_ms/{cam.topic}": img[1] if img else None
                         for cam, img in zip(self.robot.cameras, self._images)})
        out: dict[str, Any] = {k: ("never" if t is None else 1000.0 * (now - t)) for k, t in ages.items()
                               if t is not None or k != "age_ms/state"}
        out.update({"estop_latched": self.safety.estopped, "commands_sent": self.sent, "missed_ticks": self.missed_ticks})
        out.update({f"safety/{k}": v for k, v in sorted(self.safety.counts.items())})
        out.update({f"rejected/{k}": v for k, v in sorted(self.rejected.items())})
        out.update({f"loop/{k}": v for k, v in self.timing.summary().items()})
        return out
