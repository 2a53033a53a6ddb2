"""The whole sim-to-real path in separate processes over DDS on loopback: a ManiSkill robot process
publishes camera + joint states and executes commands; our policy node (safety on) drives it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from real_robot.config import load_robot
from real_robot.node import PolicyNode
from robo_rl.contracts import PolicyOutput
from tests.conftest import REPO

pytestmark = pytest.mark.maniskill
LOOPBACK = '<CycloneDDS><Domain><General><Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces></General></Domain></CycloneDDS>'


class HoldPolicy:
    """Commands the measured joint positions (a safe no-op)."""

    def __init__(self, j: int) -> None:
        self.j = j
        self.calls = 0

    def act(self, obs, deterministic=True):
        self.calls += 1
        return PolicyOutput(actions=torch.as_tensor(obs["state"])[:, : self.j])


def test_node_drives_the_simulated_ros2_robot(need_maniskill, monkeypatch):
    from real_robot.transport import make_transport

    robot = load_robot(str(REPO / "configs/robots/panda_sim.yaml"))
    domain = random.randint(10, 200)
    monkeypatch.setenv("CYCLONEDDS_URI", LOOPBACK)  # this process only, for this test
    env = {**os.environ, "ROS_DOMAIN_ID": str(domain)}
    sim = subprocess.Popen([sys.executable, "-m", "real_robot.sim_robot", "--task", "PickCube-v1", "--episodes", "2",
                            "--max-episode-steps", "8", "--domain", str(domain)], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tr = make_transport("cyclonedds", domain)
    policy = HoldPolicy(len(robot.joint_names))
    node = PolicyNode(robot, policy, tr, reactive=True)
    try:
        out, err = sim.communicate(timeout=240)
    finally:
        node.stop()
        tr.close()
    assert sim.returncode == 0, err[-3000:]
    results = json.loads(out.strip().splitlines()[-1])["results"]
    assert [r["steps"] for r in results] == [8, 8] and [r["seed"] for r in results] == [0, 1]
    assert node.sent >= 16 and policy.calls >= 16 and not node.rejected
    assert all(np.isfinite(r["return"]) for r in results)
