"""GPU-balanced placement of env workers.

Rendering and GPU physics are the expensive parts of VLA post-training rollouts; if every env worker
renders on GPU 0 (the default of EGL and SAPIEN) that GPU saturates while others idle. Given the
visible GPUs, any load already on them (e.g. the learner/policy on GPU 0) and the envs each worker
hosts, ``place_env_workers`` assigns each worker a device greedily to the least-loaded GPU, so the
env counts per GPU differ by at most the largest worker. With no GPU every worker gets ``None`` (CPU).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from robo_rl.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Device:
    """One GPU as the placement sees it."""

    index: int
    """CUDA/EGL device index."""
    name: str = ""
    """Human-readable name, for the report."""
    load: float = 0.0
    """Load already on the device, in env-equivalents (e.g. the learner)."""


@dataclass(frozen=True)
class Placement:
    """Where one env worker runs: ``device`` is a GPU index for rendering and GPU physics, or None (CPU)."""

    worker: int
    device: int | None
    envs: int


def place_env_workers(envs_per_worker: Sequence[int], devices: Sequence[Device]) -> list[Placement]:
    """Assign each worker (hosting ``envs_per_worker[i]`` envs) to a device.

    Workers are placed largest first onto the device with the least load so far (ties: lower index),
    which keeps the per-device env count within one worker's size of even.
    """
    if any(n < 1 for n in envs_per_worker):
        raise ConfigError(f"every env worker needs >= 1 env, got {list(envs_per_worker)}")
    if not devices:
        return [Placement(i, None, n) for i, n in enumerate(envs_per_worker)]
    if len({d.index for d in devices}) != len(devices):
        raise ConfigError(f"duplicate device indices in {[d.index for d in devices]}")
    load = {d.index: d.load for d in devices}
    order = sorted(range(len(envs_per_worker)), key=lambda i: (-envs_per_worker[i], i))
    chosen: dict[int, int] = {}
    for i in order:
        dev = min(load, key=lambda k: (load[k], k))
        chosen[i] = dev
        load[dev] += envs_per_worker[i]
    return [Placement(i, chosen[i], envs_per_worker[i]) for i in range(len(envs_per_worker))]


def devices_per_env(num_envs: int, envs_per_worker: int = 1, label: str = "env") -> list[int | None]:
    """GPU index (or None) for each of ``num_envs`` envs grouped ``envs_per_worker`` to a worker
    process, placed over the visible GPUs; a worker's envs share its device."""
    sizes = [min(envs_per_worker, num_envs - s) for s in range(0, num_envs, envs_per_worker)]
    placements = place_env_workers(sizes, visible_devices())
    if any(p.device is not None for p in placements):
        log.info("%s placement: %s", label, describe(placements))
    return [p.device for p in placements for _ in range(p.envs)]


def visible_devices() -> list[Device]:
    """The CUDA devices this process can use (empty without CUDA)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        return []
    if not torch.cuda.is_available():
        return []
    return [Device(i, torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]


def egl_device_id(cuda_index: int) -> int:
    """EGL enumerates devices in the order of CUDA_VISIBLE_DEVICES' physical ids when it is set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if cuda_index < len(ids) and ids[cuda_index].isdigit():
            return int(ids[cuda_index])
    return cuda_index


def describe(placements: Sequence[Placement]) -> str:
    """One line per device: which workers and how many envs, e.g. ``gpu0: workers [0, 2] (4 envs)``."""
    by_dev: dict[str, list[Placement]] = {}
    for p in placements:
        by_dev.setdefault("cpu" if p.device is None else f"gpu{p.device}", []).append(p)
    return "; ".join(f"{dev}: workers {[p.worker for p in ps]} ({sum(p.envs for p in ps)} envs)"
                     for dev, ps in sorted(by_dev.items()))
