"""Rollout workers on Ray: each actor wraps the plain objects of the single-process loop (a VecEnv
of its share of the envs, a copy of the policy, a ``Collector``); the learner stays in the driver.

Per iteration the driver sends the learner's weights once (``ray.put``; every worker loads them),
each worker collects ``run.rollout_steps`` steps of its envs and finishes its batch (GAE with the
synced critic), and the driver concatenates the batches and updates. The learner checkpoint is the
single source of truth: a worker that dies (node lost, process killed) is replaced by a fresh actor
that loads the last weights and collects that iteration's share again; after
``cluster.max_worker_restarts`` replacements the run stops with an error.

Env i of the job is env j of worker k (the split is as even as possible); worker k resets its envs
with seed ``seed + offset_k`` so the first episodes' seeds match the single-process run.

Group rollouts (GRPO): every worker runs a ``GroupCollector`` over its envs (its share a multiple of the
group size, so no group spans two workers); per round the driver hands worker k the seed of its first
group (the job's groups take consecutive initial states, as in one process), joins the rounds and keeps
collecting rounds until the batch holds enough informative groups (``gather_groups``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch

from robo_rl.batch import Trajectories
from robo_rl.distributed.cluster import ClusterError, check_resources, connect
from robo_rl.rollout.stats import EpisodeStats

log = logging.getLogger(__name__)

REPLACE_TIMEOUT_S = 300.0
"""Seconds a replaced rollout worker may take to start (build its envs) and take the weights."""


def split_envs(num_envs: int, workers: int) -> list[int]:
    """Envs per worker, as even as possible (the first ones take the remainder)."""
    if workers > num_envs:
        raise ClusterError(f"cluster.num_workers={workers} is more than env.num_envs={num_envs}: every worker "
                           "needs at least one env; lower cluster.num_workers or raise env.num_envs")
    return [num_envs // workers + (1 if k < num_envs % workers else 0) for k in range(workers)]


def check_group_split(sizes: list[int], group_size: int) -> None:
    """One-line error unless every worker's envs (``sizes``) form whole groups of ``group_size``."""
    if any(size % group_size for size in sizes):
        from robo_rl.errors import ConfigError

        raise ConfigError(f"cluster.num_workers={len(sizes)} splits env.num_envs={sum(sizes)} into {sizes} envs per "
                          f"worker, but group rollouts need each worker's share a multiple of algo.group_size="
                          f"{group_size} (a group's envs run in one worker); make env.num_envs a multiple of "
                          f"{group_size * len(sizes)}")


class RolloutWorker:
    """One worker's envs + policy copy + collector (a plain object; ``ray.remote`` wraps it)."""

    def __init__(self, cfg: Any, index: int, num_envs: int, seed: int, groups: dict[str, Any] | None = None) -> None:

        from robo_rl.build import build_env, build_policy, with_num_envs
        from robo_rl.rollout.collector import Collector

        torch.set_num_threads(cfg.run.torch_threads)
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        self.index = index
        self.env = build_env(with_num_envs(cfg.env, num_envs))
        self.policy = build_policy(cfg.policy, self.env.obs_spec, self.env.action_spec)
        self.collector: Any = Collector(self.env, self.policy, cfg.run.rollout_steps, cfg.run.reward_norm,
                                        getattr(cfg.algo, "gamma", 0.99), cfg.run.pipeline)
        self._seen = 0
        if groups is not None:
            self.use_groups(groups)

    def use_groups(self, groups: dict[str, Any]) -> None:
        """Collect group rollouts (``GroupCollector`` keyword arguments) instead of fixed-length ones."""
        from robo_rl.rollout.groups import GroupCollector

        self.collector = GroupCollector(self.env, self.policy, **groups)
        self._seen = 0

    def specs(self) -> tuple[Any, Any]:
        return self.env.obs_spec, self.env.action_spec

    def pid(self) -> int:
        return os.getpid()

    def reset(self, seed: int) -> dict[str, Any]:
        return self.collector.reset(seed)

    def set_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.policy.load_state_dict(state)

    def scaler_state(self) -> dict[str, Any] | None:
        """This worker's reward-scaler statistics (None without ``run.reward_norm``)."""
        scaler = self.collector.reward_scaler
        return scaler.state_dict() if scaler is not None else None

    def load_scaler_state(self, state: dict[str, Any] | None) -> None:
        if self.collector.reward_scaler is not None and state is not None:
            self.collector.reward_scaler.load_state_dict(state)

    def collect(self) -> tuple[Any, int, list[tuple[float, int, float]], int]:
        """(trajectories, env steps, episodes finished since the last call as (return, length, success), restarts
        of this worker's env subprocesses)."""
        batch, steps = self.collector.collect()
        return batch, steps, self._finished(), int(getattr(self.env, "restarts", 0))

    def seeds_per_round(self) -> int:
        """Initial states one group round of this worker uses per task (after ``reset``)."""
        return int(self.collector.seeds_per_round)

    def group_round(self, first_seed: int) -> tuple[Any, int, list[tuple[float, int, float]], int]:
        """One round of group rollouts (this worker's group g from initial state ``first_seed`` + its slot), as
        ``collect`` returns its batch."""
        batch, steps = self.collector.round(first_seed)
        return batch, steps, self._finished(), int(getattr(self.env, "restarts", 0))

    def _finished(self) -> list[tuple[float, int, float]]:
        st = self.collector.stats
        new = st.episodes - self._seen
        self._seen = st.episodes
        return list(zip(st.returns, st.lengths, st.successes))[-new:] if new > 0 else []

    def close(self) -> None:
        self.env.close()


def preflight(cfg: Any) -> None:
    """Every check a cluster run needs, before its run directory exists: the env split, the head
    (reachable, same Ray), the resources for the workers."""
    from robo_rl.distributed.learner import check_algorithm
    from robo_rl.registry import ALGORITHMS

    cc = cfg.cluster
    sizes = split_envs(cfg.env.num_envs, cc.num_workers)
    if hasattr(ALGORITHMS.get(cfg.algo.name), "rollout_groups"):
        check_group_split(sizes, int(cfg.algo.group_size))
    check_algorithm(cfg)
    check_resources(connect(cc.address, cc.connect_timeout_s), cc)


class WorkerScalers:
    """The workers' reward scalers (``run.reward_norm``: one per worker, each over its own envs' returns),
    seen by the trainer as one scaler: ``state_dict()`` gathers them into the learner's checkpoint,
    ``load_state_dict()`` hands each worker its own back (a single-process checkpoint's one scaler goes to
    every worker; another worker count reuses the saved ones in turn). A replaced worker starts from the
    state of the last gather or load."""

    def __init__(self, rollouts: RayRollouts) -> None:
        self.rollouts = rollouts
        self.states: list[Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        ro = self.rollouts
        self.states = ro._get([w.scaler_state.remote() for w in ro.workers], "scaler_state")
        return {"workers": self.states}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ro = self.rollouts
        saved = state["workers"] if "workers" in state else [state]
        self.states = [saved[k % len(saved)] for k in range(len(ro.workers))]
        ro._get([w.load_scaler_state.remote(s) for w, s in zip(ro.workers, self.states)], "load_scaler_state")


class RayRollouts:
    """The rollout source of ``Trainer`` on a Ray cluster (same interface as ``Collector``)."""

    def __init__(self, cfg: Any) -> None:
        cc = cfg.cluster
        self.cfg = cfg
        self.sizes = split_envs(cfg.env.num_envs, cc.num_workers)
        self.offsets = np.cumsum([0, *self.sizes[:-1]]).tolist()
        self.ray = connect(cc.address, cc.connect_timeout_s)
        check_resources(self.ray, cc)
        self.num_envs = cfg.env.num_envs
        self.stats = EpisodeStats(self.num_envs)
        self.reward_scaler = WorkerScalers(self) if cfg.run.reward_norm else None
        self.report: dict[str, float] = {}
        self.restarts = 0  # replaced Ray workers
        self.env_restarts: list[int] = [0] * cc.num_workers
        self.workers: list[Any] = []
        self._weights: Any = None
        self._seed: int | None = None
        self.groups: dict[str, Any] | None = None  # GroupCollector settings once use_groups() is called
        self._next_group_seed = 0
        self._group_seeds: list[int] = []  # initial states each worker's group round uses (after reset)
        # specs from a throwaway local build would start a simulator here; the first worker reports them
        self.obs_spec: Any = None
        self.action_spec: Any = None

    # -- Collector interface -------------------------------------------------------------------
    def configure(self) -> None:
        """Start the workers (the trainer needs the env specs they report before it builds the policy)."""
        self.workers = [self._spawn(k) for k in range(len(self.sizes))]
        self.obs_spec, self.action_spec = self.ray.get(self.workers[0].specs.remote())

    def use_groups(self, groups: dict[str, Any]) -> None:
        """Collect group rollouts from now on (GRPO): one-line error unless every worker's envs form whole groups."""
        check_group_split(self.sizes, int(groups["group_size"]))
        self.groups = dict(groups)
        self._get([w.use_groups.remote(self.groups) for w in self.workers], "use_groups")

    def reset(self, seed: int) -> dict[str, Any]:
        self._seed = seed
        self._next_group_seed = seed
        obs = self._get([w.reset.remote(seed + off) for w, off in zip(self.workers, self.offsets)], "reset")
        if self.groups is not None:
            self._group_seeds = self._get([w.seeds_per_round.remote() for w in self.workers], "seeds_per_round")
        return {k: (torch.cat([o[k] for o in obs]) if isinstance(obs[0][k], torch.Tensor) else sum((o[k] for o in obs), []))
                for k in obs[0]}

    def sync(self, policy: Any) -> None:
        self._weights = self.ray.put({k: v.detach().cpu() for k, v in policy.state_dict().items()})
        self._get([w.set_weights.remote(self._weights) for w in self.workers], "set_weights")

    def collect(self) -> tuple[Trajectories, int]:
        """Every worker's (T, B_k) trajectories joined env-wise into (T, B), and the env steps taken (group
        rollouts: the informative groups of as many rounds as dynamic sampling takes)."""
        if self.groups is not None:
            from robo_rl.rollout.groups import gather_groups

            g = self.groups
            traj, steps, self.report = gather_groups(self._group_round, g["min_groups"], g["max_rounds"], g["group_return"])
            return traj, steps
        return self._join(self._get([w.collect.remote() for w in self.workers], "collect"))

    def _group_round(self) -> tuple[Trajectories, int]:
        """One round on every worker at once: worker k's groups take the next initial states in turn."""
        per_worker = self._group_seeds or [size // int(self.groups["group_size"]) for size in self.sizes]  # type: ignore[index]
        firsts = (self._next_group_seed + np.cumsum([0, *per_worker[:-1]])).tolist()
        self._next_group_seed += sum(per_worker)
        refs = [w.group_round.remote(s) for w, s in zip(self.workers, firsts)]
        return self._join(self._get(refs, "group_round", [(s,) for s in firsts]))

    def _join(self, outs: list[Any]) -> tuple[Trajectories, int]:
        batches, steps = [], 0
        for k, (batch, n, episodes, env_restarts) in enumerate(outs):
            batches.append(batch)
            steps += n
            self.env_restarts[k] = env_restarts
            for ret, length, success in episodes:
                self.stats.add(ret, length, success)
        return Trajectories.cat(batches), steps

    def close(self) -> None:
        refs = [w.close.remote() for w in self.workers]
        for w, ref in zip(self.workers, refs):
            try:
                self.ray.get(ref, timeout=30)
            except Exception:  # a dead worker has nothing to close
                pass
            self.ray.kill(w)
        self.workers = []

    # -- workers ---------------------------------------------------------------------------------
    def _spawn(self, k: int) -> Any:
        cc = self.cfg.cluster
        remote = self.ray.remote(num_cpus=cc.cpus_per_worker, num_gpus=cc.gpus_per_worker, max_restarts=0)(RolloutWorker)
        seed = self.cfg.run.seed + 7919 * (k + 1) + 104_729 * self.restarts
        return remote.remote(self.cfg, k, self.sizes[k], seed, self.groups)

    def worker_pids(self) -> list[int]:
        return self.ray.get([w.pid.remote() for w in self.workers])

    def _replace(self, k: int, why: str) -> None:
        if self.restarts >= self.cfg.cluster.max_worker_restarts:
            raise ClusterError(f"rollout worker {k} lost ({why}) after {self.restarts} replacements "
                               f"(cluster.max_worker_restarts={self.cfg.cluster.max_worker_restarts}); "
                               "the last checkpoint holds the learner: resume with 'robo-rl train --resume RUN_DIR'")
        self.restarts += 1
        log.warning("rollout worker %d lost (%s); replacing it with the last weights (replacement %d)", k, why,
                    self.restarts)
        try:
            self.ray.kill(self.workers[k])
        except Exception:
            pass
        self.workers[k] = self._spawn(k)
        calls = [self.workers[k].reset.remote((self._seed or 0) + self.offsets[k] + 1000 * self.restarts)]
        if self._weights is not None:
            calls.append(self.workers[k].set_weights.remote(self._weights))
        if self.reward_scaler is not None and self.reward_scaler.states is not None:
            calls.append(self.workers[k].load_scaler_state.remote(self.reward_scaler.states[k]))
        from ray.exceptions import GetTimeoutError

        try:  # a replacement that fits on no node (its node is gone) would stay pending forever
            self.ray.get(calls, timeout=REPLACE_TIMEOUT_S)
        except GetTimeoutError:
            raise ClusterError(f"the replacement for rollout worker {k} did not start within {REPLACE_TIMEOUT_S:.0f} s: "
                               f"no node has {self.cfg.cluster.cpus_per_worker:g} CPU / "
                               f"{self.cfg.cluster.gpus_per_worker:g} GPU free (was a node lost?); add a node and "
                               "resume with 'robo-rl train --resume RUN_DIR'") from None

    def _get(self, refs: list[Any], method: str, args: list[tuple[Any, ...]] | None = None) -> list[Any]:
        """ray.get each worker's result; a lost worker is replaced and asked again (with ``args[k]``)."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        out = []
        for k, ref in enumerate(refs):
            while True:
                try:
                    out.append(self.ray.get(ref))
                    break
                except (RayActorError, ActorDiedError, ActorUnavailableError) as err:
                    self._replace(k, type(err).__name__)  # the new worker is reset, holds the last weights and scaler
                    if method in ("set_weights", "load_scaler_state", "use_groups"):  # the replacement has them
                        out.append(None)
                        break
                    again = args[k] if args is not None else ([self._seed + self.offsets[k]] if method == "reset" else [])
                    ref = getattr(self.workers[k], method).remote(*again)
        return out
