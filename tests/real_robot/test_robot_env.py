"""``RobotEnv``: a ``RosBridge`` as a VecEnv of one env, stepped lockstep against a scripted robot on the
in-process transport (CDR bytes both ways); the evaluation loop of the simulators runs on it unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from real_robot import messages as m
from real_robot.bridge import RosBridge
from real_robot.config import load_robot
from real_robot.robot_env import STEP_TOPIC, OutcomeSource, RobotEnv
from real_robot.transport import make_transport
from robo_rl.contracts import ArraySpec, PolicyOutput, RobotBridge, VecEnv
from robo_rl.errors import ConfigError, RoboRLError
from robo_rl.runners.evaluate import evaluate_policy

ROBOT = load_robot("configs/robots/panda_sim_state.yaml")
J = len(ROBOT.joint_names)


class ScriptedRobot:
    """Answers each command with a step outcome and the next joint state; an episode lasts ``length``
    commands and succeeds on odd episodes."""

    def __init__(self, tr, length: int = 3, answer: bool = True):
        self.length, self.answer = length, answer
        self.commands: list[np.ndarray] = []
        self.t = 0
        self.episode = 0
        self.js = tr.publisher(ROBOT.joint_states_topic, "sensor_msgs/msg/JointState")
        self.state = tr.publisher(ROBOT.state_topic, "std_msgs/msg/Float64MultiArray")
        self.out = tr.publisher(STEP_TOPIC, "std_msgs/msg/String")
        tr.subscribe(ROBOT.command_topic, ROBOT.command_type, self._on_command)
        self.q = (np.array(ROBOT.safety.position_lower) + np.array(ROBOT.safety.position_upper)) / 2

    def observe(self):
        self.state.publish(m.serialize(m.float64_array(np.full(5, float(self.t))), "std_msgs/msg/Float64MultiArray"))
        self.js.publish(m.serialize(m.joint_state(list(ROBOT.joint_names), self.q, np.zeros(J), 0.0),
                                    "sensor_msgs/msg/JointState"))

    def _on_command(self, raw, _t):
        self.commands.append(np.asarray(m.deserialize(raw, ROBOT.command_type).data))
        if not self.answer:
            return
        self.t += 1
        done = self.t == self.length
        outcome = {"reward": 0.5, "terminated": done, "truncated": False, "success": done and self.episode % 2 == 1}
        self.out.publish(m.serialize(m.string(json.dumps(outcome)), "std_msgs/msg/String"))
        if done:
            self.t, self.episode = 0, self.episode + 1
        self.observe()


def _env(length=3, answer=True, timeout=5.0):
    tr = make_transport("inprocess")
    robot = ScriptedRobot(tr, length, answer)
    bridge = RosBridge(ROBOT, tr, state_dim=5)
    env = RobotEnv(bridge, OutcomeSource(tr), {"state": ArraySpec((5,), "float32")},
                   ArraySpec((J,), "float32", -10.0, 10.0), step_timeout_s=timeout, connect_timeout_s=timeout)
    robot.observe()
    return env, robot, bridge


def test_robot_env_is_a_vecenv_over_a_robot_bridge_and_steps_chunks_lockstep():
    env, robot, bridge = _env()
    assert isinstance(bridge, RobotBridge) and isinstance(env, VecEnv)
    obs, _ = env.reset(seed=0)
    assert obs["state"].shape == (1, 5) and obs["instruction"] == [ROBOT.default_instruction]
    chunk = np.broadcast_to(robot.q, (1, 4, J)).astype(np.float32)
    res = env.step(chunk)
    # the episode ends at the 3rd command: the chunk's 4th step is not sent
    assert len(robot.commands) == 3 and res.info["chunk_steps"].tolist() == [3]
    assert res.terminated.tolist() == [True] and res.info["success"].tolist() == [False]
    assert res.reward.tolist() == [pytest.approx(1.5)]
    assert res.obs["state"][0, 0] == 0.0  # the next episode's first observation
    far = np.full((1, J), 9.0, np.float32)  # beyond every joint limit: the safety filter clamps and rate-limits
    env.step(far)
    assert np.all(robot.commands[-1] <= np.array(ROBOT.safety.position_upper) + 1e-9)
    assert np.all(np.abs(robot.commands[-1] - robot.q) <= np.array(ROBOT.safety.max_delta) + 1e-9)
    assert bridge.safety.counts["position_limit"] >= 1
    env.close()


def test_the_simulators_evaluation_loop_runs_on_the_robot():
    class Hold:
        def act(self, obs, deterministic=False):
            return PolicyOutput(torch.as_tensor(robot.q[None], dtype=torch.float32))

        def reset(self, env_ids=None):
            pass

    env, robot, _ = _env(length=2)
    result = evaluate_policy(env, Hold(), episodes=4, seed=0)
    assert result.episode_success == [[False, True, False, True]] and len(robot.commands) == 8
    assert result.mean_return == pytest.approx(1.0)
    env.close()


def test_bad_actions_and_a_silent_robot_are_one_line_errors():
    with pytest.raises(ConfigError, match=rf"the policy's actions are 3-D but robot .* takes {J} per command"):
        RobotEnv(RosBridge(ROBOT, make_transport("inprocess")), OutcomeSource(make_transport("inprocess")),
                 {}, ArraySpec((3,), "float32"))
    env, robot, _ = _env()
    env.reset()
    with pytest.raises(ConfigError, match=rf"takes \(1, {J}\) actions or \(1, H, {J}\) chunks; got shape \(2, {J}\)"):
        env.step(np.zeros((2, J), np.float32))
    env, robot, _ = _env(answer=False, timeout=0.2)
    env.reset()
    with pytest.raises(RoboRLError, match=r"no step outcome on /robo_rl/sim/step within 0.2 s of a command \(1 sent\)"):
        env.step(np.zeros((1, J), np.float32))
