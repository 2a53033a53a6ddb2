"""Construct envs, policies and algorithms from config sections through the registries; size a policy
before building it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from robo_rl import checkpoint as ckpt_io
from robo_rl.contracts import ArraySpec
from robo_rl.errors import CheckpointError, ConfigError, RoboRLError
from robo_rl.registry import ALGORITHMS, ENVS, POLICIES

log = logging.getLogger(__name__)


def build_env(env_cfg: Any, render: bool = False, num_envs: int | None = None) -> Any:
    """VecEnv from an env section; ``num_envs`` overrides the section's count (e.g. for evaluation)."""
    if num_envs is not None and num_envs != env_cfg.num_envs:
        env_cfg = with_num_envs(env_cfg, num_envs)
    return ENVS.get(env_cfg.name)(env_cfg, render=render)


def with_num_envs(env_cfg: Any, n: int) -> Any:
    """An env section for ``n`` envs; a config whose other keys depend on the count (ManiSkill's
    ``scene_workers``) adjusts them in its own ``with_num_envs``."""
    import dataclasses

    resize = getattr(env_cfg, "with_num_envs", None)
    return resize(n) if resize is not None else dataclasses.replace(env_cfg, num_envs=n)


def build_policy(policy_cfg: Any, obs_spec: dict[str, ArraySpec], action_spec: ArraySpec) -> Any:
    return POLICIES.get(policy_cfg.name)(policy_cfg, obs_spec, action_spec)


def build_algorithm(algo_cfg: Any, policy: Any, generator: torch.Generator | None = None) -> Any:
    return ALGORITHMS.get(algo_cfg.name)(algo_cfg, policy, generator=generator)


@dataclass(frozen=True)
class LoadedRun:
    """What a checkpoint recorded, read and checked once: ``ckpt`` (the step directory), ``meta`` (its
    meta.json), ``config`` (the run's TrainConfig) and the spaces the policy was built for."""

    ckpt: Path
    meta: dict[str, Any]
    config: Any
    obs_spec: dict[str, ArraySpec]
    action_spec: ArraySpec


def load_run(path: str | Path) -> LoadedRun:
    """The checkpoint a run directory (its latest) or a ``checkpoints/step_*`` directory names, with its
    config parsed; one-line errors for a missing path, a bad meta.json or an unusable config."""
    from robo_rl.config import from_dict
    from robo_rl.run_config import TrainConfig

    ckpt = ckpt_io.resolve(path)
    meta = ckpt_io.read_meta(ckpt)
    try:
        cfg = from_dict(TrainConfig, meta["config"])
    except (KeyError, ConfigError) as err:
        raise CheckpointError(f"checkpoint '{ckpt}' carries an unusable config ({err})") from None
    return LoadedRun(ckpt, meta, cfg, *ckpt_io.specs_from_meta(meta, ckpt))


def policy_from_checkpoint(path: str | LoadedRun, settings: dict[str, Any] | None = None,
                           settings_key: str = "algo.teacher_policy") -> tuple[Any, dict[str, ArraySpec], ArraySpec]:
    """(policy in eval mode, its obs spec, its action spec) from a run directory or checkpoint (or a run
    already loaded): the policy is rebuilt from the config and spaces the checkpoint recorded, then its
    weights loaded. ``settings`` replace keys of the recorded ``policy`` section (inference settings such
    as a sampler), checked as that section is; ``settings_key`` names them in errors."""
    run = path if isinstance(path, LoadedRun) else load_run(path)
    policy_cfg = run.config.policy
    if settings:
        from robo_rl.config import from_dict, to_dict

        if "name" in settings and settings["name"] != getattr(policy_cfg, "name", None):
            raise ConfigError(f"config key '{settings_key}.name' = {settings['name']!r}: the checkpoint '{run.ckpt}' "
                              f"holds a {getattr(policy_cfg, 'name', '?')!r} policy; drop 'name'")
        policy_cfg = from_dict(type(policy_cfg), {**to_dict(policy_cfg), **settings}, prefix=settings_key)
    check_model_size(policy_cfg, run.obs_spec, run.action_spec, f"checkpoint '{run.ckpt}'")
    policy = build_policy(policy_cfg, run.obs_spec, run.action_spec)
    ckpt_io.load_into(policy, ckpt_io.load_model_state(run.ckpt), run.ckpt)
    return policy.eval(), run.obs_spec, run.action_spec


def estimate_parameters(policy_cfg: Any, obs_spec: dict[str, Any], action_spec: Any) -> int | None:
    """Parameters + buffers of the policy ``policy_cfg`` describes, counted by building it on the meta
    device (no memory); None where that is not possible (a policy loading pretrained files named by
    ``policy.checkpoint`` is sized by those files)."""
    if getattr(policy_cfg, "checkpoint", None):
        return None
    try:
        with torch.device("meta"):
            policy = build_policy(policy_cfg, obs_spec, action_spec)
    except RoboRLError:
        raise
    except Exception as err:  # a policy that cannot be built on the meta device: not sized here
        log.debug("cannot size policy %s on the meta device: %s", getattr(policy_cfg, "name", "?"), err)
        return None
    return sum(t.numel() for t in policy.state_dict().values())


def check_model_size(policy_cfg: Any, obs_spec: dict[str, Any], action_spec: Any, source: str) -> None:
    """One-line error when the policy ``source`` describes has more than ``robo_rl.checkpoint.MAX_PARAMS`` parameters
    (unless ``robo_rl.checkpoint.allow_large_models``), before anything of that size is allocated."""
    limit = ckpt_io.max_params()
    if limit is None:
        return
    n = estimate_parameters(policy_cfg, obs_spec, action_spec)
    if n is not None and n > limit:
        raise CheckpointError(f"{source} describes a {getattr(policy_cfg, 'name', '?')} policy of "
                              f"{n / 1e6:,.0f}M parameters ({n * 4 / 2**30:.1f} GiB as float32), more than "
                              f"the {limit / 1e6:,.0f}M built without --allow-large; pass --allow-large if a "
                              "model this size is expected")
