"""A robot as a ``VecEnv`` with B = 1: the evaluation loop that runs simulators runs robots unchanged.

``RobotEnv`` steps lockstep over a ``RosBridge``: each action (or each step of a chunk) goes through the
bridge's safety filter, then the env waits for the step's outcome and the next joint state. Outcomes
(reward, episode end, success) come from an ``OutcomeSource``: the simulated robot publishes one per step
on ``STEP_TOPIC``; on hardware an operator or a success detector would publish the same message.
After an episode ends the robot side resets itself (the next observation starts the next episode).
"""

from __future__ import annotations

import json
import queue
import time
from typing import Any

import numpy as np

from real_robot import messages as m
from real_robot.bridge import RosBridge
from robo_rl.contracts import ArraySpec, Observation, StepResult
from robo_rl.errors import ConfigError, RoboRLError

STEP_TOPIC = "/robo_rl/sim/step"
"""std_msgs/String, one JSON object per executed command: ``reward`` (float), ``terminated``,
``truncated``, ``success`` (bool)."""


class OutcomeSource:
    """Step outcomes from ``STEP_TOPIC`` (std_msgs/String JSON), in arrival order."""

    def __init__(self, transport: Any, topic: str = STEP_TOPIC) -> None:
        self.topic = topic
        self._q: queue.Queue[dict[str, Any]] = queue.Queue()
        self.rejected = 0
        self._sub = transport.subscribe(topic, "std_msgs/msg/String", self._on_step)

    def _on_step(self, raw: bytes, _t: float) -> None:
        try:
            out = json.loads(m.deserialize(raw, "std_msgs/msg/String").data)
            self._q.put({"reward": float(out["reward"]), "terminated": bool(out["terminated"]),
                         "truncated": bool(out["truncated"]), "success": bool(out["success"])})
        except (m.MessageError, ValueError, KeyError, TypeError):
            self.rejected += 1

    def next(self, timeout_s: float) -> dict[str, Any] | None:
        """The next step's outcome, or None after ``timeout_s``."""
        try:
            return self._q.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._sub.close()


class RobotEnv:
    """``bridge`` as a VecEnv of one env. ``obs_spec``/``action_spec``: the spaces the policy was trained
    on (a checkpoint's); actions (1, A) or chunks (1, H, A) with A = the robot's command size."""

    num_envs = 1

    def __init__(self, bridge: RosBridge, outcomes: OutcomeSource, obs_spec: dict[str, ArraySpec],
                 action_spec: ArraySpec, step_timeout_s: float = 10.0, connect_timeout_s: float = 60.0) -> None:
        if int(action_spec.shape[-1]) != bridge.robot.command_dim:
            raise ConfigError(f"the policy's actions are {action_spec.shape[-1]}-D but robot '{bridge.robot.name}' "
                              f"takes {bridge.robot.command_dim} per command")
        self.bridge, self.outcomes = bridge, outcomes
        self.obs_spec, self.action_spec = obs_spec, action_spec
        self.step_timeout_s, self.connect_timeout_s = step_timeout_s, connect_timeout_s

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        """Wait for the robot's current observation and until both ends of the lockstep are matched (a
        command or an outcome sent before discovery would be lost); the robot side seeds its own episodes."""
        self.bridge.connect(self.connect_timeout_s)
        tr, robot = self.bridge.transport, self.bridge.robot
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            missing = [what for what, ok in (
                (f"a subscriber on {robot.command_topic}", tr.endpoint_types(robot.command_topic, "subscriber")),
                (f"a publisher on {self.outcomes.topic}", tr.endpoint_types(self.outcomes.topic, "publisher"))) if not ok]
            if not missing:
                return self.bridge.get_observation(), {}
            if time.monotonic() > deadline:
                raise ConfigError(f"robot '{robot.name}': no {' and no '.join(missing)} within "
                                  f"{self.connect_timeout_s:g} s; is the robot side running on this ROS domain?")
            time.sleep(0.05)

    def step(self, actions: np.ndarray) -> StepResult:
        """Execute the action, or a chunk's steps until the episode ends; reward summed over them."""
        a = np.asarray(actions, np.float64)
        if a.ndim not in (2, 3) or a.shape[0] != 1 or a.shape[-1] != self.bridge.robot.command_dim:
            raise ConfigError(f"RobotEnv.step takes (1, {self.bridge.robot.command_dim}) actions or (1, H, "
                              f"{self.bridge.robot.command_dim}) chunks; got shape {a.shape}")
        steps = a[0] if a.ndim == 3 else a
        reward, done, n = 0.0, {"terminated": False, "truncated": False, "success": False}, 0
        for action in steps:
            seen = self.bridge.joint_states_received()
            if self.bridge.send_action(action) is None:
                raise RoboRLError(f"robot '{self.bridge.robot.name}': no observation to command from")
            out = self.outcomes.next(self.step_timeout_s)
            if out is None:
                raise RoboRLError(f"robot '{self.bridge.robot.name}': no step outcome on {STEP_TOPIC} within "
                                  f"{self.step_timeout_s:g} s of a command ({self.bridge.sent} sent)")
            if not self.bridge.wait_joint_state(seen, self.step_timeout_s):
                raise RoboRLError(f"robot '{self.bridge.robot.name}': no joint state within "
                                  f"{self.step_timeout_s:g} s of a command")
            reward, n = reward + out["reward"], n + 1
            done = out
            if out["terminated"] or out["truncated"]:
                break
        info = {"success": np.array([done["success"]]), "chunk_steps": np.array([n])}
        return StepResult(self.bridge.get_observation(), np.array([reward], np.float32),
                          np.array([done["terminated"]]), np.array([done["truncated"]]), info)

    def render(self) -> np.ndarray | None:
        """The first camera's newest image (1, height, width, 3), or None without cameras."""
        obs = self.bridge.get_observation()
        return obs["rgb"][:, 0] if "rgb" in obs else None

    def close(self) -> None:
        self.outcomes.close()
        self.bridge.stop()
        self.bridge.disconnect()
