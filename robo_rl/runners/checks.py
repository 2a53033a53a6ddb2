"""Checks of a training run's settings, each a one-line error before anything is touched: the input
paths and CPU ids a fresh run reads, and the settings a resumed run may not change."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from robo_rl import checkpoint as ckpt_io
from robo_rl.affinity import check_cpus
from robo_rl.config import to_dict
from robo_rl.errors import CheckpointError, ConfigError
from robo_rl.run_config import TrainConfig

log = logging.getLogger(__name__)


def check_local_cpus(cfg: TrainConfig) -> None:
    """One-line errors for CPU ids this machine lacks (``env.worker_cpus``, ``run.policy_cpus``) before
    a run directory exists; on Ray the workers' own machines check their envs' ids."""
    if getattr(cfg.env, "worker_cpus", None) is not None:
        check_cpus(cfg.env.worker_cpus, "env.worker_cpus")
    if cfg.run.policy_cpus is not None:
        check_cpus(cfg.run.policy_cpus, "run.policy_cpus")


def input_paths(cfg: TrainConfig) -> dict[str, list[str]]:
    """Config key -> the local files/directories a run reads at start: the policy's pretrained checkpoint,
    a teacher run, demonstration files, a run to initialise from."""
    out: dict[str, list[str]] = {}
    for key, value in (("policy.checkpoint", getattr(cfg.policy, "checkpoint", None)),
                       ("algo.teacher", getattr(cfg.algo, "teacher", None)),
                       ("algo.dataset", getattr(cfg.algo, "dataset", None)),
                       ("run.init_from", cfg.run.init_from)):
        if value:
            out[key] = [value] if isinstance(value, str) else [str(v) for v in value]
    return out


def missing_inputs(cfg: TrainConfig) -> list[str]:
    """``"key 'path'"`` for every input path of :func:`input_paths` that does not exist here."""
    return [f"{key} '{path}'" for key, paths in input_paths(cfg).items() for path in paths if not Path(path).exists()]


def check_inputs(cfg: TrainConfig) -> None:
    """One-line errors for input paths that are missing or (teacher, init_from) not robo-rl runs, before
    a run directory exists (a run directory left by a failed start would block the rerun)."""
    missing = missing_inputs(cfg)
    if missing:
        raise ConfigError(f"config {'; '.join(missing)} does not exist (paths are relative to the working "
                          f"directory {os.getcwd()}); point the key at an existing file or directory")
    for key in ("algo.teacher", "run.init_from"):
        for path in input_paths(cfg).get(key, []):
            try:
                ckpt_io.read_meta(ckpt_io.resolve(path))
            except CheckpointError as err:
                raise ConfigError(f"config key '{key}': {err}") from None


# Settings a resume may not change: they fix what the checkpoint's weights mean (which env, task, robot,
# observations, actions and rewards; the policy's architecture; the algorithm whose optimizer state it is).
_BINDING_ENV = {"name", "task", "suite", "task_ids", "task_kwargs", "obs_mode", "control_mode", "reward_mode",
                "image_size", "extra"}
_RUNTIME_POLICY = {"temperature", "exec_steps", "sampler", "noise_level"}
"""Policy settings that change how actions are drawn, not what the weights are."""


def binding_setting(key: str) -> bool:
    """Whether the dotted config ``key`` must be the same when a run resumes from a checkpoint."""
    section, _, rest = key.partition(".")
    head = rest.split(".", 1)[0]
    if section == "env":
        return head in _BINDING_ENV
    if section == "policy":
        return head not in _RUNTIME_POLICY
    return key == "algo.name"


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {dotted key: leaf value} (lists are leaves)."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, checkpoint value, config value) for every dotted key that differs: keys both configs have,
    and ``env.extra.*`` keys (simulator arguments such as robot_uids) set in only one (None in the other)."""
    a = _flatten(json.loads(json.dumps(saved, default=str)))
    b = _flatten(json.loads(json.dumps(current, default=str)))
    keys = (a.keys() & b.keys()) | {k for k in a.keys() ^ b.keys() if k.startswith("env.extra.")}
    return [(k, a.get(k), b.get(k)) for k in sorted(keys) if a.get(k) != b.get(k)]


def check_resume_config(cfg: TrainConfig, meta: dict[str, Any], ckpt: Path) -> None:
    """One-line error listing every setting the checkpoint's weights depend on that the resumed config
    changes; the other changes (run length, logging, learning rate, evaluation, ...) are logged."""
    changes = config_changes(meta["config"], to_dict(cfg))
    binding = [f"{k} {old!r} -> {new!r}" for k, old, new in changes if binding_setting(k)]
    if binding:
        raise CheckpointError(f"checkpoint '{ckpt}' does not match this model: the resumed config changes "
                              "settings that fix the meaning or shape of its weights: "
                              f"{'; '.join(binding)}; keep the checkpoint's values (in config.yaml and the "
                              "overrides) or start a new run")
    for k, old, new in changes:
        log.info("resume changes %s: %r -> %r", k, old, new)


def check_resume_specs(meta: dict[str, Any], now: dict[str, Any], ckpt: Path) -> None:
    """One-line error listing how the env's observation/action specs differ from the checkpoint's."""
    diffs = [f"{key} {meta.get(key)!r} -> {now[key]!r}" for key in ("obs_spec", "action_spec")
             if json.loads(json.dumps(meta.get(key))) != json.loads(json.dumps(now[key]))]
    if diffs:
        raise CheckpointError(f"the env now gives other observations/actions than checkpoint '{ckpt}' was "
                              f"trained on: {'; '.join(diffs)}; resume with the checkpoint's env settings or "
                              "start a new run")
