"""`robo-rl deploy CHECKPOINT --robot configs/robots/<name>.yaml`: serve a trained policy on a robot.

Everything is checked before the first command is sent: the robot config (strict), the checkpoint,
and that the policy's observation and action spaces fit the robot (action dim = joints, state dim =
2 x joints, one rgb view per camera at the configured size)."""

from __future__ import annotations

import logging
import time
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


def build(checkpoint: str, robot_path: str, transport: str | None = None) -> tuple[Any, RobotConfig]:
    """(policy, robot config) ready for a ``PolicyNode``; ``transport`` overrides the config's."""
    import dataclasses

    from robo_rl import checkpoint as ckpt_io
    from robo_rl.runners.build import policy_from_checkpoint

    robot = load_robot(robot_path)
    if transport:
        robot = dataclasses.replace(robot, transport=transport)
    meta = ckpt_io.read_meta(ckpt_io.resolve(checkpoint))
    check_fit(robot, meta.get("obs_spec", {}), meta.get("action_spec", {}).get("shape", [0]))
    policy, _, _ = policy_from_checkpoint(checkpoint)
    return policy, robot


def run(checkpoint: str, robot_path: str, transport: str | None = None, seconds: float | None = None) -> dict[str, Any]:
    """Serve until Ctrl-C (or ``seconds``); returns the intervention and rejection counts."""
    from real_robot.node import PolicyNode
    from real_robot.transport import make_transport

    policy, robot = build(checkpoint, robot_path, transport)
    tr = make_transport(robot.transport)
    node = PolicyNode(robot, policy, tr)
    try:
        node.wait_ready(robot.startup_timeout_s)  # type mismatches and missing inputs fail here, before any command
    except Exception:
        tr.close()
        raise
    node.start()
    log.info("serving %s on %s via %s at %.0f Hz", checkpoint, robot.name, tr.name, robot.control_rate_hz)
    t0 = time.monotonic()
    try:
        while seconds is None or time.monotonic() - t0 < seconds:
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        node.stop()
        tr.close()
    return {"commands_sent": node.sent, "interventions": dict(node.safety.counts), "rejected": dict(node.rejected),
            "missed_ticks": node.missed_ticks}
