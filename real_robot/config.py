"""Robot configs (``configs/robots/*.yaml``): topics, message types, rates and safety limits."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from real_robot.safety import SafetyConfig
from robo_rl.errors import ConfigError

TWIST = "geometry_msgs/msg/TwistStamped"
COMMAND_TYPES = ("std_msgs/msg/Float64MultiArray", "trajectory_msgs/msg/JointTrajectory", TWIST)


@dataclass(frozen=True)
class CameraConfig:
    """One camera stream."""

    topic: str = "/camera/color/image_raw"
    """sensor_msgs/Image topic."""
    height: int = 224
    """Expected image height (pixels); other sizes are rejected."""
    width: int = 224
    """Expected image width (pixels)."""


@dataclass(frozen=True)
class RobotConfig:
    """Everything the policy node needs to know about one robot."""

    name: str
    """Robot name (for logs and recordings)."""
    joint_names: tuple[str, ...]
    """Joints in the order the policy's state and actions use."""
    safety: SafetyConfig
    """Limits applied to every command."""
    transport: Literal["auto", "rclpy", "cyclonedds", "inprocess"] = "auto"
    """Middleware: rclpy with ROS 2 installed, else pure-pip cyclonedds."""
    joint_states_topic: str = "/joint_states"
    """sensor_msgs/JointState topic."""
    cameras: tuple[CameraConfig, ...] = field(default_factory=lambda: (CameraConfig(),))
    """Camera streams, in the order of the policy's rgb views (may be empty for state-only policies)."""
    instruction_topic: str = "/task_instruction"
    """std_msgs/String topic with the language instruction."""
    estop_topic: str = "/estop"
    """std_msgs/Bool topic; True latches the emergency stop."""
    command_topic: str = "/forward_position_controller/commands"
    """Where joint commands go."""
    command_type: str = "std_msgs/msg/Float64MultiArray"
    """Float64MultiArray (ros2_control forward command controller), JointTrajectory, or TwistStamped
    (an end-effector velocity controller, e.g. MoveIt Servo; needs action_mode ee_twist)."""
    action_mode: Literal["absolute_joint", "delta_joint", "passthrough", "ee_twist"] = "absolute_joint"
    """How a policy action maps to the command: a joint target as is, a delta added to the measured
    position, the raw action in the controller's own units (the safety limits are then in those
    units; for a simulated robot running the policy's training controller), or an end-effector twist
    (vx, vy, vz in m/s, wx, wy, wz in rad/s; the safety limits then bound these 6 values, max_velocity
    bounds their change per second, and a hold is the zero twist)."""
    twist_frame: str = "base_link"
    """frame_id of TwistStamped commands."""
    control_rate_hz: float = 30.0
    """Command rate (Hz)."""
    default_instruction: str = "complete the task"
    """Instruction until one arrives on the instruction topic."""
    state_source: Literal["joints", "topic"] = "joints"
    """Policy state: joint positions + velocities, or a vector from ``state_topic`` (e.g. a state
    estimator, or the simulated robot's full task state)."""
    state_topic: str = "/robo_rl/state"
    """std_msgs/Float64MultiArray topic used when ``state_source`` is topic."""
    stale_by: Literal["arrival", "header"] = "arrival"
    """Age of an input for the stale watchdog: time since it arrived, or (``header``, when the robot's
    clock is synced with this machine's) time since its header stamp; stamped messages from further than
    ``safety.stale_ms`` in the future are then rejected."""
    diagnostics_period_s: float = 1.0
    """Period of the diagnostic_msgs/DiagnosticArray on ``/diagnostics`` (seconds)."""
    startup_timeout_s: float = 10.0
    """``robo-rl deploy`` waits this long for every input (joints, cameras, state) to deliver a valid
    message before it starts commanding; then fails naming what is missing."""
    urdf: str | None = None
    """URDF of the arm (a local path); with ``ee_link``, the forward kinematics that enforces the safety
    workspace box (``safety.workspace_low/high``) on joint targets."""
    ee_link: str | None = None
    """URDF link whose origin must stay inside the workspace box (e.g. ``panda_hand_tcp``)."""

    @property
    def command_dim(self) -> int:
        """Length of one command: 6 for a twist, else one per joint."""
        return 6 if self.action_mode == "ee_twist" else len(self.joint_names)

    def __post_init__(self) -> None:
        if self.command_type not in COMMAND_TYPES:
            raise ConfigError(f"robot config 'command_type' = {self.command_type!r}; allowed: {', '.join(COMMAND_TYPES)}")
        if (self.command_type == TWIST) != (self.action_mode == "ee_twist"):
            raise ConfigError(f"robot config: command_type {self.command_type} with action_mode {self.action_mode!r}; "
                              f"TwistStamped commands go with action_mode ee_twist and only with it")
        if self.action_mode == "ee_twist":
            if len(self.safety.position_lower) != 6:
                raise ConfigError(f"robot config with action_mode ee_twist needs 6 safety limits (vx, vy, vz, wx, wy, wz), "
                                  f"got {len(self.safety.position_lower)}")
        elif len(self.safety.position_lower) != len(self.joint_names):
            raise ConfigError(f"robot config has {len(self.joint_names)} joint_names but safety limits for "
                              f"{len(self.safety.position_lower)} joints")
        for key in ("control_rate_hz", "startup_timeout_s", "diagnostics_period_s"):
            v = getattr(self, key)
            if not math.isfinite(v) or v <= 0:
                raise ConfigError(f"robot config '{key}' = {v!r}; it must be a finite number > 0")
        for cam in self.cameras:
            if cam.height <= 0 or cam.width <= 0:
                raise ConfigError(f"robot config camera {cam.topic}: height and width must be > 0 pixels")
        if len({(c.height, c.width) for c in self.cameras}) > 1:
            raise ConfigError("robot config cameras: every camera needs the same height and width (the policy's rgb "
                              "is (V, H, W, 3)); got " + ", ".join(f"{c.topic} {c.height}x{c.width}" for c in self.cameras))
        if self.safety.control_rate_hz != self.control_rate_hz:
            raise ConfigError(f"robot config control_rate_hz is {self.control_rate_hz:g} but safety.control_rate_hz is "
                              f"{self.safety.control_rate_hz:g}; the per-step limits are max_velocity / "
                              f"safety.control_rate_hz, so set both to the rate commands are sent at")
        box = (self.safety.workspace_low, self.safety.workspace_high)
        if (box[0] is None) != (box[1] is None):
            raise ConfigError("robot config safety: set both workspace_low and workspace_high, or neither")
        if box[0] is not None:
            if self.action_mode not in ("absolute_joint", "delta_joint"):
                raise ConfigError(f"robot config safety workspace box needs joint targets (action_mode absolute_joint "
                                  f"or delta_joint), not action_mode {self.action_mode!r}")
            if not (self.urdf and self.ee_link):
                raise ConfigError("robot config safety workspace box needs 'urdf' and 'ee_link' (the forward "
                                  "kinematics that checks it); without them it could not be enforced")
        elif bool(self.urdf) != bool(self.ee_link):
            raise ConfigError("robot config: 'urdf' and 'ee_link' go together (with a safety workspace box)")

    def forward_kinematics(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """The end-effector position function for the safety workspace box, or None without a box."""
        if self.safety.workspace_low is None or not self.urdf or not self.ee_link:
            return None
        from real_robot.kinematics import ChainFK

        return ChainFK(self.urdf, self.ee_link, self.joint_names)


def load_robot(path: str) -> RobotConfig:
    """Strictly parse a robot YAML (unknown keys are one-line errors naming them)."""
    from robo_rl.config import load

    return load(RobotConfig, path, [], example="configs/robots/panda_sim.yaml")
