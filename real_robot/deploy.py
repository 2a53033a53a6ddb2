"""`robo-rl deploy CHECKPOINT --robot configs/robots/<name>.yaml`: serve a trained policy on a robot.

Everything is checked before the first command is sent: the robot config (strict), the checkpoint,
and that the policy's observation and action spaces fit the robot (action dim = joints, state dim =
2 x joints, one rgb view per camera at the configured size)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from real_robot.config import RobotConfig, load_robot
from robo_rl.errors import ConfigError

log = logging.getLogger(__name__)


def check_fit(robot: RobotConfig, obs_spec: dict[str, list[int]], action_shape: list[int]) -> None:
    """One-line ConfigError if the policy's spaces do not fit the robot."""
    j = len(robot.joint_names)
    if robot.action_mode == "ee_twist":
        if action_shape[-1] != 6:
            raise ConfigError(f"the policy outputs {action_shape[-1]}-D actions but robot '{robot.name}' takes 6-D "
                              "end-effector twists (action_mode ee_twist)")
    elif action_shape[-1] != j:
        raise ConfigError(f"the policy outputs {action_shape[-1]}-D actions but robot '{robot.name}' has {j} joints "
                          f"({', '.join(robot.joint_names)})")
    if "state" in obs_spec and robot.state_source == "joints" and obs_spec["state"][-1] != 2 * j:
        raise ConfigError(f"the policy was trained on a {obs_spec['state'][-1]}-D state, robot '{robot.name}' provides "
                          f"{2 * j} (positions and velocities of {j} joints)")
    if "rgb" in obs_spec:
        v, h, w = obs_spec["rgb"][0], obs_spec["rgb"][1], obs_spec["rgb"][2]
        if v != len(robot.cameras):
            raise ConfigError(f"the policy sees {v} camera(s), robot '{robot.name}' configures {len(robot.cameras)}")
        for cam in robot.cameras:
            if (cam.height, cam.width) != (h, w):
                raise ConfigError(f"camera {cam.topic} is {cam.height}x{cam.width}, the policy was trained on {h}x{w}")


def load_for_robot(checkpoint: str, robot: RobotConfig) -> tuple[Any, int | None]:
    """(policy in eval mode, the state length it takes or None) after checking it fits ``robot``."""
    from robo_rl.build import load_run, policy_from_checkpoint

    run = load_run(checkpoint)
    obs_spec = run.meta.get("obs_spec", {})
    check_fit(robot, obs_spec, run.meta.get("action_spec", {}).get("shape", [0]))
    policy, _, _ = policy_from_checkpoint(run)
    state = obs_spec.get("state")
    return policy, (int(state[-1]) if state else None)


def build(checkpoint: str, robot_path: str, transport: str | None = None) -> tuple[Any, RobotConfig]:
    """(policy, robot config) ready for a ``PolicyNode``; ``transport`` overrides the config's."""
    import dataclasses

    robot = load_robot(robot_path)
    if transport:
        robot = dataclasses.replace(robot, transport=transport)
    policy, _ = load_for_robot(checkpoint, robot)
    return policy, robot


class StopSignals:
    """SIGINT/SIGTERM set ``event`` (the node then sends its final safe command and the process exits 0);
    a second signal exits at once with 128 + signal number. Restores the previous handlers on exit."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.event.is_set():
            os._exit(128 + signum)
        self.signal = signum
        self.event.set()

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def run(checkpoint: str, robot_path: str, transport: str | None = None, seconds: float | None = None,
        record: str | None = None, managed: bool = False, ros_args: list[str] | None = None) -> dict[str, Any]:
    """Serve until SIGINT/SIGTERM (or ``seconds``); returns the command, intervention and rejection counts.

    ``record``: a new rosbag2 directory (mcap) receiving the inputs, commands and interventions.
    ``managed`` (rclpy): wait for a lifecycle manager's configure/activate instead of doing both here.
    ``ros_args``: rclpy arguments, e.g. ``["--ros-args", "-p", "control_rate_hz:=20.0"]``."""
    import dataclasses
    import math

    from real_robot.transport.base import resolve_kind

    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"--seconds {seconds!r}: give a finite number of seconds > 0, or leave it out to serve "
                          "until Ctrl-C")
    robot = load_robot(robot_path)
    robot = dataclasses.replace(robot, transport=resolve_kind(transport or robot.transport))
    if record:
        from real_robot.recorder import check_new_recording

        check_new_recording(record)
    if (managed or ros_args) and robot.transport != "rclpy":
        raise ConfigError(f"--managed and ROS arguments need transport rclpy, not {robot.transport}")
    with StopSignals() as stop:
        if robot.transport == "rclpy":
            summary = _run_lifecycle(checkpoint, robot, stop, seconds, record, managed, ros_args)
        else:
            summary = _run_plain(checkpoint, robot, stop, seconds, record)
    if stop.signal is not None:
        summary["stopped_by"] = signal.Signals(stop.signal).name
    return summary


def _recorder(record: str | None) -> Any:
    if not record:
        return None
    from real_robot.recorder import BagRecorder

    return lambda robot: BagRecorder(record, robot)


def _run_plain(checkpoint: str, robot: RobotConfig, stop: StopSignals, seconds: float | None,
               record: str | None) -> dict[str, Any]:
    """A non-ROS middleware (cyclonedds): the same states driven here, no lifecycle services."""
    from real_robot.node import PolicyNode
    from real_robot.transport import make_transport

    policy, state_dim = load_for_robot(checkpoint, robot)
    tr = make_transport(robot.transport)
    rec = _recorder(record)
    recorder = rec(robot) if rec else None
    node = PolicyNode(robot, policy, tr, recorder=recorder, state_dim=state_dim)
    try:
        node.wait_ready(robot.startup_timeout_s, cancel=stop.event)  # mismatches and missing inputs fail here
        if not stop.event.is_set():
            node.start()
            log.info("serving %s on %s via %s at %.0f Hz (e-stop reset: restart, or use transport rclpy for the "
                     "reset service)", checkpoint, robot.name, tr.name, robot.control_rate_hz)
            stop.event.wait(seconds)
    finally:
        node.stop()
        node.flush()
        tr.close()  # no input callback can reach the recorder after this
        if recorder is not None:
            recorder.close()
    return {"commands_sent": node.sent, "interventions": dict(node.safety.counts), "rejected": dict(node.rejected),
            "missed_ticks": node.missed_ticks, "transport": tr.name}


def _run_lifecycle(checkpoint: str, robot: RobotConfig, stop: StopSignals, seconds: float | None,
                   record: str | None, managed: bool, ros_args: list[str] | None) -> dict[str, Any]:
    """rclpy: the lifecycle node, configured and activated here unless ``managed``."""
    import rclpy
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
    from rclpy.lifecycle import TransitionCallbackReturn

    from real_robot.ros_node import LifecyclePolicyNode
    from real_robot.transport.ros import init_rclpy

    init_rclpy(args=["robo-rl-deploy", *(ros_args or [])])
    node = LifecyclePolicyNode(robot, lambda r: load_for_robot(checkpoint, r), recorder_factory=_recorder(record),
                               on_shutdown=stop.event.set)
    # one thread delivers inputs and serves transitions; rclpy 9's MultiThreadedExecutor re-submits a
    # callback its pool has not started yet on every pass without waiting, a busy loop holding the GIL
    # (control-loop stalls of 0.1-1 s measured under load)
    executor = SingleThreadedExecutor()
    executor.add_node(node)

    def spin() -> None:
        try:
            executor.spin()
        except ExternalShutdownException:
            pass

    spinner = threading.Thread(target=spin, daemon=True, name="rclpy-spin")
    spinner.start()
    try:
        if not managed:
            if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                raise ConfigError(_last_error(node, "configure"))
            node.wait_inputs(robot.startup_timeout_s, cancel=stop.event)
            if stop.event.is_set():
                return node.summary() | {"transport": "rclpy"}
            if node.trigger_activate() != TransitionCallbackReturn.SUCCESS and not stop.event.is_set():
                raise ConfigError(_last_error(node, "activate"))
        log.info("serving %s on %s via rclpy (%s)", checkpoint, robot.name,
                 "lifecycle transitions from a manager" if managed else "configured and active")
        stop.event.wait(seconds)
    finally:
        node._cancel.set()
        if node._state_machine.current_state[1] != "finalized":
            node.trigger_shutdown()
        summary = node.summary() | {"transport": "rclpy"}
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown()
    return summary


def _last_error(node: Any, transition: str) -> str:
    err = getattr(node, "last_error", None)
    return err or f"the policy node failed to {transition}; see the log above"
