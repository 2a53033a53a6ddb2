"""The safety workspace box: URDF forward kinematics against ManiSkill's Panda (a real simulator), and
the node holding a joint target whose end effector would leave the box."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from real_robot.config import load_robot
from real_robot.kinematics import ChainFK
from robo_rl.errors import ConfigError

URDF = "package://mani_skill/assets/robots/panda/panda_v2.urdf"
ROBOT = load_robot("configs/robots/panda_sim.yaml")


def test_urdf_forward_kinematics_matches_maniskill_panda_tcp(need_maniskill):
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401
    import torch

    fk = ChainFK(URDF, "panda_hand_tcp", ROBOT.joint_names)
    assert fk.base_link == "panda_link0" and sum(j.index >= 0 for j in fk.joints) == 7  # the finger is off-chain
    env = gym.make("PickCube-v1", obs_mode="state", num_envs=1)
    try:
        env.reset(seed=0)
        agent = env.unwrapped.agent
        rng = np.random.default_rng(0)
        for _ in range(5):
            q = agent.robot.get_qpos()[0].numpy().copy()
            q[:7] = rng.uniform(ROBOT.safety.position_lower[:7], ROBOT.safety.position_upper[:7])
            agent.robot.set_qpos(torch.as_tensor(q)[None])
            tcp_in_base = (agent.robot.pose.inv() * agent.tcp.pose).p[0].numpy()
            np.testing.assert_allclose(fk(q[:8]), tcp_in_base, atol=1e-5)
    finally:
        env.close()


def test_node_holds_targets_outside_the_workspace_box():
    import torch

    from real_robot import messages as m
    from real_robot.node import PolicyNode
    from real_robot.transport import make_transport
    from robo_rl.contracts import PolicyOutput

    box = dataclasses.replace(ROBOT.safety, workspace_low=(0.2, -0.4, 0.05), workspace_high=(0.8, 0.4, 0.8))
    robot = dataclasses.replace(ROBOT, safety=box, urdf=URDF, ee_link="panda_hand_tcp", cameras=())
    q_home = np.array([0.0, 0.2, 0.0, -2.0, 0.0, 2.2, 0.785, 0.04])  # TCP ~0.5 m ahead, ~0.3 m up
    fk = robot.forward_kinematics()
    assert np.all(fk(q_home) > box.workspace_low) and np.all(fk(q_home) < box.workspace_high)

    class Toward:  # a policy that drives joint 2 forward (the TCP dives towards the table)
        def act(self, obs, deterministic=False):
            return PolicyOutput(actions=torch.as_tensor(q_home + [0, 1.5, 0, 0, 0, 0, 0, 0], dtype=torch.float32)[None])

    tr = make_transport("inprocess")
    node = PolicyNode(robot, Toward(), tr)
    js = tr.publisher(robot.joint_states_topic, "sensor_msgs/msg/JointState")
    commands = []
    q = q_home.copy()
    for _ in range(60):  # the simulated arm follows each command exactly
        js.publish(m.serialize(m.joint_state(list(robot.joint_names), q, None, 0.0), "sensor_msgs/msg/JointState"))
        node.infer_once()
        d = node.control_tick()
        commands.append(d)
        q = d.command
    held = [d.held for d in commands]
    assert not held[0] and any(held) and "workspace" in next(d for d in commands if d.held).interventions
    assert all(np.all(fk(d.command) >= box.workspace_low) for d in commands)  # never commanded outside
    assert node.safety.counts["workspace"] >= 1


def test_kinematics_config_errors_are_one_line():
    with pytest.raises(ConfigError, match="'ee_link' = 'tool0' is not a link of"):
        ChainFK(URDF, "tool0", ROBOT.joint_names)
    with pytest.raises(ConfigError, match="URDF joint 'panda_joint7' moves the end effector"):
        ChainFK(URDF, "panda_hand_tcp", ROBOT.joint_names[:6])
    with pytest.raises(ConfigError, match="no installed Python package 'no_such_pkg'"):
        ChainFK("package://no_such_pkg/robot.urdf", "tcp", ROBOT.joint_names)
