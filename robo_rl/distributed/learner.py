"""Data-parallel learners on Ray: ``cluster.num_learners`` actors form one torch.distributed group
(gloo on CPU, nccl on GPU) and run the unchanged algorithm (PPO, RPD, OPD) on their shard of each
batch; the model is wrapped in DDP (a replica per learner, gradients all-reduced) or FSDP2
(``fully_shard``: parameters, gradients and optimizer state sharded: 7B-class models).

The driver keeps a copy of the policy for evaluation, checkpoints and the rollout workers. Per
update it sends each learner its shard and the policy's buffers (observation-normalizer statistics
the driver updates), the learners step together, and learner 0 returns the new weights. The
optimizer state lives in the learners and is gathered for checkpoints (``state_dict``).

Why the policy is wrapped as ``_Methods``: DDP and FSDP act in ``forward`` (DDP prepares its
gradient reduction, FSDP gathers parameters), but our algorithms call ``policy.evaluate`` /
``policy.token_log_probs``. The wrapper's ``forward(method, *args)`` runs the named method, and the
algorithm reaches the policy through ``algo.calls`` (``robo_rl.algorithms.calls``).

A lost learner (process or node gone) takes the whole group down: the group is started again from
the driver's weights (the last completed update) and the optimizer state of the last checkpoint,
and the interrupted update is run again; ``cluster.max_worker_restarts`` bounds this too.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from robo_rl.capabilities import ProgressAware, TeacherGuided
from robo_rl.distributed.cluster import ClusterError
from robo_rl.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)


class _Methods(nn.Module):
    """The policy as a module whose ``forward(method, *args)`` runs ``policy.<method>(*args)``."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, method: str, *args: Any) -> Any:
        out = getattr(self.policy, method)(*args)
        if isinstance(out, torch.distributions.Distribution):
            # DDP finds the tensors the loss will depend on by walking forward's output (tensors, lists,
            # dicts); a Distribution hides its parameters from that walk, so they ride along beside it
            return _Dist(out, _distribution_tensors(out))
        return out


class _Dist(tuple):
    """(distribution, its parameter tensors): what ``_Methods.forward`` returns for a distribution."""

    def __new__(cls, dist: torch.distributions.Distribution, tensors: list[torch.Tensor]) -> _Dist:
        return super().__new__(cls, (dist, tensors))


def _distribution_tensors(dist: torch.distributions.Distribution) -> list[torch.Tensor]:
    """The tensors a distribution holds (``Independent``'s base distribution included)."""
    found: list[torch.Tensor] = []
    for value in vars(dist).values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, torch.distributions.Distribution):
            found.extend(_distribution_tensors(value))
    return found


class DistributedCalls:
    """``PolicyCalls`` through a DDP/FSDP-wrapped ``_Methods``; ``mean`` all-reduces over the group."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, method: str, *args: Any) -> Any:
        out = self.module(method, *args)
        return out[0] if isinstance(out, _Dist) else out

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        t = x.detach().clone().float()
        dist.all_reduce(t)
        return t / dist.get_world_size()


def fsdp_units(policy: nn.Module) -> list[nn.Module]:
    """Submodules FSDP shards as units of their own: the layer classes transformers models name in
    ``_no_split_modules`` (decoder/encoder layers); everything else goes to the root unit."""
    names: set[str] = set()
    for m in policy.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return [m for m in policy.modules() if type(m).__name__ in names]


def wrap(policy: nn.Module, strategy: str, device: torch.device) -> nn.Module:
    """The data-parallel module around ``policy`` (the process group must exist)."""
    root = _Methods(policy)
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # find_unused_parameters: a critic warm-up update leaves the actor without gradients;
        # broadcast_buffers=False: the driver sets the normalizer buffers on every learner itself
        return DistributedDataParallel(root, device_ids=[device.index] if device.type == "cuda" else None,
                                       find_unused_parameters=True, broadcast_buffers=False)
    from torch.distributed.fsdp import fully_shard

    for unit in fsdp_units(policy):
        fully_shard(unit)
    fully_shard(root)
    return root


class LearnerWorker:
    """One rank of the learner group (a plain object; ``ray.remote`` wraps it)."""

    def __init__(self, cfg: Any, rank: int, world: int, obs_spec: Any, action_spec: Any) -> None:
        torch.set_num_threads(cfg.run.torch_threads)
        self.cfg, self.rank, self.world = cfg, rank, world
        self.specs = (obs_spec, action_spec)
        cuda = cfg.cluster.gpus_per_learner > 0 and torch.cuda.is_available()
        self.device = torch.device("cuda", 0) if cuda else torch.device("cpu")  # Ray sets CUDA_VISIBLE_DEVICES
        self.strategy = cfg.cluster.learner_strategy
        self.policy: Any = None
        self.module: Any = None
        self.algo: Any = None

    def pid(self) -> int:
        return os.getpid()

    def rendezvous(self) -> str:
        """The TCP address of this (rank 0) learner's store: its node's IP and a free port."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return f"tcp://{ip}:{s.getsockname()[1]}"

    def setup(self, init_method: str, weights: dict[str, torch.Tensor], algo_state: dict[str, Any] | None,
              updates: int) -> None:
        """Join the group, build the policy from ``weights``, wrap it, build the algorithm (its optimizer
        from ``algo_state`` if given; ``updates`` done so far, which e.g. ends a critic warm-up)."""
        import torch.distributed as dist

        from robo_rl.build import build_algorithm, build_policy, policy_from_checkpoint

        cfg = self.cfg
        dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo", init_method=init_method,
                                rank=self.rank, world_size=self.world,
                                timeout=timedelta(seconds=cfg.cluster.learner_timeout_s))
        policy = build_policy(cfg.policy, *self.specs)
        policy.load_state_dict(weights)
        self.policy = policy.to(self.device)
        self.module = wrap(self.policy, self.strategy, self.device)
        self.algo = build_algorithm(cfg.algo, self.policy, generator=torch.Generator().manual_seed(cfg.run.seed + 7919 * self.rank))
        self.algo.calls = DistributedCalls(self.module)
        if isinstance(self.algo, TeacherGuided) and self.algo.needs_teacher():
            teacher, _, teacher_actions = policy_from_checkpoint(cfg.algo.teacher, cfg.algo.teacher_policy)
            self.algo.set_teacher(teacher.to(self.device), self.specs[1].shape, teacher_actions.shape)
        if algo_state is not None:
            self.load_algo_state(algo_state)
        if hasattr(self.algo, "updates"):
            self.algo.updates = updates

    def update(self, shard: Any, buffers: dict[str, torch.Tensor],
               progress: tuple[float, int | None] | None) -> dict[str, float]:
        """One algorithm update on this learner's shard (all learners at once); ``progress``: (fraction of
        the run done, env steps so far) as the trainer gave ``set_progress``."""
        for name, value in buffers.items():
            self.policy.get_buffer(name).copy_(value)
        if progress is not None and isinstance(self.algo, ProgressAware):
            self.algo.set_progress(*progress)
        self.policy.train()
        return self.algo.update(shard.to(self.device))

    def weights(self) -> dict[str, torch.Tensor] | None:
        """The full policy state on rank 0 (None elsewhere); collective under FSDP."""
        if self.strategy == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            return {k.removeprefix("policy."): v for k, v in full.items()} if self.rank == 0 else None
        return {k: v.detach().cpu() for k, v in self.policy.state_dict().items()} if self.rank == 0 else None

    def algo_state(self) -> dict[str, Any] | None:
        """The algorithm's state (optimizer, counters) on rank 0; collective under FSDP (the optimizer
        state is gathered by parameter name)."""
        if self.strategy == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            optim = get_optimizer_state_dict(self.module, self.algo.optimizer,
                                             options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if self.rank != 0:
                return None
            return {**self.algo.state_dict(), "optimizer": optim, "learner_strategy": "fsdp"}
        return _to_cpu(self.algo.state_dict()) if self.rank == 0 else None

    def load_algo_state(self, state: dict[str, Any]) -> None:
        saved = state.get("learner_strategy", "ddp")
        if saved != self.strategy:
            raise CheckpointError(f"the checkpoint's optimizer state was written by {saved!r} learners; this run uses "
                                  f"cluster.learner_strategy={self.strategy!r}: resume with the same strategy")
        if self.strategy == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            rest = {k: v for k, v in state.items() if k not in ("optimizer", "learner_strategy")}
            from robo_rl.algorithms.optim import load_optimizer_state

            load_optimizer_state(self.algo.optimizer, state["optimizer"], loader=lambda s: set_optimizer_state_dict(
                self.module, self.algo.optimizer, s, options=StateDictOptions(full_state_dict=True)))
            if "updates" in rest:
                self.algo.updates = int(rest["updates"])
            return
        self.algo.load_state_dict(state)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _to_cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_to_cpu(v) for v in x]
    return x


def check_algorithm(cfg: Any) -> None:
    """One-line error if the algorithm cannot run on ``cluster.learner_strategy`` learners."""
    from robo_rl.registry import ALGORITHMS

    cc = cfg.cluster
    if cc.num_learners == 0:
        return
    ok = getattr(ALGORITHMS.get(cfg.algo.name), "data_parallel", ())
    if cc.learner_strategy not in ok:
        raise ConfigError(f"algo.name={cfg.algo.name!r} cannot run on cluster.learner_strategy={cc.learner_strategy!r} "
                          f"learners (it supports: {', '.join(ok) or 'none'}); set cluster.num_learners=0 "
                          + (f"or cluster.learner_strategy={ok[0]}" if ok else ""))


class _LearnerLost(Exception):
    pass


class RayLearners:
    """The trainer's algorithm when ``cluster.num_learners`` > 0 (``prepare``, ``update``, ``set_progress``,
    ``state_dict``, ``load_state_dict``, ``close``); ``policy`` is the driver's copy."""

    def __init__(self, cfg: Any, ray: Any, policy: Any, obs_spec: Any, action_spec: Any) -> None:
        import dataclasses

        check_algorithm(cfg)
        teacher = getattr(cfg.algo, "teacher", None)
        if teacher and not os.path.isabs(teacher):  # learner actors need not share the driver's working directory
            cfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, teacher=os.path.abspath(teacher)))
        self.cfg, self.ray, self.policy = cfg, ray, policy
        self.specs = (obs_spec, action_spec)
        self.n = cfg.cluster.num_learners
        self.workers: list[Any] = []
        self.restarts = 0
        self._progress: tuple[float, int | None] | None = None
        self._algo_state: dict[str, Any] | None = None  # to start (again) from: restored or last checkpointed
        self._updates = 0  # completed updates (survives a restart of the group)
        # the algorithm's own prepare() turns trajectories into the batch here, before it is sharded: an
        # estimator may need whole trajectories (GAE's recursion, groups of episodes); the driver-side
        # instance only prepares (its optimizer state is created lazily and never is)
        from robo_rl.build import build_algorithm

        self._prepare = build_algorithm(cfg.algo, policy).prepare

    # -- algorithm interface ---------------------------------------------------------------------
    def set_progress(self, fraction_done: float, env_steps: int | None = None) -> None:
        self._progress = (fraction_done, env_steps)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._algo_state = state
        self._updates = int(state.get("updates", 0))
        if self.workers:
            self._call_all("load_algo_state", [(state,)] * self.n)

    def state_dict(self) -> dict[str, Any]:
        while True:
            try:
                self._ensure_started()
                self._algo_state = self._call_all("algo_state")[0]
                return self._algo_state  # type: ignore[return-value]
            except _LearnerLost as err:
                self._restart(str(err))

    def prepare(self, traj: Any) -> Any:
        """The algorithm's batch (advantages, returns) of the collected (T, B) trajectories."""
        return self._prepare(traj)

    def update(self, batch: Any) -> dict[str, float]:
        """Shard ``batch`` over the learners, update, and load learner 0's weights into the driver's policy."""
        shards = batch.shards(self.n)
        buffers = {k: v.detach().cpu() for k, v in self.policy.named_buffers()}
        while True:
            try:
                self._ensure_started()
                refs = [self.ray.put(s) for s in shards]
                outs = self._call_all("update", [(ref, buffers, self._progress) for ref in refs])
                weights = self._call_all("weights")[0]
                break
            except _LearnerLost as err:
                self._restart(str(err))
        self.policy.load_state_dict(weights)
        self._updates += 1
        return {k: sum(o[k] for o in outs) / len(outs) for k in outs[0]}

    def close(self) -> None:
        refs = [w.close.remote() for w in self.workers]
        for w, ref in zip(self.workers, refs):
            try:
                self.ray.get(ref, timeout=30)
            except Exception:  # a dead or stuck learner has nothing to close
                pass
            self.ray.kill(w)
        self.workers = []

    def pids(self) -> list[int]:
        self._ensure_started()
        return self.ray.get([w.pid.remote() for w in self.workers])

    # -- the group -------------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self.workers:
            return
        cc = self.cfg.cluster
        remote = self.ray.remote(num_cpus=cc.cpus_per_learner, num_gpus=cc.gpus_per_learner, max_restarts=0)(LearnerWorker)
        self.workers = [remote.remote(self.cfg, r, self.n, *self.specs) for r in range(self.n)]
        weights = self.ray.put({k: v.detach().cpu() for k, v in self.policy.state_dict().items()})
        init_method = self._call_one(0, "rendezvous")
        self._call_all("setup", [(init_method, weights, self._algo_state, self._updates)] * self.n)
        log.info("%d %s learners joined at %s", self.n, cc.learner_strategy, init_method)

    def _restart(self, why: str) -> None:
        if self.restarts >= self.cfg.cluster.max_worker_restarts:
            raise ClusterError(f"learner lost ({why}) after {self.restarts} restarts of the learner group "
                               f"(cluster.max_worker_restarts={self.cfg.cluster.max_worker_restarts}); the last "
                               "checkpoint holds the learner: resume with 'robo-rl train --resume RUN_DIR'")
        self.restarts += 1
        log.warning("learner lost (%s): restarting the learner group from the last weights (%s optimizer state)",
                    why, "the last checkpoint's" if self._algo_state is not None else "a fresh")
        self.close()

    def _call_one(self, rank: int, method: str, *args: Any) -> Any:
        return self._call_all(method, [args], ranks=[rank])[0]

    def _call_all(self, method: str, args: list[tuple[Any, ...]] | None = None, ranks: list[int] | None = None) -> list[Any]:
        """Call ``method`` on the learners at once; a dead learner raises ``_LearnerLost`` as soon as
        it is seen (the others may be blocked in a collective waiting for it)."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        ranks = list(range(self.n)) if ranks is None else ranks
        refs = [getattr(self.workers[r], method).remote(*(args[i] if args else ())) for i, r in enumerate(ranks)]
        pending = list(refs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            try:
                self.ray.get(done[0])
            except (RayActorError, ActorDiedError, ActorUnavailableError) as err:
                raise _LearnerLost(type(err).__name__) from None
            except Exception as err:  # a peer's death shows first as a collective error in a survivor
                dead = self._dead_ranks()
                if dead:
                    raise _LearnerLost(f"learner {dead[0]} died; a peer saw {type(err).__name__}") from None
                raise
        return self.ray.get(refs)

    def _dead_ranks(self, timeout_s: float = 20.0) -> list[int]:
        """Ranks whose actor is gone (a live but blocked learner counts as alive)."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        probes = [w.pid.remote() for w in self.workers]
        self.ray.wait(probes, num_returns=len(probes), timeout=timeout_s)
        dead = []
        for r, ref in enumerate(probes):
            try:
                self.ray.get(ref, timeout=0.1)
            except (RayActorError, ActorDiedError, ActorUnavailableError):
                dead.append(r)
            except Exception:  # still busy (blocked in a collective): alive
                pass
        return dead
