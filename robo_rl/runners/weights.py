"""What a training run writes into its checkpoints and reads back from other runs' checkpoints: the
meta.json record, device-free state dicts, and starting weights (``run.init_from``). Shared by the
on-policy and offline trainers."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from robo_rl import checkpoint as ckpt_io
from robo_rl.config import to_dict
from robo_rl.run_config import TrainConfig

log = logging.getLogger(__name__)


def checkpoint_meta(cfg: TrainConfig, env: Any, env_steps: int, iteration: int) -> dict[str, Any]:
    """meta.json of a checkpoint: policy name, counters, the env's specs and the resolved config."""
    return {"policy": cfg.policy.name, "env_steps": env_steps, "iteration": iteration,
            "obs_spec": {k: list(v.shape) for k, v in env.obs_spec.items()},
            "action_spec": {"shape": list(env.action_spec.shape), "low": env.action_spec.low,
                            "high": env.action_spec.high},
            "config": to_dict(cfg)}


def cpu_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` with every tensor on the CPU (checkpoints are device-free)."""
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def load_policy_weights(policy: Any, source: str) -> Path:
    """Load a run directory's latest (or a given) checkpoint's weights into ``policy`` (strict)."""
    ckpt = ckpt_io.resolve(source)
    ckpt_io.load_into(policy, ckpt_io.load_model_state(ckpt), ckpt)
    log.info("policy initialised from %s", ckpt)
    return ckpt
