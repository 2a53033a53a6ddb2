"""`robo-rl train CONFIG --dry-run`: build everything a run needs except the weights.

The env is built for real with one env on this machine's CPU (GPU-only settings are switched to
their CPU equivalents), the policy on the ``meta`` device from its architecture (no checkpoint is
read, no memory is allocated), and the algorithm on top of it. Config, registry, spec and shape
errors surface exactly as in a real run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from robo_rl.runners.build import build_algorithm, build_env, build_policy
from robo_rl.runners.config import TrainConfig

# GPU-only env settings and their CPU stand-ins for the dry run (by field name, any simulator).
_CPU_FIELDS = {"backend": "cpu", "gl": "osmesa", "render_gpu": -1, "render_device": "cpu", "scene_workers": None}


def _cpu_env_cfg(env_cfg: Any) -> Any:
    names = {f.name for f in dataclasses.fields(env_cfg)}
    return dataclasses.replace(env_cfg, num_envs=1, **{k: v for k, v in _CPU_FIELDS.items() if k in names})


def dry_run(cfg: TrainConfig) -> dict[str, Any]:
    env = build_env(_cpu_env_cfg(cfg.env))
    try:
        obs_spec, action_spec = env.obs_spec, env.action_spec
    finally:
        env.close()
    pcfg = cfg.policy
    if any(f.name == "checkpoint" for f in dataclasses.fields(pcfg)):
        pcfg = dataclasses.replace(pcfg, checkpoint=None)  # architecture only: weights are not read
    with torch.device("meta"):
        policy = build_policy(pcfg, obs_spec, action_spec)
        algo = build_algorithm(cfg.algo, policy)
    params = list(policy.parameters())
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return {"dry_run": "ok", "env": {"name": cfg.env.name, "obs_spec": {k: list(v.shape) for k, v in obs_spec.items()},
                                     "action_spec": list(action_spec.shape)},
            "policy": pcfg.name, "params_millions": round(total / 1e6, 2), "trainable_millions": round(trainable / 1e6, 2),
            "weights_gib_bf16": round(total * 2 / 2**30, 2), "algo": cfg.algo.name,
            "algo_built": type(algo).__name__}
