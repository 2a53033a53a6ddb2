"""The rollout data the collector hands to an algorithm: ``Trajectories`` (T steps x B envs, as
collected) and ``RolloutBatch`` (the flat N = T*B transitions an update consumes, with the
advantages and returns the algorithm's estimator computed)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RolloutBatch:
    """A flat batch of N = T*B transitions (all tensors lead with N).

    obs: dict of (N, ...) tensors; extras: what ``Policy.evaluate`` needs, (N, ...);
    log_prob, values, advantages, returns: (N,); aux: (N, ...) tensors an algorithm attaches for its own
    loss terms (e.g. RPD's teacher actions, computed once per batch), indexed with the rest and never
    handed to the policy.
    """

    obs: dict[str, torch.Tensor]
    extras: dict[str, torch.Tensor]
    log_prob: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    aux: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.log_prob.shape[0])

    def index(self, idx: torch.Tensor) -> RolloutBatch:
        return RolloutBatch({k: v[idx] for k, v in self.obs.items()}, {k: v[idx] for k, v in self.extras.items()},
                            self.log_prob[idx], self.values[idx], self.advantages[idx], self.returns[idx],
                            {k: v[idx] for k, v in self.aux.items()})

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
                            self.returns.to(device), {k: v.to(device) for k, v in self.aux.items()})


@dataclass
class Trajectories:
    """T consecutive vectorized steps of B envs, as collected (every tensor leads with (T, B)).

    obs, extras: dicts of (T, B, ...) tensors (what the policy saw and what ``evaluate`` needs);
    log_prob, values: (T, B) from ``Policy.act``; rewards: (T, B) received after the step's action;
    terminated, truncated: (T, B) bool flags of the step; next_values: (T, B) V(s_{t+1}) of the *same*
    episode (V(final_obs) where the episode ended at t, else V(obs_{t+1})); success: (T, B) bool, the
    env's success flag after the step. Group rollouts (``robo_rl.rollout.groups``) add ``valid`` (T, B)
    bool, the steps of each env's one episode (the steps after it ended are not trained on), and
    ``group`` (B,) int64, the initial state each env started from (envs of a group share it).
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
    valid: torch.Tensor | None = None
    group: torch.Tensor | None = None

    @property
    def steps(self) -> int:
        return int(self.values.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.values.shape[1])

    def flatten(self, advantages: torch.Tensor | None = None, returns: torch.Tensor | None = None) -> RolloutBatch:
        """The transitions in (t, b) row-major order with ``advantages``/``returns`` (T, B) (zeros where
        None: algorithms that compute their own signal at update time); only the ``valid`` ones when set."""
        n = self.steps * self.num_envs
        keep = None if self.valid is None else torch.nonzero(self.valid.reshape(n)).squeeze(1)

        def rows(x: torch.Tensor) -> torch.Tensor:
            flat = x.reshape((n,) + x.shape[2:])
            return flat if keep is None else flat[keep]

        zeros = torch.zeros(self.values.shape)
        return RolloutBatch({k: rows(v) for k, v in self.obs.items()}, {k: rows(v) for k, v in self.extras.items()},
                            rows(self.log_prob), rows(self.values), rows(zeros if advantages is None else advantages),
                            rows(zeros if returns is None else returns))

    @staticmethod
    def cat(parts: list[Trajectories]) -> Trajectories:
        """One (T, B_1 + ... + B_k) batch from parts joined env-wise (e.g. several rollout workers' envs, or
        several rounds of group rollouts). Parts of different T need ``valid`` masks: the shorter ones are
        padded with invalid steps."""
        if len(parts) == 1:
            return parts[0]
        steps = max(p.steps for p in parts)
        if any(p.steps != steps and p.valid is None for p in parts):
            raise ValueError(f"trajectories of different lengths {sorted({p.steps for p in parts})} cannot be "
                             "joined env-wise without valid masks")

        def pad(x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] == steps:
                return x
            return torch.cat([x, torch.zeros((steps - x.shape[0], *x.shape[1:]), dtype=x.dtype)])

        def join(get):  # noqa: ANN001, ANN202 - a field accessor
            return torch.cat([pad(get(p)) for p in parts], dim=1)

        first = parts[0]
        valid = None
        if any(p.valid is not None for p in parts):
            valid = join(lambda p: p.valid if p.valid is not None else torch.ones(p.values.shape, dtype=torch.bool))
        group = None
        if all(p.group is not None for p in parts):
            offsets = [0]
            for p in parts[:-1]:
                offsets.append(offsets[-1] + int(p.group.max()) + 1 if len(p.group) else offsets[-1])
            group = torch.cat([p.group + o for p, o in zip(parts, offsets)])
        return Trajectories({k: join(lambda p, k=k: p.obs[k]) for k in first.obs},
                            {k: join(lambda p, k=k: p.extras[k]) for k in first.extras},
                            join(lambda p: p.log_prob), join(lambda p: p.values), join(lambda p: p.next_values),
                            join(lambda p: p.rewards), join(lambda p: p.terminated), join(lambda p: p.truncated),
                            join(lambda p: p.success), valid, group)

    def episode_outcomes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(return (B,) float32 = the sum of each env's valid rewards, success (B,) bool = whether any valid
        step succeeded): per env, the outcome of its episode in group rollouts."""
        valid = self.valid if self.valid is not None else torch.ones(self.values.shape, dtype=torch.bool)
        return (self.rewards * valid).sum(0), (self.success & valid).any(0)
