"""Small real checkpoints for the deployment tests: an MLP policy saved through robo_rl.checkpoint
with the metadata ``robo-rl deploy`` reads, and a robot YAML that fits it."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from robo_rl import checkpoint as ckpt_io
from robo_rl.build import build_policy
from robo_rl.config import load, to_dict
from robo_rl.contracts import ArraySpec
from robo_rl.run_config import TrainConfig
from tests.conftest import REPO

JOINTS = [f"arm_joint{i}" for i in range(7)]


def mlp_checkpoint(run_dir: Path, state_dim: int = 2 * len(JOINTS), action_dim: int = len(JOINTS),
                   seed: int = 0) -> Path:
    """An untrained small MLP run directory (deterministic outputs for a given seed)."""
    cfg = load(TrainConfig, REPO / "configs/quickstart.yaml", ["policy.hidden=[16]"])
    torch.manual_seed(seed)
    obs_spec = {"state": ArraySpec((state_dim,), "float32")}
    action_spec = ArraySpec((action_dim,), "float32", -1.0, 1.0)
    policy = build_policy(cfg.policy, obs_spec, action_spec)
    meta = {"policy": "mlp", "obs_spec": {"state": [state_dim]},
            "action_spec": {"shape": [action_dim], "low": -1.0, "high": 1.0}, "config": to_dict(cfg)}
    ckpt_io.save(run_dir / "checkpoints", 1, policy.state_dict(), {}, meta)
    return run_dir


def robot_yaml(path: Path, transport: str, **over: object) -> Path:
    """A 7-joint arm without cameras (absolute joint targets, joint-state observations)."""
    data = {"name": "test_arm", "transport": transport, "joint_names": JOINTS, "cameras": [],
            "joint_states_topic": "/joint_states", "command_topic": "/arm_controller/commands",
            "estop_topic": "/estop", "control_rate_hz": 30.0, "startup_timeout_s": 20.0,
            "safety": {"position_lower": [-2.0] * 7, "position_upper": [2.0] * 7, "max_velocity": [1.5] * 7,
                       "max_delta": 0.05, "control_rate_hz": 30.0, "stale_ms": 500.0}}
    for k, v in over.items():
        data[k] = v
    path.write_text(yaml.safe_dump(data))
    return path
