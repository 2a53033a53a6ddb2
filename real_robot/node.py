"""The policy node: a ``RosBridge`` with the sim-trained ``Policy`` in the middle.

Inference runs in its own thread on the newest complete observation: a single action replaces whatever
was queued (the freshest decision wins), an action chunk (H, A) is queued as H steps, or, with
JointTrajectory commands, sent as one trajectory. The control loop ticks at ``control_rate_hz``, maps the
next action to a joint target, runs the safety filter and publishes, so the command stream never waits
for the model. ``/diagnostics`` carries the safety counters, input ages and loop timing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from real_robot import messages as m
from real_robot.bridge import RosBridge
from real_robot.config import RobotConfig
from real_robot.diagnostics import diagnostic_array, status_level
from real_robot.safety import Decision
from real_robot.transport.base import Transport
from robo_rl.boundary import obs_to_torch
from robo_rl.contracts import Policy

log = logging.getLogger(__name__)


class PolicyNode(RosBridge):
    def __init__(self, robot: RobotConfig, policy: Policy, transport: Transport,
                 clock: Callable[[], float] = time.monotonic, reactive: bool = False,
                 recorder: Any = None, state_dim: int | None = None, node_name: str = "robo_rl_policy") -> None:
        """``reactive``: send a command as soon as a joint state arrives, inferring when the queue is
        empty (an action chunk then runs open-loop, as in the simulator; the latency benchmark); a
        deployment uses ``start()``'s fixed-rate control loop. Other arguments: ``RosBridge``."""
        self.reactive = reactive
        self.policy = policy
        self.trajectory = robot.command_type == "trajectory_msgs/msg/JointTrajectory" and not reactive
        self._queue: deque[np.ndarray] = deque()  # steps; with trajectories, whole chunks (H, J)
        self._traj_until = 0.0  # clock time the last trajectory sent ends
        self._inferred_seq = -1  # the _obs_seq the last inference started from
        self._inferred = threading.Condition()  # notified after each inference
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._diag_seen: tuple[int, int] = (0, 0)
        super().__init__(robot, transport, clock, recorder, state_dim, node_name)

    def _joints_arrived(self) -> None:
        if self.reactive:
            if not self._queue:
                self.infer_once()
            self.control_tick()

    def _drop_queued(self) -> None:
        with self._lock:
            self._queue.clear()

    # -- inference ------------------------------------------------------------------------------------
    def infer_once(self) -> bool:
        """Run the policy on the newest observation and queue its action(s). False if no data or it failed."""
        got = self.observation()
        if got is None:
            return False
        obs, _ = got
        try:
            with torch.no_grad():
                out = self.policy.act(obs_to_torch(obs), deterministic=True)
            actions = np.asarray(torch.as_tensor(out.actions).detach().cpu(), dtype=np.float64)[0]
            if actions.ndim not in (1, 2) or actions.shape[-1] != self.robot.command_dim or not len(actions):
                raise ValueError(f"policy action of shape {actions.shape}; robot '{self.robot.name}' takes "
                                 f"({self.robot.command_dim},) or a chunk (T, {self.robot.command_dim})")
        except Exception as err:  # the robot must get a safe stop, whatever the model does
            self.rejected["policy_error"] += 1
            self._log(logging.ERROR, "policy_error", "policy raised %s: %s", type(err).__name__, err)
            with self._lock:
                self._queue.clear()
                self._queue.append(np.full(self.robot.command_dim, np.nan))
            return False
        chunk = np.atleast_2d(actions)
        with self._lock:
            if self.trajectory:
                self._queue.clear()
                self._queue.append(chunk)
            elif len(chunk) == 1 and not self.reactive:
                self._queue.clear()  # a single action: the freshest decision replaces an unsent one
                self._queue.append(chunk[0])
            else:
                self._queue.extend(chunk)
        return True

    def _wants_inference(self) -> bool:
        """Queue nearly empty (steps), or the running trajectory ends within two control periods."""
        if self.trajectory:
            return not self._queue and self.clock() >= self._traj_until - 2.0 / self.robot.control_rate_hz
        return len(self._queue) < 2

    # -- control ------------------------------------------------------------------------------------
    def control_tick(self) -> Decision | None:
        """One control period: next queued action -> joint target -> safety -> publish. With trajectory
        commands a new chunk goes out as one trajectory when the previous one is about to end; between
        chunks nothing is sent unless the safety filter holds."""
        got = self.observation()
        if got is None or self._joints is None:
            return None
        _, age = got
        q = self._joints[0]
        if self.trajectory:
            return self._trajectory_tick(q, age)
        self._await_inference()
        with self._lock:
            action = self._queue.popleft() if self._queue else None
        return self.send_action(action)

    def _await_inference(self) -> None:
        """With the inference thread running and nothing queued, wait up to 30% of a control period for an
        inference on an observation that arrived since the last one, so a fresh action is not replaced by
        a hold for want of a few milliseconds (a chunk in the queue or a model slower than that: no wait)."""
        if self.reactive or not self._threads or self._queue or self._obs_seq == self._inferred_seq:
            return
        with self._inferred:
            self._inferred.wait_for(lambda: bool(self._queue) or self._obs_seq == self._inferred_seq,
                                    timeout=0.3 / self.robot.control_rate_hz)

    def _trajectory_tick(self, q: np.ndarray, age: float) -> Decision | None:
        now = self.clock()
        with self._lock:
            ready = bool(self._queue) and now >= self._traj_until - 1.0 / self.robot.control_rate_hz
            chunk = self._queue.popleft() if ready else None
        if chunk is None:
            # no new chunk due: check the watchdog / e-stop with the current target; send only a hold
            probe = self.safety.last if self.safety.last is not None else q
            if self.safety.estopped or not (age * 1000.0 <= self.robot.safety.stale_ms):
                decision = self.safety(probe, q, age)
                self._publish(decision.command)
                self._traj_until = now
                self._note(decision)
                return decision
            return None
        targets = q + chunk if self.robot.action_mode == "delta_joint" else chunk
        decisions = self.safety.sequence(targets, q, age)
        points = np.stack([d.command for d in decisions])
        if decisions[-1].held:
            points = points[-1:]
        self._publish(points)
        self._traj_until = now + len(points) / self.robot.control_rate_hz
        for d in decisions:
            self._note(d)
        return decisions[-1]

    def safe_tick(self) -> Decision | None:
        """``control_tick`` that never raises: on any error (a recorder's disk, a transport hiccup) it
        counts ``control_error`` and tries to send a hold, so the control thread keeps running."""
        try:
            return self.control_tick()
        except Exception as err:
            self.rejected["control_error"] += 1
            self._log(logging.ERROR, "control_error", "control tick raised %s: %s; holding", type(err).__name__, err)
            return self.send_hold("control_error")

    def publish_diagnostics(self) -> None:
        values = self.diagnostics()
        holds, rejects = sum(self.safety.counts.values()), sum(self.rejected.values())
        seen_h, seen_r = self._diag_seen
        self._diag_seen = (holds, rejects)
        got = self.observation()
        stale = got is None or not (got[1] * 1000.0 <= self.robot.safety.stale_ms)
        level, message = status_level(self.safety.estopped, stale, holds - seen_h, rejects - seen_r)
        msg = diagnostic_array(time.time(), self.node_name, self.robot.name, level, message, values)
        self._diag_pub.publish(m.serialize(msg, "diagnostic_msgs/msg/DiagnosticArray"))

    # -- loops ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Inference, control (at ``control_rate_hz``) and diagnostics threads."""
        self._stop.clear()

        def infer_loop() -> None:
            while not self._stop.is_set():
                self._obs_event.wait(0.005)
                self._obs_event.clear()
                seq = self._obs_seq
                if seq != self._inferred_seq and self._wants_inference():
                    self.infer_once()
                    with self._inferred:
                        self._inferred_seq = seq
                        self._inferred.notify_all()

        def control_loop() -> None:
            period = 1.0 / self.robot.control_rate_hz
            nxt = time.monotonic()
            while not self._stop.is_set():
                start = time.monotonic()
                self.safe_tick()
                self.timing.tick(start, time.monotonic())
                nxt += period
                late = time.monotonic() - nxt
                if late > 0:
                    # overran (GC pause, slow publish): drop the missed ticks instead of sending them
                    # back to back, which would move the arm max_delta per tick at many ticks per period
                    skipped = int(late // period) + 1
                    self.missed_ticks += skipped
                    nxt += skipped * period
                    self._log(logging.WARNING, "late", "control loop %.0f ms late: skipped %d tick(s)",
                              1000 * late, skipped)
                self._stop.wait(max(0.0, nxt - time.monotonic()))

        def diag_loop() -> None:
            while not self._stop.wait(self.robot.diagnostics_period_s):
                try:
                    self.publish_diagnostics()
                except Exception as err:
                    self._log(logging.ERROR, "diagnostics", "diagnostics failed: %s: %s", type(err).__name__, err)

        self._threads = [threading.Thread(target=infer_loop, daemon=True, name="infer"),
                         threading.Thread(target=control_loop, daemon=True, name="control"),
                         threading.Thread(target=diag_loop, daemon=True, name="diagnostics")]
        for t in self._threads:
            t.start()

    def pause(self, join_s: float = 1.0) -> Decision | None:
        """Stop the loops and send one hold (the last safe target moved to within one step of the measured
        position; the zero command for twist and passthrough control). Subscriptions stay."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=join_s)
        self._threads = []
        with self._lock:
            self._queue.clear()
        self._traj_until = 0.0
        if self._joints is None and self.safety.last is None and not self.safety.hold_zero:
            return None  # never commanded and nothing measured: nothing safe to send
        return self.send_hold("stopped")

    def stop(self, join_s: float = 1.0) -> Decision | None:
        """``pause`` and close the subscriptions: the final safe command of a shutdown."""
        decision = self.pause(join_s)
        self.disconnect()
        return decision
