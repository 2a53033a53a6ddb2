"""Optimizer state across a resume."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

HYPER = ("lr", "base_lr")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any],
                         loader: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Load Adam moments and step counts from a checkpoint but keep this run's learning rates.

    ``Optimizer.load_state_dict`` also restores each group's saved ``lr`` (and our ``base_lr``), which
    would silently undo a resume override such as ``algo.lr=1e-5`` while config.yaml records it; the
    group structure must match (a one-line CheckpointError upstream when it does not). ``loader``
    replaces ``optimizer.load_state_dict`` (FSDP's ``set_optimizer_state_dict``).
    """
    fresh = [{k: g[k] for k in HYPER if k in g} for g in optimizer.param_groups]
    (loader or optimizer.load_state_dict)(state)
    for group, hyper in zip(optimizer.param_groups, fresh):
        group.update(hyper)
