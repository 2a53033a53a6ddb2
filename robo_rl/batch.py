"""The rollout data the collector hands to an algorithm: ``Trajectories`` (T steps x B envs, as
collected) and ``RolloutBatch`` (the flat N = T*B transitions an update consumes, with the
advantages and returns the algorithm's estimator computed)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RolloutBatch:
    """A flat batch of N = T*B transitions (all tensors lead with N).

    obs: dict of (N, ...) tensors; extras: what ``Policy.evaluate`` needs, (N, ...);
    log_prob, values, advantages, returns: (N,).
    """

    obs: dict[str, torch.Tensor]
    extras: dict[str, torch.Tensor]
    log_prob: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.log_prob.shape[0])

    def index(self, idx: torch.Tensor) -> RolloutBatch:
        return RolloutBatch({k: v[idx] for k, v in self.obs.items()}, {k: v[idx] for k, v in self.extras.items()},
                            self.log_prob[idx], self.values[idx], self.advantages[idx], self.returns[idx])

    def shards(self, n: int) -> list[RolloutBatch]:
        """``n`` contiguous shards of equal size N // n (data-parallel learners must all take the same
        number of minibatch steps; the last N % n < n transitions are left out)."""
        m = self.size // n
        if m < 1:
            raise ValueError(f"a batch of {self.size} transitions cannot be split over {n} learners")
        return [self.index(torch.arange(r * m, (r + 1) * m)) for r in range(n)]

    def to(self, device: torch.device | str) -> RolloutBatch:
        return RolloutBatch({k: v.to(device) for k, v in self.obs.items()}, {k: v.to(device) for k, v in self.extras.items()},
                            self.log_prob.to(device), self.values.to(device), self.advantages.to(device),
                            self.returns.to(device))


@dataclass
class Trajectories:
    """T consecutive vectorized steps of B envs, as collected (every tensor leads with (T, B)).

    obs, extras: dicts of (T, B, ...) tensors (what the policy saw and what ``evaluate`` needs);
    log_prob, values: (T, B) from ``Policy.act``; rewards: (T, B) received after the step's action;
    terminated, truncated: (T, B) bool flags of the step; next_values: (T, B) V(s_{t+1}) of the *same*
    episode (V(final_obs) where the episode ended at t, else V(obs_{t+1})); success: (T, B) bool, the
    env's success flag after the step.
    """

    obs: dict[str, torch.Tensor]
    extras: dict[str, torch.Tensor]
    log_prob: torch.Tensor
    values: torch.Tensor
    next_values: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    success: torch.Tensor

    @property
    def steps(self) -> int:
        return int(self.values.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.values.shape[1])

    def flatten(self, advantages: torch.Tensor | None = None, returns: torch.Tensor | None = None) -> RolloutBatch:
        """The N = T*B transitions in (t, b) row-major order with ``advantages``/``returns`` (T, B)
        (zeros where None: algorithms that compute their own signal at update time)."""
        n = self.steps * self.num_envs
        zeros = torch.zeros(n)
        return RolloutBatch({k: v.reshape((n,) + v.shape[2:]) for k, v in self.obs.items()},
                            {k: v.reshape((n,) + v.shape[2:]) for k, v in self.extras.items()},
                            self.log_prob.reshape(n), self.values.reshape(n),
                            zeros if advantages is None else advantages.reshape(n),
                            zeros.clone() if returns is None else returns.reshape(n))

    @staticmethod
    def cat(parts: list[Trajectories]) -> Trajectories:
        """One (T, B_1 + ... + B_k) batch from parts of equal T (e.g. several rollout workers' envs)."""
        if len(parts) == 1:
            return parts[0]
        steps = {p.steps for p in parts}
        if len(steps) != 1:
            raise ValueError(f"trajectories of different lengths {sorted(steps)} cannot be joined env-wise")

        def join(get):  # noqa: ANN001, ANN202 - a field accessor
            return torch.cat([get(p) for p in parts], dim=1)

        first = parts[0]
        return Trajectories({k: join(lambda p, k=k: p.obs[k]) for k in first.obs},
                            {k: join(lambda p, k=k: p.extras[k]) for k in first.extras},
                            join(lambda p: p.log_prob), join(lambda p: p.values), join(lambda p: p.next_values),
                            join(lambda p: p.rewards), join(lambda p: p.terminated), join(lambda p: p.truncated),
                            join(lambda p: p.success))
