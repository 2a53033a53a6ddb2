"""The top-level training config: env, policy, algo sections (chosen by ``name`` through the
registries, each parsed with the Config dataclass next to its code) and run settings."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from robo_rl.config import check_ranges, ranged, section
from robo_rl.errors import ConfigError
from robo_rl.registry import ALGORITHMS, ENVS, POLICIES

DEVICE_PATTERN = r"cpu|cuda(:\d+)?"
"""What ``run.device`` (and ``robo-rl eval --device``) accept."""

EnvSection = section(ENVS)
PolicySection = section(POLICIES, default_name="mlp")
AlgoSection = section(ALGORITHMS, default_name="ppo")


@dataclass(frozen=True)
class RunConfig:
    """Run-level settings: budget, logging, evaluation, checkpoints."""

    total_env_steps: int = ranged(1_000_000, ge=1)
    """Stop after this many env steps (summed over envs). Range: >= 1."""
    max_minutes: float | None = ranged(None, gt=0)
    """Stop after this many wall-clock minutes of training (null: no limit). Range: > 0."""
    rollout_steps: int = ranged(50, ge=1)
    """Steps per env between updates (rollout length T). Range: >= 1."""
    seed: int = ranged(0, ge=0, le=2**31 - 1)
    """Seed for torch and the envs (env i gets seed + i). The seeds derived from it (+ env index, + 1000 per
    iteration, + 10000 for evaluation, rollout-worker offsets) reach numpy's RandomState, which takes seeds
    below 2**32; the bound leaves them that room. Range: in [0, 2**31 - 1]."""
    out_dir: str = "runs"
    """Parent directory of run directories."""
    name: str | None = None
    """Run directory name (default: <task>-<algo>-<timestamp>)."""
    reward_norm: bool = False
    """Scale rewards by the running std of the discounted return."""
    pipeline: bool = False
    """Pipelined collection: two groups of env workers step in turn while the policy acts for the other
    (needs >= 2 env workers; same data distribution as the serial loop)."""
    eval_every_steps: int = ranged(25_000, ge=0)
    """Evaluate the deterministic policy every this many env steps (0 disables). Range: >= 0."""
    eval_episodes: int = ranged(20, ge=1)
    """Episodes per evaluation. Range: >= 1."""
    eval_num_envs: int = ranged(2, ge=1)
    """Parallel envs of the evaluation env. Range: >= 1."""
    final_eval_episodes: int = ranged(50, ge=0)
    """Episodes of the evaluation after training (0 disables). Range: >= 0."""
    stop_at_eval_success: float | None = ranged(None, ge=0, le=1, what="a success rate")
    """Stop early once an evaluation reaches this success rate (null: never). Range: in [0, 1]."""
    checkpoint_every_steps: int = ranged(50_000, ge=1)
    """Write a checkpoint every this many env steps (and always at the end). Range: >= 1."""
    keep_checkpoints: int = ranged(3, ge=1)
    """Newest checkpoints kept on disk. Range: >= 1."""
    video: bool = True
    """Record an mp4 of the final policy."""
    tensorboard: bool = True
    """Write TensorBoard scalars."""
    progress: bool = True
    """Show a rich progress bar."""
    device: str = "cpu"
    """Where the policy learns and acts: ``cpu``, ``cuda`` or ``cuda:N``. Rollout buffers stay on the CPU;
    each act moves its observations to the device and the actions back, each update moves its batch to the
    device. Checked against this machine before a run directory exists. On Ray (``cluster.address``) the
    learners' GPUs are ``cluster.gpus_per_learner`` instead."""
    torch_threads: int = ranged(1, ge=1, le=2**31 - 1)
    """torch intra-op threads in the learner process (torch.set_num_threads takes a C int). Range: in
    [1, 2**31 - 1]."""
    policy_cpus: tuple[int, ...] | None = ranged(None, ge=0, le=2**31 - 1)
    """CPU ids the trainer process (policy and learner) is pinned to (null: no pinning); needs
    ``env.worker_cpus`` too, so that env workers and policy get cores of their own. Range: each in
    [0, 2**31 - 1]."""
    init_from: str | None = None
    """Start the policy from this run directory or checkpoint (e.g. an SFT run before PPO)."""
    freeze_obs_stats: bool = False
    """Keep the policy's input statistics (running state normalization) as loaded instead of updating them
    with rollout observations. For fine-tuning from ``init_from``: the SFT'd weights were fit to those
    statistics, and rollout states (failures run to the time limit) can rescale some dimensions many-fold.
    Off by default: a state MLP fine-tuned from a few-demo BC student needs the statistics to widen
    (measured in docs/results/cpu.md)."""

    def __post_init__(self) -> None:
        check_ranges(self, "run")
        if not re.fullmatch(DEVICE_PATTERN, self.device):
            raise ConfigError(f"config key 'run.device' = {self.device!r} is not a device; use cpu, cuda or cuda:N "
                              "(e.g. cuda:0)")


@dataclass(frozen=True)
class ClusterConfig:
    """Where rollouts run: in this process (``address: null``) or on Ray rollout workers."""

    address: str | None = None
    """Ray cluster: ``auto`` (the cluster this machine belongs to), ``HOST:PORT`` of a head, or ``local``
    (start a private Ray on this machine); null = no Ray, the plain single-process loop."""
    num_workers: int = ranged(2, ge=1)
    """Rollout workers (Ray actors); the env.num_envs envs are split over them as evenly as possible.
    Range: >= 1."""
    cpus_per_worker: float = ranged(1.0, ge=0)
    """Ray CPUs reserved per worker (its envs' subprocesses run inside the reservation). Range: >= 0."""
    gpus_per_worker: float = ranged(0.0, ge=0)
    """Ray GPUs per worker (fractions share a GPU; rendering/physics are placed on what Ray assigns).
    Range: >= 0."""
    max_worker_restarts: int = ranged(3, ge=0)
    """Lost workers replaced (each with the last weights) before the run gives up. Range: >= 0."""
    connect_timeout_s: float = ranged(10.0, gt=0, le=2_000_000, unit="seconds")
    """Seconds to reach the head before failing with a one-line error. Range: in (0, 2000000] seconds."""
    num_learners: int = ranged(0, ge=0)
    """Data-parallel learner actors (torch.distributed: gloo on CPU, nccl on GPU); each updates on its
    share of the batch and gradients are averaged. 0 = the learner runs in the driver process. Range: >= 0."""
    learner_strategy: Literal["ddp", "fsdp"] = "ddp"
    """How the learners hold the model: ``ddp`` (a full replica each, gradients all-reduced) or ``fsdp``
    (parameters, gradients and optimizer state sharded over the learners: 7B-class models)."""
    cpus_per_learner: float = ranged(1.0, ge=0)
    """Ray CPUs reserved per learner. Range: >= 0."""
    gpus_per_learner: float = ranged(0.0, ge=0)
    """Ray GPUs per learner (> 0: the learner trains on its GPU with nccl). Range: >= 0."""
    learner_timeout_s: float = ranged(600.0, gt=0, le=2_000_000, unit="seconds")
    """Seconds a collective may wait for a peer learner before failing. Range: in (0, 2000000] seconds."""

    def __post_init__(self) -> None:
        check_ranges(self, "cluster")
        if self.num_learners > 0 and self.address is None:
            raise ConfigError(f"config key 'cluster.num_learners' = {self.num_learners} needs a Ray cluster: set "
                              "cluster.address (auto, local or HOST:PORT), or cluster.num_learners=0")
        if self.learner_strategy not in ("ddp", "fsdp"):
            raise ConfigError(f"config key 'cluster.learner_strategy' = {self.learner_strategy!r}: use ddp or fsdp")


def _default(registry: Any, name: str) -> Any:
    return lambda: registry.get(name).Config()


@dataclass(frozen=True)
class TrainConfig:
    """Everything `robo-rl train` needs."""

    env: EnvSection  # type: ignore[valid-type]
    """Simulator section; 'name' picks the adapter (e.g. maniskill)."""
    policy: PolicySection = field(default_factory=_default(POLICIES, "mlp"))  # type: ignore[valid-type]
    """Policy section; 'name' picks the model (mlp, cnn, ...)."""
    algo: AlgoSection = field(default_factory=_default(ALGORITHMS, "ppo"))  # type: ignore[valid-type]
    """Algorithm section; 'name' picks the algorithm (ppo, ...)."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run settings."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Ray rollout workers (off unless cluster.address is set)."""

    def __post_init__(self) -> None:
        if getattr(self.algo, "rollout", "sampled") == "greedy" and self.cluster.address is not None:
            raise ConfigError("config key 'algo.rollout' = 'greedy' runs in the single-process trainer; Ray rollout "
                              "workers sample: unset cluster.address or use algo.rollout=sampled")
        if self.run.device != "cpu" and self.cluster.address is not None:
            raise ConfigError(f"config key 'run.device' = {self.run.device!r} is for the single-process trainer; "
                              "on Ray give the learners GPUs with cluster.gpus_per_learner (and cluster.num_learners "
                              ">= 1) and keep run.device=cpu")
        if self.run.policy_cpus is not None and getattr(self.env, "worker_cpus", None) is None:
            raise ConfigError("config key 'run.policy_cpus' needs 'env.worker_cpus' as well (env workers started by "
                              "a pinned trainer would inherit, and crowd, its cores); set both, e.g. "
                              "env.worker_cpus=[0] run.policy_cpus=[1]")
