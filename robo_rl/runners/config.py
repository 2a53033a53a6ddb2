"""The top-level training config: env, policy, algo sections (chosen by ``name`` through the
registries, each parsed with the Config dataclass next to its code) and run settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from robo_rl.config import section
from robo_rl.errors import ConfigError
from robo_rl.registry import ALGORITHMS, ENVS, POLICIES

EnvSection = section(ENVS)
PolicySection = section(POLICIES, default_name="mlp")
AlgoSection = section(ALGORITHMS, default_name="ppo")


@dataclass(frozen=True)
class RunConfig:
    """Run-level settings: budget, logging, evaluation, checkpoints."""

    total_env_steps: int = 1_000_000
    """Stop after this many env steps (summed over envs)."""
    max_minutes: float | None = None
    """Stop after this many wall-clock minutes of training (null: no limit)."""
    rollout_steps: int = 50
    """Steps per env between updates (rollout length T)."""
    seed: int = 0
    """Seed for torch and the envs (env i gets seed + i)."""
    out_dir: str = "runs"
    """Parent directory of run directories."""
    name: str | None = None
    """Run directory name (default: <task>-<algo>-<timestamp>)."""
    reward_norm: bool = False
    """Scale rewards by the running std of the discounted return."""
    pipeline: bool = False
    """Pipelined collection: two groups of env workers step in turn while the policy acts for the other
    (needs >= 2 env workers; same data distribution as the serial loop)."""
    eval_every_steps: int = 25_000
    """Evaluate the deterministic policy every this many env steps (0 disables)."""
    eval_episodes: int = 20
    """Episodes per evaluation."""
    eval_num_envs: int = 2
    """Parallel envs of the evaluation env."""
    final_eval_episodes: int = 50
    """Episodes of the evaluation after training (0 disables)."""
    stop_at_eval_success: float | None = None
    """Stop early once an evaluation reaches this success rate (null: never)."""
    checkpoint_every_steps: int = 50_000
    """Write a checkpoint every this many env steps (and always at the end)."""
    keep_checkpoints: int = 3
    """Newest checkpoints kept on disk."""
    video: bool = True
    """Record an mp4 of the final policy."""
    tensorboard: bool = True
    """Write TensorBoard scalars."""
    progress: bool = True
    """Show a rich progress bar."""
    torch_threads: int = 1
    """torch intra-op threads in the learner process."""
    policy_cpus: tuple[int, ...] | None = None
    """CPU ids the trainer process (policy and learner) is pinned to (null: no pinning); needs
    ``env.worker_cpus`` too, so that env workers and policy get cores of their own."""
    init_from: str | None = None
    """Start the policy from this run directory or checkpoint (e.g. an SFT run before PPO)."""
    freeze_obs_stats: bool = False
    """Keep the policy's input statistics (running state normalization) as loaded instead of updating them
    with rollout observations. For fine-tuning from ``init_from``: the SFT'd weights were fit to those
    statistics, and rollout states (failures run to the time limit) can rescale some dimensions many-fold.
    Off by default: a state MLP fine-tuned from a few-demo BC student needs the statistics to widen
    (README: PushCube from the 5-demo student, 0.97/0.75 running vs 0.33/0.26 frozen)."""

    def __post_init__(self) -> None:
        if self.total_env_steps < 1:
            raise ConfigError(f"config key 'run.total_env_steps' = {self.total_env_steps} must be >= 1")
        if self.rollout_steps < 1:
            raise ConfigError(f"config key 'run.rollout_steps' = {self.rollout_steps} must be >= 1")
        if self.eval_episodes < 1 or self.eval_num_envs < 1:
            raise ConfigError("config keys 'run.eval_episodes' and 'run.eval_num_envs' must be >= 1")
        if self.torch_threads < 1:
            raise ConfigError(f"config key 'run.torch_threads' = {self.torch_threads} must be >= 1")
        for key in ("checkpoint_every_steps", "keep_checkpoints"):
            if getattr(self, key) < 1:
                raise ConfigError(f"config key 'run.{key}' = {getattr(self, key)} must be >= 1")
        for key in ("eval_every_steps", "final_eval_episodes"):
            if getattr(self, key) < 0:
                raise ConfigError(f"config key 'run.{key}' = {getattr(self, key)} must be >= 0 (0 disables)")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ConfigError(f"config key 'run.max_minutes' = {self.max_minutes} must be > 0, or null for no limit")


@dataclass(frozen=True)
class ClusterConfig:
    """Where rollouts run: in this process (``address: null``) or on Ray rollout workers."""

    address: str | None = None
    """Ray cluster: ``auto`` (the cluster this machine belongs to), ``HOST:PORT`` of a head, or ``local``
    (start a private Ray on this machine); null = no Ray, the plain single-process loop."""
    num_workers: int = 2
    """Rollout workers (Ray actors); the env.num_envs envs are split over them as evenly as possible."""
    cpus_per_worker: float = 1.0
    """Ray CPUs reserved per worker (its envs' subprocesses run inside the reservation)."""
    gpus_per_worker: float = 0.0
    """Ray GPUs per worker (fractions share a GPU; rendering/physics are placed on what Ray assigns)."""
    max_worker_restarts: int = 3
    """Lost workers replaced (each with the last weights) before the run gives up."""
    connect_timeout_s: float = 10.0
    """Seconds to reach the head before failing with a one-line error."""
    num_learners: int = 0
    """Data-parallel learner actors (torch.distributed: gloo on CPU, nccl on GPU); each updates on its
    share of the batch and gradients are averaged. 0 = the learner runs in the driver process."""
    learner_strategy: Literal["ddp", "fsdp"] = "ddp"
    """How the learners hold the model: ``ddp`` (a full replica each, gradients all-reduced) or ``fsdp``
    (parameters, gradients and optimizer state sharded over the learners: 7B-class models)."""
    cpus_per_learner: float = 1.0
    """Ray CPUs reserved per learner."""
    gpus_per_learner: float = 0.0
    """Ray GPUs per learner (> 0: the learner trains on its GPU with nccl)."""
    learner_timeout_s: float = 600.0
    """Seconds a collective may wait for a peer learner before failing."""

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ConfigError(f"config key 'cluster.num_workers' = {self.num_workers} must be >= 1")
        if self.cpus_per_worker < 0 or self.gpus_per_worker < 0:
            raise ConfigError("config keys 'cluster.cpus_per_worker'/'cluster.gpus_per_worker' must be >= 0")
        if self.num_learners < 0 or self.cpus_per_learner < 0 or self.gpus_per_learner < 0:
            raise ConfigError("config keys 'cluster.num_learners'/'cluster.cpus_per_learner'/'cluster.gpus_per_learner' "
                              "must be >= 0")
        if self.num_learners > 0 and self.address is None:
            raise ConfigError(f"config key 'cluster.num_learners' = {self.num_learners} needs a Ray cluster: set "
                              "cluster.address (auto, local or HOST:PORT), or cluster.num_learners=0")
        if self.learner_strategy not in ("ddp", "fsdp"):
            raise ConfigError(f"config key 'cluster.learner_strategy' = {self.learner_strategy!r}: use ddp or fsdp")
        if self.max_worker_restarts < 0:
            raise ConfigError(f"config key 'cluster.max_worker_restarts' = {self.max_worker_restarts} must be >= 0")


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
        if self.run.policy_cpus is not None and getattr(self.env, "worker_cpus", None) is None:
            raise ConfigError("config key 'run.policy_cpus' needs 'env.worker_cpus' as well (env workers started by "
                              "a pinned trainer would inherit, and crowd, its cores); set both, e.g. "
                              "env.worker_cpus=[0] run.policy_cpus=[1]")
