"""ManiSkill scene batches for worker processes: one ``ManiSkillBatchEnv`` steps ``num_envs`` envs of one
GPU (or CPU) scene inside a ``SubprocVecEnv`` worker (``sims.worker.BatchEnv``); ``scene_factories``
places the batches on devices."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from robo_rl.contracts import ArraySpec
from robo_rl.errors import ConfigError, SimulatorUnavailable
from sims.maniskill.env import (
    ManiSkillConfig,
    _action_bounds,
    _make_gym_env,
    _split_obs,
    _to_numpy,
    physx_gpu_library,
    physx_gpu_url,
    render_backends,
)
from sims.maniskill.tasks import instruction_for

log = logging.getLogger(__name__)


class ManiSkillBatchEnv:
    """One ManiSkill scene batch of ``num_envs`` envs (``sims.worker.BatchEnv``), for a worker process.

    ``physx_cuda[:i]`` batches any number of envs on GPU i; ``physx_cpu`` allows one env per scene (it
    runs this same code path on machines without a GPU). No auto-reset: the worker resets finished rows
    by index (ManiSkill's partial reset). The first reset seeds row j with ``seeds[j]``; later episodes
    draw their initial states from the worker's torch RNG, seeded by that reset, so a run is
    reproducible from its seed (the single-env workers use seed + k*B instead)."""

    def __init__(self, cfg: ManiSkillConfig, sim_backend: str, num_envs: int, render: bool = False,
                 render_backend: str | None = None, first_row: int = 0) -> None:
        from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

        if sim_backend.startswith("physx_cpu") and num_envs != 1:
            raise ConfigError(f"ManiSkill physx_cpu holds one env per scene, not {num_envs}; batch scenes on the GPU "
                              "(env.backend=gpu) or use env.scene_workers = env.num_envs on CPU")
        self.cfg, self.num_envs = cfg, num_envs
        try:
            base = _make_gym_env(cfg, sim_backend, num_envs, render, render_backend)
        except Exception as err:  # SAPIEN fetches its PhysX GPU library from GitHub on first use
            lib = physx_gpu_library()
            if sim_backend.startswith("physx_cuda") and lib is not None and not lib.exists():
                raise SimulatorUnavailable(
                    f"ManiSkill GPU physics needs SAPIEN's PhysX GPU library at {lib}, which SAPIEN downloads from "
                    f"GitHub on first use and could not ({type(err).__name__}); fetch {physx_gpu_url()} elsewhere and "
                    f"unzip it into {lib.parent}, or set env.backend: cpu") from None
            raise
        freq = getattr(base.unwrapped, "reconfiguration_freq", 0)
        if num_envs > 1 and freq:
            base.close()
            raise ConfigError(f"ManiSkill task {cfg.task!r} reconfigures its scene every {freq} resets, which a batched "
                              "scene cannot do per env (partial resets); use env.backend=cpu or reconfiguration_freq=0 "
                              "in env.extra")
        self.env = ManiSkillVectorEnv(base, num_envs, auto_reset=False, ignore_terminations=False, record_metrics=False)
        space = self.env.single_action_space
        self.action_spec = ArraySpec(tuple(space.shape), "float32", *_action_bounds(space),
                                     cfg.control_mode or "default")
        self._bounds = _action_bounds(space)
        self.instructions = [instruction_for(cfg.task)] * num_envs
        # distinct seeds per row (a replaced worker's unseeded resets go on from these, not from one shared seed)
        obs = self.reset([first_row + j for j in range(num_envs)])
        self.obs_spec = {k: ArraySpec(v.shape[1:], str(v.dtype)) for k, v in obs.items() if isinstance(v, np.ndarray)}

    def _obs(self, raw: Any) -> dict[str, Any]:
        return {**_split_obs(raw, self.cfg.obs_mode), "instruction": list(self.instructions)}

    def reset(self, seeds: list[int | None]) -> dict[str, Any]:
        """All rows; ``seeds`` (n,) all ints or all None.

        A seeded reset also seeds this process's torch RNG (CPU and CUDA) from ``seeds[0]``: ManiSkill's
        unseeded partial resets draw the new episodes' initial states from it (``torch.rand`` in the
        tasks' episode init), so later episodes differ row by row and reset by reset, reproducibly."""
        import torch

        if any(sd is None for sd in seeds):
            raw, _ = self.env.reset()
        else:
            raw, _ = self.env.reset(seed=[int(sd) for sd in seeds] if self.num_envs > 1 else int(seeds[0]))
            torch.manual_seed(int(seeds[0]))
        return self._obs(raw)

    def reset_rows(self, rows: np.ndarray) -> dict[str, Any]:
        import torch

        raw, _ = self.env.reset(options={"env_idx": torch.as_tensor(rows, dtype=torch.long, device=self.env.device)})
        return self._obs(raw)

    def step(self, actions: np.ndarray) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        import torch

        actions = np.clip(actions, *self._bounds)
        raw, rew, term, trunc, info = self.env.step(torch.as_tensor(actions, device=self.env.device))
        n = self.num_envs
        return (self._obs(raw), _to_numpy(rew).astype(np.float32).reshape(n), _to_numpy(term).astype(bool).reshape(n),
                _to_numpy(trunc).astype(bool).reshape(n),
                {"success": _to_numpy(info.get("success", np.zeros(n, bool))).astype(bool).reshape(n)})

    def render(self) -> np.ndarray:
        return _to_numpy(self.env.render()).astype(np.uint8)

    def close(self) -> None:
        self.env.close()


@dataclass(frozen=True)
class _BatchFactory:
    """Picklable factory of one batched-scene worker (``sims.worker.BatchEnvFactory``)."""

    cfg: ManiSkillConfig
    sim_backend: str
    num_envs: int
    render: bool
    render_backend: str | None
    first_row: int = 0

    def __call__(self) -> ManiSkillBatchEnv:
        return ManiSkillBatchEnv(self.cfg, self.sim_backend, self.num_envs, self.render, self.render_backend,
                                 self.first_row)


def scene_factories(cfg: ManiSkillConfig, gpu: bool, render: bool) -> list[_BatchFactory]:
    """One factory per scene worker: ``env.scene_workers`` batches of near-equal size, placed over the
    visible GPUs (GPU-balanced placement: physics and rendering of a worker on its GPU)."""
    from robo_rl.distributed.placement import describe, place_env_workers, visible_devices

    workers = cfg.scene_workers or 1
    sizes = [cfg.num_envs // workers + (w < cfg.num_envs % workers) for w in range(workers)]
    placements = place_env_workers(sizes, visible_devices() if gpu else [])
    if gpu:
        log.info("ManiSkill scene placement: %s", describe(placements))
    starts = np.cumsum([0, *sizes])
    # CPU scenes (one env each) render where the single-env workers would (balanced over visible GPUs)
    cpu_render = None if gpu else render_backends(replace(cfg, envs_per_worker=1))
    return [_BatchFactory(cfg, f"physx_cuda:{p.device or 0}" if gpu else "physx_cpu", p.envs, render,
                          f"gpu:{p.device or 0}" if gpu else cpu_render[int(starts[p.worker])], int(starts[p.worker]))
            for p in placements]
