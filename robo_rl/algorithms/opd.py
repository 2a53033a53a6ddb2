"""VLA-OPD: on-policy distillation with a reverse-KL, token-level teacher signal.

The student rolls out; afterwards the teacher (any ``Policy`` with the same ``token_space``) scores the
student's own actions token by token. Per-token advantage, no normalization and no env reward:

    A_i = log pi_T(a_i | s) - log pi_S_old(a_i | s)        (a_i: the i-th action token of a rollout step)

and the student maximizes sum_i r_i A_i with PPO's clipped ratio r_i = pi_S(a_i) / pi_S_old(a_i).
Its expected gradient is that of -KL(pi_S || pi_T) (reverse KL: mode seeking). "Tokens" are what the
policy's ``token_log_probs`` returns: the 256-bin action tokens of a token VLA, the action dimensions
of a Gaussian policy. ``A = 0`` wherever the student already agrees with the teacher, so a student
identical to its teacher is left unchanged. The runner loads the teacher (``set_teacher``); no I/O here.

``loss: kl`` replaces the sampled-token estimate by the exact reverse KL of each token's whole
distribution, KL(pi_S(.|s, x_<i) || pi_T(.|s, x_<i)) in closed form (256 bins of an action token, the
Gaussian kernel of a denoising transition, an action dimension's Gaussian), at the student's own rollout
states and recorded prefixes, minimized directly: no advantage and no ratio, and the gradient carries the
teacher's view of every token the student could have drawn at a position, not only of the one it drew
(generalized KD's on-policy loss). It does not differentiate through which prefixes were drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.distributions import Categorical, Distribution, Independent, Normal

from robo_rl.algorithms.calls import LocalCalls, PolicyCalls
from robo_rl.algorithms.optim import OptimizerState, TermMeans, minibatch_indices
from robo_rl.batch import RolloutBatch, Trajectories
from robo_rl.capabilities import TokenDistributions, TokenScorer, require
from robo_rl.config import check_ranges, ranged
from robo_rl.errors import ConfigError


@dataclass(frozen=True)
class OPDConfig:
    """On-policy distillation hyper-parameters."""

    name: str = "opd"
    """Registry name of the algorithm."""
    teacher: str = ""
    """Teacher policy: a robo-rl run directory or checkpoint (loaded by the runner)."""
    teacher_policy: dict[str, Any] = field(default_factory=dict)
    """Settings of the teacher's ``policy`` section that replace those its checkpoint recorded, e.g.
    ``{sampler: noise}`` to score a Flow-SDE-trained pi0 teacher over Flow-Noise transitions like its
    student's; checked by the teacher policy's own config (keys that change the weights' shapes fail to load)."""
    lr: float = ranged(1e-4, gt=0)
    """Adam learning rate. Range: > 0."""
    epochs: int = ranged(2, ge=1)
    """Passes over each rollout. Range: >= 1."""
    minibatches: int = ranged(4, ge=1)
    """Minibatches per epoch. Range: >= 1."""
    clip_coef: float = ranged(0.2, gt=0)
    """Per-token ratio clip (``loss: clipped``). Range: > 0."""
    loss: Literal["clipped", "reinforce", "kl"] = "clipped"
    """``clipped``: PPO's clipped per-token surrogate over the epochs; ``reinforce``: RLinf's plain
    -A * log pi per token (the two are equal on-policy, i.e. in the first epoch's first minibatch;
    after an update the clipped one keeps each token's step bounded); ``kl``: the exact per-token
    reverse KL over each token's whole distribution, minimized directly (student and teacher need
    ``token_distributions``; ``loss/policy_loss`` is then that KL, nats per token)."""
    rollout: Literal["sampled", "greedy"] = "sampled"
    """What the student executes while collecting: ``sampled``, its stochastic policy (the tokens, or the
    Flow-Noise path, that the sampled-token losses need); ``greedy``, its deterministic action, i.e. the
    path greedy evaluation takes (argmax tokens; for a flow VLA the ODE from x_0 = 0, on which ``loss: kl``
    scores each denoising kernel at the student's own x_k). Only with ``loss: kl``; not on Ray workers."""
    max_grad_norm: float = ranged(1.0, gt=0)
    """Global gradient-norm clip (``clip_grad_norm_``; a negative max would flip the gradient). Range: > 0."""
    gamma: float = ranged(0.99, gt=0, le=1)
    """Unused by the loss (no env reward); kept for the rollout's bookkeeping. Range: in (0, 1]."""
    gae_lambda: float = ranged(0.95, ge=0, le=1)
    """Unused by the loss; kept for the rollout's bookkeeping. Range: in [0, 1]."""

    def __post_init__(self) -> None:
        check_ranges(self, "algo")
        if not self.teacher:
            raise ConfigError("config key 'algo.teacher' is required for opd: a run directory or checkpoint of the teacher policy")
        if self.rollout == "greedy" and self.loss != "kl":
            raise ConfigError(f"config key 'algo.rollout' = 'greedy' with algo.loss = {self.loss!r}: the sampled-token "
                              "losses need sampled tokens; use algo.loss=kl or algo.rollout=sampled")


def opd_advantages(teacher_log_probs: torch.Tensor, student_log_probs: torch.Tensor) -> torch.Tensor:
    """(B, n) per-token advantages log pi_T - log pi_S (detached; no normalization)."""
    return (teacher_log_probs - student_log_probs).detach()


def opd_loss(new_log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
             clip_coef: float, kind: str = "clipped") -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, clip fraction) of the clipped per-token surrogate, or of REINFORCE (-A log pi, no clip:
    fraction 0); all (B, n)."""
    if kind == "reinforce":
        return -(advantages * new_log_probs).mean(), torch.zeros(())
    ratio = (new_log_probs - old_log_probs).exp()
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip_coef, 1 + clip_coef) * advantages)
    with torch.no_grad():
        clip_frac = ((ratio - 1).abs() > clip_coef).float().mean()
    return -surrogate.mean(), clip_frac


def take_rows(dist: Distribution, idx: torch.Tensor) -> Distribution:
    """The rows ``idx`` of a distribution batched over its first dimension (Normal, Categorical and
    Independent of those); TypeError for other kinds."""
    if isinstance(dist, Independent):
        return Independent(take_rows(dist.base_dist, idx), dist.reinterpreted_batch_ndims)
    if isinstance(dist, Normal):
        return Normal(dist.loc[idx], dist.scale[idx])
    if isinstance(dist, Categorical):
        return Categorical(logits=dist.logits[idx])
    raise TypeError(f"cannot take rows of a {type(dist).__name__}")


def cat_rows(dists: list[Distribution]) -> Distribution:
    """One distribution of the rows of ``dists`` stacked in order (the kinds ``take_rows`` handles)."""
    first = dists[0]
    if isinstance(first, Independent):
        return Independent(cat_rows([d.base_dist for d in dists]), first.reinterpreted_batch_ndims)
    if isinstance(first, Normal):
        return Normal(torch.cat([d.loc for d in dists]), torch.cat([d.scale for d in dists]))
    if isinstance(first, Categorical):
        return Categorical(logits=torch.cat([d.logits for d in dists]))
    raise TypeError(f"cannot stack rows of a {type(first).__name__}")


def _rows(batch: RolloutBatch, start: int, size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(obs, extras) of the batch's rows [start, start + size)."""
    idx = torch.arange(start, min(start + size, batch.size))
    mb = batch.index(idx)
    return mb.obs, mb.extras


class OPD(OptimizerState):
    """On-policy distillation of ``policy`` (the student) towards a teacher ``Policy``."""

    Config = OPDConfig
    data_parallel: tuple[str, ...] = ("ddp", "fsdp")
    """Runs on data-parallel learners: the differentiable student call goes through ``self.calls``."""

    def __init__(self, cfg: OPDConfig, policy: Any, generator: torch.Generator | None = None) -> None:
        require(policy, TokenScorer, "policy", "OPD (per-token log-probs of the student)")
        if cfg.loss == "kl":
            require(policy, TokenDistributions, "policy", "OPD with algo.loss=kl (whole per-token distributions)")
        self.cfg = cfg
        self.policy = policy
        self.calls: PolicyCalls = LocalCalls(policy)
        self.teacher: Any = None
        self.generator = generator
        params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(params, lr=cfg.lr, eps=1e-5)
        self.updates = 0

    def greedy_rollouts(self) -> bool:
        """Whether the student collects with its deterministic action (``algo.rollout: greedy``)."""
        return self.cfg.rollout == "greedy"

    def needs_teacher(self) -> bool:
        """Always: every OPD update scores the student's rollouts under the teacher."""
        return True

    def set_teacher(self, teacher: Any, student_action_shape: tuple[int, ...], teacher_action_shape: tuple[int, ...]) -> None:
        """Use ``teacher``: it must read the student's tokens the same way (same ``token_space``)."""
        if tuple(teacher_action_shape) != tuple(student_action_shape):
            raise ConfigError(f"the teacher outputs actions of shape {tuple(teacher_action_shape)} but the student "
                              f"{tuple(student_action_shape)}; OPD needs the same action space")
        require(teacher, TokenScorer, "teacher", "OPD (the teacher scores the student's tokens)")
        if self.cfg.loss == "kl":
            require(teacher, TokenDistributions, "teacher", "OPD with algo.loss=kl (whole per-token distributions)")
        ts, ss = teacher.token_space(), self.policy.token_space()
        diff = sorted(k for k in set(ts) | set(ss) if ts.get(k) != ss.get(k))
        if diff:
            raise ConfigError("the teacher's tokens differ from the student's in " + ", ".join(
                f"{k} (teacher {ts.get(k)!r}, student {ss.get(k)!r})" for k in diff[:4]) + "; OPD needs the same tokenizer")
        self.teacher = teacher

    def prepare(self, traj: Trajectories) -> RolloutBatch:
        """The flat transitions; OPD's per-token advantages come from the teacher at update time."""
        return traj.flatten()

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        if self.teacher is None:
            raise ConfigError("OPD has no teacher: the runner must call set_teacher() before training")
        cfg, n = self.cfg, batch.size
        with torch.no_grad():  # the behaviour policy is the current one: nothing was updated since the rollout
            old = self.calls("token_log_probs", batch.obs, batch.extras)  # through the FSDP wrapper too
            teacher = self.teacher.token_log_probs(batch.obs, batch.extras)
        adv = opd_advantages(teacher, old)
        teacher_dists = self._teacher_distributions(batch) if cfg.loss == "kl" else None
        logged = TermMeans()
        for idx in minibatch_indices(n, cfg.minibatches, cfg.epochs, self.generator):
            mb = batch.index(idx)
            if cfg.loss == "kl":
                given = None if teacher_dists is None else take_rows(teacher_dists, idx)
                loss, clip_frac = self._exact_kl(mb, given), torch.zeros(())
            else:
                new = self.calls("token_log_probs", mb.obs, mb.extras)
                loss, clip_frac = opd_loss(new, old[idx], adv[idx], cfg.clip_coef, cfg.loss)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_([p for p in self.policy.parameters() if p.requires_grad],
                                                       cfg.max_grad_norm)
            self.optimizer.step()
            logged.add({"policy_loss": loss, "clip_frac": clip_frac, "grad_norm": grad_norm})
        out = logged.means()
        out["reverse_kl"] = float(-adv.sum(-1).mean())  # E_student[log pi_S - log pi_T] per step
        out["advantage_mean"] = float(adv.mean())
        self.updates += 1
        return out

    @torch.no_grad()
    def _teacher_distributions(self, batch: RolloutBatch) -> Distribution | None:
        """The teacher's per-token distributions over the whole batch, computed once per update in
        minibatch-sized pieces (a VLA teacher's pass costs about what the student's does, and the epochs
        would repeat it), or None where they are of a kind ``take_rows`` cannot slice (then each minibatch
        asks the teacher again)."""
        step = max(1, batch.size // self.cfg.minibatches)
        parts = [self.teacher.token_distributions(*_rows(batch, 0, step))]
        try:  # a kind that cannot be sliced is found on the first piece, before the rest is computed
            cat_rows(parts)
        except TypeError:
            return None
        parts += [self.teacher.token_distributions(*_rows(batch, i, step)) for i in range(step, batch.size, step)]
        return cat_rows(parts)

    def _exact_kl(self, mb: RolloutBatch, teacher: Distribution | None = None) -> torch.Tensor:
        """Mean over the minibatch's tokens of KL(pi_S || pi_T), each token's closed form (differentiable
        in the student); ``teacher``: the teacher's distributions on ``mb`` where already computed."""
        student = self.calls("token_distributions", mb.obs, mb.extras)
        if teacher is None:
            with torch.no_grad():
                teacher = self.teacher.token_distributions(mb.obs, mb.extras)
        kl = torch.distributions.kl_divergence(student, teacher)
        if kl.shape != student.batch_shape or kl.ndim != 2:
            raise ValueError(f"token distributions of batch shape {tuple(student.batch_shape)} and "
                             f"{tuple(teacher.batch_shape)}: OPD needs (B, K) on both sides")
        return kl.mean()
