"""What every gradient-based algorithm shares: its optimizer state across a resume, the epoch x
minibatch index order of an update, and the mean of each logged loss term over the minibatches it ran in."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
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


def minibatch_indices(n: int, minibatches: int, epochs: int, generator: torch.Generator | None) -> Iterator[torch.Tensor]:
    """Indices (M,) of each minibatch: ``epochs`` shuffled passes over ``n`` rows, each cut into
    ``minibatches`` parts of M = max(1, n // minibatches) (the last n % minibatches rows of a pass rest)."""
    size = max(1, n // minibatches)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n - size + 1, size):
            yield perm[start:start + size]


class OptimizerState:
    """``state_dict``/``load_state_dict`` of an algorithm whose state is ``self.optimizer`` and the count of
    ``self.updates`` it made."""

    optimizer: torch.optim.Optimizer
    updates: int

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.updates = int(state.get("updates", 0))


class TermMeans:
    """The logged scalars of one update: each term's mean over the minibatches that produced it.

    A term some minibatches lack (GRPO's self-imitation loss where no row is above the group mean) is
    averaged over the minibatches that have it, not diluted by the others; tensors are detached and read
    as Python floats.
    """

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def add(self, terms: Mapping[str, Any]) -> None:
        """Record one minibatch's terms (scalar tensors or numbers)."""
        for k, v in terms.items():
            self._sums[k] = self._sums.get(k, 0.0) + float(v.detach() if isinstance(v, torch.Tensor) else v)
            self._counts[k] = self._counts.get(k, 0) + 1

    def means(self) -> dict[str, float]:
        """Each recorded term's mean over its own minibatches ({} before the first ``add``)."""
        return {k: s / self._counts[k] for k, s in self._sums.items()}
