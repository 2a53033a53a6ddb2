"""`robo-rl train CONFIG --dry-run`: build everything a run needs except the weights.

The env is built for real with one env on this machine's CPU (GPU-only settings are switched to
their CPU equivalents), the policy from its pretrained checkpoint when that is here and small
(``_READ_LIMIT``), else on the ``meta`` device from ``policy.arch`` (no weights read, no memory
allocated; the output says which), and the algorithm on top of it. Config, registry, spec and shape
errors surface exactly as in a real run, and so do the offline and CPU checks a run makes before
its run directory exists; input paths, pinned CPU ids and a ``run.device`` GPU missing on this machine (a config meant for
another one) are listed, not fatal.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from robo_rl.build import build_algorithm, build_env, build_policy
from robo_rl.errors import ConfigError
from robo_rl.rollout.device import resolve_device
from robo_rl.run_config import TrainConfig

# Machine-specific env settings (GPUs, pinned cores) and their stand-ins for the dry run (by field name, any simulator).
_CPU_FIELDS = {"backend": "cpu", "gl": "osmesa", "render_gpu": -1, "render_device": "cpu", "scene_workers": None,
               "worker_cpus": None}
# A pretrained checkpoint up to this size is read by the dry run (its architecture is then the real one).
_READ_LIMIT = 2 * 2**30


def _cpu_env_cfg(env_cfg: Any) -> Any:
    names = {f.name for f in dataclasses.fields(env_cfg)}
    return dataclasses.replace(env_cfg, num_envs=1, **{k: v for k, v in _CPU_FIELDS.items() if k in names})


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def dry_run(cfg: TrainConfig) -> dict[str, Any]:
    from robo_rl.registry import ALGORITHMS
    from robo_rl.runners.checks import check_local_cpus, missing_inputs

    if getattr(ALGORITHMS.get(cfg.algo.name), "offline", False):
        from robo_rl.runners.offline import check_offline_config

        check_offline_config(cfg)
    cpus_missing = None
    if cfg.cluster.address is None:
        try:
            check_local_cpus(cfg)
        except ConfigError as err:  # pins for another machine: listed like missing paths, not fatal here
            cpus_missing = str(err)
    missing = missing_inputs(cfg)
    device_missing = None
    try:
        resolve_device(cfg.run.device)
    except ConfigError as err:  # a GPU config checked on a CPU machine: listed, not fatal
        device_missing = str(err)
    env = build_env(_cpu_env_cfg(cfg.env))
    try:
        obs_spec, action_spec = env.obs_spec, env.action_spec
    finally:
        env.close()
    pcfg = cfg.policy
    ckpt = getattr(pcfg, "checkpoint", None)
    built_from = "config"
    if ckpt and Path(ckpt).exists() and _size(Path(ckpt)) <= _READ_LIMIT:
        policy = build_policy(pcfg, obs_spec, action_spec)  # the checkpoint's own architecture
        algo = build_algorithm(cfg.algo, policy)
        built_from = f"checkpoint '{ckpt}'"
    else:
        if ckpt:
            pcfg = dataclasses.replace(pcfg, checkpoint=None)  # architecture only: weights are not read
            why = "not on this machine" if not Path(ckpt).exists() else f"over {_READ_LIMIT / 2**30:.0f} GiB, not read"
            built_from = f"policy.arch {getattr(pcfg, 'arch', None)!r} (checkpoint '{ckpt}' {why})"
        with torch.device("meta"):
            policy = build_policy(pcfg, obs_spec, action_spec)
            algo = build_algorithm(cfg.algo, policy)
    params = list(policy.parameters())
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    out = {"dry_run": "ok", "env": {"name": cfg.env.name, "obs_spec": {k: list(v.shape) for k, v in obs_spec.items()},
                                    "action_spec": list(action_spec.shape)},
           "policy": pcfg.name, "policy_built_from": built_from, "params_millions": round(total / 1e6, 2),
           "trainable_millions": round(trainable / 1e6, 2), "weights_gib_bf16": round(total * 2 / 2**30, 2),
           "algo": cfg.algo.name, "algo_built": type(algo).__name__}
    if missing:
        out["inputs_missing_here"] = missing  # a real run here stops at these, before making its run directory
    if cpus_missing:
        out["cpus_missing_here"] = cpus_missing
    if device_missing:
        out["device_missing_here"] = device_missing
    return out
