"""How an algorithm reaches its policy inside an update: directly (one process) or through a
data-parallel wrapper (``robo_rl.distributed.learner``), which must see every differentiable forward
so it can average the gradients over learners, and which averages the scalars that decide control
flow (an early stop on approx-KL) so all learners take the same number of steps."""

from __future__ import annotations

from typing import Any, Protocol

import torch


class PolicyCalls(Protocol):
    """``calls("evaluate", obs, extras)`` runs ``policy.evaluate(obs, extras)`` (differentiably)."""

    def __call__(self, method: str, *args: Any) -> Any: ...

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` averaged over the learners (identity in one process)."""
        ...


class LocalCalls:
    """One process: call the policy's method directly."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def __call__(self, method: str, *args: Any) -> Any:
        return getattr(self.policy, method)(*args)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        return x
