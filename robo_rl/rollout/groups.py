"""Group rollouts for group-relative algorithms (GRPO): the B envs start as G = B / n groups of n envs
that share an initial state (env i is in group i % G, so when a VecEnv cycles over T tasks, env i running
task i % T, every group holds one task whenever T divides G), and each env runs one whole episode, so
every group's outcomes compare n tries from the same start.

Initial states (``group_seeds``): "per_task" (default) numbers them per task, as told by the envs'
``instruction`` observation: in each round a task's groups take its next initial states in turn, so a task
walks through seed, seed + 1, seed + 2, ... (all 50 official LIBERO init states of a task within 50 of its
groups). "per_group": group g of round k starts from seed + k G + g whatever its task, so with T tasks cycled
over the envs task t only ever sees the seeds = t (mod T), and the rest of its init states stay held out.
Without an instruction observation (one task) both are seed + k G + g.

Dynamic sampling: a group whose episodes all had the same outcome carries no signal (its advantages
are 0); rounds of group rollouts continue until the batch holds ``min_groups`` informative groups or
``max_rounds`` rounds ran (the cap), and only the informative groups are kept. ``report`` tells what
the last ``collect`` saw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from robo_rl.batch import Trajectories
from robo_rl.boundary import obs_to_torch, to_env_actions
from robo_rl.contracts import PerEnvReset, Policy, VecEnv
from robo_rl.errors import ConfigError
from robo_rl.rollout.stats import EpisodeStats


class GroupCollector:
    """The trainer's rollout source for group-relative algorithms (same interface as ``Collector``)."""

    def __init__(self, env: VecEnv, policy: Policy, group_size: int, min_groups: int, max_rounds: int,
                 max_steps: int = 1000, group_return: str = "success", group_seeds: str = "per_task") -> None:
        """group_size: n envs per initial state (B must be a multiple); min_groups: informative groups a
        batch needs; max_rounds: rounds of B envs at most per batch; max_steps: vectorized steps a round
        may take before its unfinished episodes are cut; group_return: what decides whether a group is
        informative ("success" or "return"); group_seeds: "per_task" or "per_group" (module docstring)."""
        if not isinstance(env, PerEnvReset):
            raise ConfigError(f"group rollouts need an env that seeds each env on its own (reset_each); "
                              f"{type(env).__name__} does not")
        if env.num_envs % group_size:
            raise ConfigError(f"env.num_envs={env.num_envs} is not a multiple of algo.group_size={group_size}: "
                              "every group of envs starts from one initial state")
        self.env, self.policy = env, policy
        self.n, self.min_groups, self.max_rounds, self.max_steps = group_size, min_groups, max_rounds, max_steps
        self.group_return = group_return
        if group_seeds not in ("per_task", "per_group"):
            raise ConfigError(f"group_seeds={group_seeds!r}: use 'per_task' or 'per_group'")
        self.group_seeds = group_seeds
        groups = env.num_envs // group_size
        self._slots = list(range(groups))  # group g starts from first_seed + slot[g]
        self.seeds_per_round = groups
        self.stats = EpisodeStats(env.num_envs)
        self.reward_scaler = None
        self.report: dict[str, float] = {}
        self._next_seed = 0

    @property
    def num_envs(self) -> int:
        return self.env.num_envs

    def reset(self, seed: int) -> dict[str, Any]:
        """Start the initial-state sequence at ``seed`` (the first round's groups start from seed + slot, the
        slots as ``group_seeds`` numbers them)."""
        self._next_seed = seed
        obs, _ = self.env.reset_each(self._seeds())
        texts = obs.get("instruction")
        groups = self.env.num_envs // self.n
        if texts is not None:  # a group is one task from one initial state
            for g in range(groups):
                tasks = set(texts[g::groups])
                if len(tasks) > 1:
                    raise ConfigError(f"envs {g}, {g + groups}, ... form one group but run different tasks "
                                      f"({', '.join(sorted(tasks))[:120]}); with T tasks, make env.num_envs / "
                                      "algo.group_size a multiple of T")
            if self.group_seeds == "per_task":
                self._number_per_task([texts[g] for g in range(groups)])
        self.policy.reset()
        return obs_to_torch(obs)

    def _number_per_task(self, tasks: list[str]) -> None:
        """Slot of group g := how many earlier groups of this round run g's task; a round advances the
        sequence by the most groups any one task has."""
        seen: dict[str, int] = {}
        self._slots = []
        for task in tasks:
            self._slots.append(seen.get(task, 0))
            seen[task] = self._slots[-1] + 1
        self.seeds_per_round = max(seen.values())

    def sync(self, policy: Any) -> None:
        """Nothing to send: the collector acts with the learner's own policy object."""

    def _group_of(self) -> list[int]:
        """Env i's group: i % G."""
        groups = self.env.num_envs // self.n
        return [i % groups for i in range(self.env.num_envs)]

    def _seeds(self, first_seed: int | None = None) -> list[int | None]:
        first = self._next_seed if first_seed is None else first_seed
        return [first + self._slots[g] for g in self._group_of()]

    def collect(self) -> tuple[Trajectories, int]:
        """(the informative groups' trajectories, env steps taken by every round: the cost of the batch)."""
        traj, steps, self.report = gather_groups(self._next_round, self.min_groups, self.max_rounds, self.group_return)
        return traj, steps

    def _next_round(self) -> tuple[Trajectories, int]:
        traj, steps = self.round(self._next_seed)
        self._next_seed += self.seeds_per_round
        return traj, steps

    @torch.no_grad()
    def round(self, first_seed: int) -> tuple[Trajectories, int]:
        """Every env runs one episode from its group's initial state (group g: seed ``first_seed`` + its slot);
        steps after an env's episode ended are invalid. (T, B) trajectories and the env steps taken."""
        env, policy, b = self.env, self.policy, self.env.num_envs
        obs, _ = env.reset_each(self._seeds(first_seed))
        policy.reset()
        policy.eval()
        tobs = obs_to_torch(obs)
        active = np.ones(b, bool)
        rows: list[dict[str, Any]] = []
        steps = 0
        while active.any() and len(rows) < self.max_steps:
            out = policy.act(tobs)
            res = env.step(to_env_actions(out.actions, env.action_spec))
            done = (res.terminated | res.truncated) & active
            reward = np.where(active, res.reward, 0.0)
            self.stats.update(reward, done, res.info["success"], res.info.get("chunk_steps"))
            rows.append({"obs": {k: v for k, v in tobs.items() if isinstance(v, torch.Tensor)}, "extras": out.extras,
                         "log_prob": out.log_prob, "value": out.value, "reward": reward, "valid": active.copy(),
                         "terminated": res.terminated & active, "truncated": res.truncated & active,
                         "success": res.info["success"] & active})
            steps += int(res.info["chunk_steps"].sum()) if "chunk_steps" in res.info else b
            active &= ~done
            if done.any():
                policy.reset(np.flatnonzero(done))
            tobs = obs_to_torch(res.obs)
        return _stack(rows, torch.as_tensor(self._group_of(), dtype=torch.int64)), steps


def gather_groups(next_round: Callable[[], tuple[Trajectories, int]], min_groups: int, max_rounds: int,
                  group_return: str) -> tuple[Trajectories, int, dict[str, float]]:
    """Dynamic sampling over rounds of group rollouts (``next_round()``: one round's (T, B) trajectories with
    group ids, and its env steps) until ``min_groups`` informative groups or ``max_rounds`` rounds: (the
    informative groups' trajectories, env steps of every round, the report). With no informative group within
    the cap, the last round as is (its advantages are all 0)."""
    kept: list[Trajectories] = []
    informative = total_groups = steps = rounds = 0
    last: Trajectories | None = None
    while rounds < max_rounds and informative < min_groups:
        last, n = next_round()
        steps, rounds = steps + n, rounds + 1
        ret, success = last.episode_outcomes()
        outcome = success.float() if group_return == "success" else ret
        assert last.group is not None
        groups = torch.unique(last.group)
        total_groups += len(groups)
        keep = [g for g in groups.tolist() if bool(outcome[last.group == g].unique().numel() > 1)]
        if keep:
            cols = torch.nonzero(torch.isin(last.group, torch.tensor(keep))).squeeze(1)
            kept.append(_columns(last, cols))
            informative += len(keep)
    assert last is not None
    report = {"groups": float(total_groups), "informative_groups": float(informative), "rounds": float(rounds)}
    return (Trajectories.cat(kept) if kept else last), steps, report


def _stack(rows: list[dict[str, Any]], group: torch.Tensor) -> Trajectories:
    """(T, B) trajectories from T per-step records (no critic: next_values are 0)."""

    def st(key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.stack([torch.as_tensor(r[key], dtype=dtype) for r in rows])

    b = len(group)
    zeros = torch.zeros(len(rows), b)
    log_prob = st("log_prob", torch.float32) if rows[0]["log_prob"] is not None else zeros
    values = st("value", torch.float32) if rows[0]["value"] is not None else zeros
    return Trajectories({k: torch.stack([r["obs"][k] for r in rows]) for k in rows[0]["obs"]},
                        {k: torch.stack([r["extras"][k] for r in rows]) for k in rows[0]["extras"]},
                        log_prob, values, zeros.clone(), st("reward", torch.float32), st("terminated", torch.bool),
                        st("truncated", torch.bool), st("success", torch.bool), st("valid", torch.bool), group)


def _columns(traj: Trajectories, cols: torch.Tensor) -> Trajectories:
    """The envs ``cols`` of ``traj`` (group ids renumbered from 0)."""
    assert traj.group is not None and traj.valid is not None
    _, group = torch.unique(traj.group[cols], return_inverse=True)
    return Trajectories({k: v[:, cols] for k, v in traj.obs.items()}, {k: v[:, cols] for k, v in traj.extras.items()},
                        traj.log_prob[:, cols], traj.values[:, cols], traj.next_values[:, cols], traj.rewards[:, cols],
                        traj.terminated[:, cols], traj.truncated[:, cols], traj.success[:, cols], traj.valid[:, cols],
                        group)
