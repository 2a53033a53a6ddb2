"""RPD (refined policy distillation): PPO plus a term that pulls the student's actions towards a
teacher policy's (e.g. a VLA's) on the student's own rollout states:

    loss = PPO loss + lambda_t * d(student, teacher action),   teacher action = teacher.act(obs, greedy)

``distance``: ``mse`` between the student's deterministic action and the teacher's (Gaussian / MLP
students), ``l1`` the same with |.|, or ``nll`` = -log pi_student(teacher action) (any policy whose
``extras_for_actions`` + ``evaluate`` score given actions, e.g. a token VLA: the KL towards the teacher's
action up to a constant). ``kl`` is the reference's variant for a stochastic teacher: the teacher acts
``teacher_samples`` times per state (sampling, not greedy), a diagonal Gaussian is fitted to those actions
(mean, std per dimension, std floored at ``teacher_std_floor``), and the term is

    mean over states of  KL(pi_student(.|s) || N(mu_teacher(s), sigma_teacher(s))) * max(ratio, 1 - clip_coef)

with ``ratio`` the minibatch's PPO ratio (gradient through both factors, as in the reference); the student
must hand out its Gaussian (``GaussianActions``: MLP, CNN). The reference writes the std where
``MultivariateNormal`` takes a covariance; here the std is the std. ``lambda_t`` is constant, or decays
to 0 (or to ``lambda_final``) over the run, linearly or with a cosine as RPD's reference does (``anneal``).
With lambda = 0 the update is PPO's exactly. The teacher is any ``Policy``; the runner loads it and hands
it over with ``set_teacher`` (this file does no I/O).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from robo_rl.algorithms.ppo import PPO, PPOConfig
from robo_rl.batch import RolloutBatch
from robo_rl.capabilities import GaussianActions
from robo_rl.config import ranged
from robo_rl.errors import ConfigError


@dataclass(frozen=True)
class RPDConfig(PPOConfig):
    """PPO hyper-parameters plus the teacher term."""

    name: str = "rpd"
    """Registry name of the algorithm."""
    teacher: str = ""
    """Teacher policy: a robo-rl run directory or checkpoint (loaded by the runner)."""
    teacher_policy: dict[str, Any] = field(default_factory=dict)
    """Settings of the teacher's ``policy`` section that replace those its checkpoint recorded, e.g.
    ``{sampler: noise}`` to score a Flow-SDE-trained pi0 teacher over Flow-Noise transitions like its
    student's; checked by the teacher policy's own config (keys that change the weights' shapes fail to load)."""
    lambda_: float = ranged(1.0, ge=0)
    """Weight of the distance term. Range: >= 0."""
    anneal: Literal["constant", "linear", "cosine"] = "constant"
    """constant, or decay of lambda to ``lambda_final`` over ``anneal_env_steps``: linear, or cosine (RPD's reference:
    lambda * (1 + cos(pi * fraction)) / 2)."""
    anneal_env_steps: int = ranged(0, ge=0, unit="env steps")
    """The annealing horizon: lambda reaches ``lambda_final`` after this many env steps and stays there
    (RPD's reference: ``max_ppd_anneal_steps``, apart from the run's length); 0: over the whole run (``run.total_env_steps``),
    which a run stopped earlier by ``run.max_minutes`` never reaches. Range: >= 0 env steps."""
    lambda_final: float = ranged(0.0, ge=0)
    """Where a linear or cosine anneal ends and then stays (default 0, the reference); a floor above 0 keeps
    a weak pull on after the horizon (measured in docs/results/cpu.md). At most ``lambda_``; only with
    ``anneal`` linear or cosine. Range: >= 0."""
    distance: Literal["mse", "l1", "nll", "kl"] = "mse"
    """How far the student is from the teacher's action (see the module docstring)."""
    teacher_samples: int = ranged(10, ge=2)
    """With ``distance: kl``: teacher actions sampled per state to fit its Gaussian (the reference: 10).
    Range: >= 2."""
    teacher_std_floor: float = ranged(0.01, gt=0, unit="action units")
    """With ``distance: kl``: the smallest std of the fitted teacher Gaussian (a deterministic teacher's
    samples agree exactly). Range: > 0 action units."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.teacher:
            raise ConfigError("config key 'algo.teacher' is required for rpd: a run directory or checkpoint of the teacher policy")
        if self.lambda_final > self.lambda_:
            raise ConfigError(f"config key 'algo.lambda_final' = {self.lambda_final} is above 'algo.lambda_' = {self.lambda_}; "
                              "the anneal goes down from lambda_ to lambda_final: use a value in [0, lambda_]")
        if self.lambda_final and self.anneal == "constant":
            raise ConfigError(f"config key 'algo.lambda_final' = {self.lambda_final} needs 'algo.anneal' linear or cosine "
                              "(a constant lambda never moves); set algo.anneal, or algo.lambda_ alone for a constant pull")


def copy_r2(student: torch.Tensor, teacher: torch.Tensor, eps: float = 1e-10) -> torch.Tensor | None:
    """How much of the teacher's action variation the student reproduces, scale-free: per action dimension
    over the batch, 1 - mean((student - teacher)^2) / var(teacher), averaged over the dimensions the teacher
    varies in (a constant one, e.g. a gripper held shut, has no variance to explain). 1 is a perfect copy,
    0 no better than the teacher's batch mean, below 0 worse. ``student``, ``teacher`` (B, ..., A); None
    when the teacher varies in no dimension. The raw distance alone hides this: joint deltas of a few
    hundredths give a small MSE whatever the student does."""
    s = student.detach().reshape(-1, student.shape[-1]).double()
    t = teacher.detach().reshape(-1, teacher.shape[-1]).to(s.device).double()
    if t.shape[0] < 2:
        return None
    var = t.var(0, unbiased=False)
    live = var > eps
    if not bool(live.any()):
        return None
    r2 = 1.0 - ((s - t) ** 2).mean(0)[live] / var[live]
    return r2.mean().float()


class RPD(PPO):
    """PPO with a teacher-action term on every minibatch."""

    Config = RPDConfig
    data_parallel: tuple[str, ...] = ("ddp",)
    """The teacher term calls the student outside ``self.calls``: fine for DDP (its parameters are
    the ones ``evaluate`` reaches), not for FSDP (unsharded parameters only inside the wrapper)."""

    def __init__(self, cfg: RPDConfig, policy: Any, generator: torch.Generator | None = None) -> None:
        super().__init__(cfg, policy, generator)
        self.teacher: Any = None
        self.lam = cfg.lambda_
        self._student_shape: tuple[int, ...] | None = None
        if cfg.distance == "kl" and not isinstance(policy, GaussianActions):
            raise ConfigError(f"config key 'algo.distance' = 'kl' needs a student with a Gaussian over actions "
                              f"(action_distribution: mlp, cnn), and {type(policy).__name__} has none; use mse, l1 or nll")

    def needs_teacher(self) -> bool:
        """False with ``lambda_`` 0 (PPO alone, the baseline arm of every comparison): the teacher is never
        asked, so the runner does not load it."""
        return self.cfg.lambda_ != 0.0

    def set_teacher(self, teacher: Any, student_action_shape: tuple[int, ...], teacher_action_shape: tuple[int, ...]) -> None:
        """Use ``teacher`` (a Policy); its action shape must be the student's."""
        if tuple(teacher_action_shape) != tuple(student_action_shape):
            raise ConfigError(f"the teacher outputs actions of shape {tuple(teacher_action_shape)} but the student "
                              f"{tuple(student_action_shape)}; RPD needs the same action space")
        self.teacher = teacher

    def set_progress(self, fraction_done: float, env_steps: int | None = None) -> None:
        super().set_progress(fraction_done, env_steps)
        if self.cfg.anneal_env_steps and env_steps is not None:
            fraction_done = env_steps / self.cfg.anneal_env_steps
        f = min(1.0, max(0.0, fraction_done))
        start, end = self.cfg.lambda_, self.cfg.lambda_final
        if self.cfg.anneal == "linear":
            self.lam = end + (start - end) * (1.0 - f)
        elif self.cfg.anneal == "cosine":
            self.lam = end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * f))

    @staticmethod
    def teacher_targets(teacher_actions: torch.Tensor, student_shape: tuple[int, ...]) -> torch.Tensor:
        """The teacher's actions as targets of the student's (B, *student_shape): the same shape as is, or
        from a chunking teacher (B, H, A) for a one-step student (A,) the first action of the chunk the
        teacher plans at this state (what it would execute now). Anything else is a one-line error."""
        if tuple(teacher_actions.shape[1:]) == tuple(student_shape):
            return teacher_actions
        if teacher_actions.ndim == len(student_shape) + 2 and tuple(teacher_actions.shape[2:]) == tuple(student_shape):
            return teacher_actions[:, 0]
        raise ConfigError(f"the teacher acts in shape {tuple(teacher_actions.shape[1:])} per state but the student in "
                          f"{tuple(student_shape)}; RPD needs the same actions, or a chunking teacher of a one-step "
                          "student (its chunk's first action is the target)")

    def distance(self, obs: dict[str, Any], teacher_actions: torch.Tensor) -> torch.Tensor:
        """Mean distance of the student from the teacher's actions (B, ...) on ``obs``."""
        if self.cfg.distance == "nll":
            if self._student_shape is None:  # what the student emits per state: one action or a chunk
                with torch.no_grad():
                    self._student_shape = tuple(self.policy.act({k: v[:1] for k, v in obs.items()}, deterministic=True).actions.shape[1:])
            target = self.teacher_targets(teacher_actions, self._student_shape)
            log_prob, _, _ = self.policy.evaluate(obs, self.policy.extras_for_actions(obs, target))
            return -log_prob.mean()
        return self._distance_and_fit(obs, teacher_actions)[0]

    def _distance_and_fit(self, obs: dict[str, Any], teacher_actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``distance`` for ``mse`` / ``l1``, with ``copy_r2`` of the student's deterministic actions."""
        student = self.policy.act(obs, deterministic=True).actions
        teacher_actions = self.teacher_targets(teacher_actions, tuple(student.shape[1:]))
        if torch.is_grad_enabled() and not student.requires_grad:
            raise ConfigError(f"config key 'algo.distance' = {self.cfg.distance!r} needs actions that are differentiable "
                              f"in the weights, but {type(self.policy).__name__} decodes discrete action tokens (the "
                              f"term would do nothing); use algo.distance: nll")
        diff = student - teacher_actions.to(student.dtype)
        d = (diff**2).mean() if self.cfg.distance == "mse" else diff.abs().mean()
        return d, copy_r2(student.detach(), teacher_actions)

    def kl_to_teacher(self, obs: dict[str, Any], mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """(B,) KL(pi_student(.|s) || N(mean, std)) summed over action dimensions; ``mean``, ``std`` (B, A)."""
        return self._kl_and_mean(obs, mean, std)[0]

    def _kl_and_mean(self, obs: dict[str, Any], mean: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``kl_to_teacher`` and the student's mean action (B, A) it was taken from."""
        student = self.policy.action_distribution(obs)
        teacher = torch.distributions.Normal(mean.to(student.mean.dtype), std.to(student.mean.dtype))
        return torch.distributions.kl_divergence(student, teacher).reshape(mean.shape[0], -1).sum(-1), student.mean

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """PPO's update, with the teacher's actions (or, for ``kl``, its fitted Gaussian) on the batch's
        states computed once (in minibatch-sized pieces) and attached as ``aux``, not once per epoch and
        minibatch: a VLA teacher's forward pass costs more than the student's whole update."""
        key = "teacher_mean" if self.cfg.distance == "kl" else "teacher_actions"
        if self.lam != 0.0 and key not in batch.aux:
            step = max(1, batch.size // self.cfg.minibatches)
            parts = [self._teacher_targets({k: v[i:i + step] for k, v in batch.obs.items()})
                     for i in range(0, batch.size, step)]
            batch = dataclasses.replace(batch, aux=batch.aux | {k: torch.cat([p[k] for p in parts]) for k in parts[0]})
        return super().update(batch)

    def _teacher_targets(self, obs: dict[str, Any]) -> dict[str, torch.Tensor]:
        """``teacher_actions`` (B, ...), or for ``kl`` the Gaussian ``teacher_mean`` / ``teacher_std`` (B, A)."""
        if self.cfg.distance != "kl":
            return {"teacher_actions": self._teacher_actions(obs)}
        if self._student_shape is None:
            with torch.no_grad():
                self._student_shape = tuple(self.policy.action_distribution({k: v[:1] for k, v in obs.items()}).mean.shape[1:])
        samples = torch.stack([self.teacher_targets(self._teacher_actions(obs, deterministic=False), self._student_shape)
                               for _ in range(self.cfg.teacher_samples)])
        samples = samples.float()  # statistics in float32 whatever the teacher's dtype
        return {"teacher_mean": samples.mean(0),
                "teacher_std": samples.std(0, unbiased=False).clamp_min(self.cfg.teacher_std_floor)}

    @torch.no_grad()
    def _teacher_actions(self, obs: dict[str, Any], deterministic: bool = True) -> torch.Tensor:
        """The teacher's actions (B, ...) on ``obs``: greedy, or sampled for the ``kl`` fit."""
        if self.teacher is None:
            raise ConfigError("RPD has no teacher: the runner must call set_teacher() before training")
        return self.teacher.act(obs, deterministic=deterministic).actions

    def extra_loss(self, mb: RolloutBatch) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        if self.lam == 0.0:  # annealed away: the teacher is not asked (its weight is still logged)
            return None, {"teacher_lambda": torch.tensor(0.0)}
        if self.cfg.distance == "kl":
            aux = mb.aux if "teacher_mean" in mb.aux else self._teacher_targets(mb.obs)
            new_log_prob = mb.aux.get("new_log_prob")
            if new_log_prob is None:  # a minibatch from outside ``update``
                new_log_prob = self.calls("evaluate", mb.obs, mb.extras)[0]
            kl, student_mean = self._kl_and_mean(mb.obs, aux["teacher_mean"], aux["teacher_std"])
            if new_log_prob.shape != kl.shape:
                raise ConfigError(f"config key 'algo.distance' = 'kl' needs one log-prob per state {tuple(kl.shape)}, "
                                  f"the student gives {tuple(new_log_prob.shape)}; use mse, l1 or nll")
            ratio = (new_log_prob - mb.log_prob).exp().clamp(min=1.0 - self.cfg.clip_coef)
            d = kl.mean()
            return self.lam * (kl * ratio).mean(), self._stats(d, copy_r2(student_mean, aux["teacher_mean"]))
        teacher_actions = mb.aux.get("teacher_actions")
        if teacher_actions is None:  # a minibatch from outside ``update``
            teacher_actions = self._teacher_actions(mb.obs)
        if self.cfg.distance == "nll":
            d, r2 = self.distance(mb.obs, teacher_actions), None
            if isinstance(self.policy, GaussianActions):  # its mean is one cheap pass; a token VLA would decode
                with torch.no_grad():
                    mean = self.policy.action_distribution(mb.obs).mean
                r2 = copy_r2(mean, self.teacher_targets(teacher_actions, tuple(mean.shape[1:])))
        else:
            d, r2 = self._distance_and_fit(mb.obs, teacher_actions)
        return self.lam * d, self._stats(d, r2)

    def _stats(self, distance: torch.Tensor, r2: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The logged teacher terms: distance, lambda, and ``teacher_r2`` where it was measured."""
        stats = {"teacher_distance": distance.detach(), "teacher_lambda": torch.tensor(self.lam)}
        return stats | ({"teacher_r2": r2} if r2 is not None else {})
