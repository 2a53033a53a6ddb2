"""Proximal Policy Optimization over the ``Policy`` contract (clipped surrogate, clipped value loss,
entropy bonus, grad-norm clipping, epochs x minibatches, target-KL early stop)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch

from robo_rl.algorithms.advantages import AdvantageEstimator
from robo_rl.algorithms.calls import LocalCalls, PolicyCalls
from robo_rl.algorithms.optim import OptimizerState, TermMeans
from robo_rl.batch import RolloutBatch, Trajectories
from robo_rl.capabilities import FineRatios, SeparateCritic
from robo_rl.config import check_ranges, ranged
from robo_rl.registry import ADVANTAGES


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyper-parameters."""

    name: str = "ppo"
    """Registry name of the algorithm."""
    lr: float = ranged(3e-4, gt=0)
    """Adam learning rate. Range: > 0."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """Learning-rate schedule over the run's total env steps."""
    gamma: float = ranged(0.8, gt=0, le=1)
    """Discount factor. Range: in (0, 1]."""
    gae_lambda: float = ranged(0.9, ge=0, le=1)
    """GAE lambda. Range: in [0, 1]."""
    advantage: str = "gae"
    """Advantage estimator (a name in ``robo_rl.registry.ADVANTAGES``)."""
    clip_coef: float = ranged(0.2, gt=0)
    """Surrogate ratio clip. Range: > 0."""
    clip_value: float | None = ranged(0.2, gt=0)
    """Value-loss clip around the old value (null disables). Range: > 0."""
    ent_coef: float = ranged(0.0, ge=0)
    """Entropy bonus weight. Range: >= 0."""
    vf_coef: float = ranged(0.5, ge=0)
    """Value-loss weight. Range: >= 0."""
    max_grad_norm: float = ranged(0.5, gt=0)
    """Global gradient-norm clip (``clip_grad_norm_``; a negative max would flip the gradient). Range: > 0."""
    epochs: int = ranged(8, ge=1)
    """Passes over each rollout. Range: >= 1."""
    minibatches: int = ranged(8, ge=1)
    """Minibatches per epoch. Range: >= 1."""
    target_kl: float | None = ranged(0.1, gt=0)
    """Stop the epoch loop once approx-KL exceeds this (null disables). Range: > 0."""
    norm_adv: bool = True
    """Normalize advantages to zero mean, unit std."""
    norm_adv_scope: Literal["minibatch", "batch"] = "minibatch"
    """Over each minibatch, or once over the whole rollout batch (RL4VLA)."""
    value_lr: float | None = ranged(None, gt=0)
    """Learning rate of the critic's own parameters (``policy.value_parameters()``); null = ``lr``.
    Range: > 0."""
    critic_warmup_iters: int = ranged(0, ge=0)
    """First N updates train only the critic (``policy.value_parameters()``) on the value loss
    (RL4VLA's critic warm-up for pretrained policies). Range: >= 0."""
    value_loss: Literal["mse", "huber"] = "mse"
    """Value regression loss; huber is RL4VLA's choice for VLAs."""
    huber_delta: float = ranged(1.0, gt=0)
    """Huber transition point (in return units). Range: > 0."""
    bootstrap_on_terminated: bool = False
    """Bootstrap from V(final_obs) also when an episode is terminated. ManiSkill terminates on
    success, but a success state is a goal to hold, not the end of value: without this, the agent
    learns that hovering next to the goal (dense reward every step) beats succeeding (reward once)."""

    def __post_init__(self) -> None:
        check_ranges(self, "algo")
        ADVANTAGES.check(self.advantage)


def _regression(pred: torch.Tensor, target: torch.Tensor, huber_delta: float | None) -> torch.Tensor:
    """Elementwise 0.5 (pred - target)^2, or Huber (smooth L1 scaled to match it near 0)."""
    if huber_delta is None:
        return 0.5 * (pred - target) ** 2
    return torch.nn.functional.huber_loss(pred, target, reduction="none", delta=huber_delta)


def ppo_losses(new_log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
               new_value: torch.Tensor, old_value: torch.Tensor, returns: torch.Tensor,
               clip_coef: float, clip_value: float | None, huber_delta: float | None = None) -> dict[str, torch.Tensor]:
    """Per-minibatch PPO terms, all (N,) inputs -> scalars (log-probs (N, U): one ratio per unit, averaged).

    policy_loss = mean(max(-A r, -A clip(r, 1-c, 1+c))), r = exp(new - old);
    value_loss = mean(max(l(v, R), l(v_old + clip(v - v_old, -cv, cv), R))) (or unclipped), with
    l = 0.5 (v - R)^2, or Huber with ``huber_delta``.
    """
    if new_log_prob.ndim > advantages.ndim:  # one ratio per unit (FineRatios): each unit gets its row's advantage
        advantages = advantages.reshape(advantages.shape + (1,) * (new_log_prob.ndim - advantages.ndim))
    log_ratio = new_log_prob - old_log_prob
    ratio = log_ratio.exp()
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1.0 - clip_coef, 1.0 + clip_coef)
    policy_loss = torch.max(pg1, pg2).mean()
    v_unclipped = _regression(new_value, returns, huber_delta)
    if clip_value is not None:
        v_clipped = old_value + torch.clamp(new_value - old_value, -clip_value, clip_value)
        value_loss = torch.max(v_unclipped, _regression(v_clipped, returns, huber_delta)).mean()
    else:
        value_loss = v_unclipped.mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_frac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return {"policy_loss": policy_loss, "value_loss": value_loss, "approx_kl": approx_kl, "clip_frac": clip_frac}


class PPO(OptimizerState):
    """PPO on any ``Policy`` that is also a ``torch.nn.Module``."""

    Config = PPOConfig
    data_parallel: tuple[str, ...] = ("ddp", "fsdp")
    """Runs on data-parallel learners (``cluster.num_learners``): every differentiable policy call goes
    through ``self.calls``."""

    def __init__(self, cfg: PPOConfig, policy: Any, generator: torch.Generator | None = None) -> None:
        self.cfg = cfg
        self.policy = policy
        self.calls: PolicyCalls = LocalCalls(policy)
        self.optimizer = torch.optim.Adam(self._param_groups(cfg, policy), lr=cfg.lr, eps=1e-5)
        self.generator = generator
        self.estimator: AdvantageEstimator = ADVANTAGES.get(cfg.advantage).from_config(cfg)
        self.updates = 0
        value_ids = {id(p) for p in policy.value_parameters()} if isinstance(policy, SeparateCritic) else None
        self._actor_params = [p for p in policy.parameters() if value_ids is not None and id(p) not in value_ids]

    @staticmethod
    def _param_groups(cfg: PPOConfig, policy: Any) -> list[dict[str, Any]]:
        """Trainable parameters; the critic's in their own group when ``value_lr`` is set."""
        params = [p for p in policy.parameters() if p.requires_grad]
        if cfg.value_lr is None or not isinstance(policy, SeparateCritic):
            return [{"params": params, "base_lr": cfg.lr}]
        value_ids = {id(p) for p in policy.value_parameters()}
        return [{"params": [p for p in params if id(p) not in value_ids], "base_lr": cfg.lr},
                {"params": [p for p in params if id(p) in value_ids], "lr": cfg.value_lr, "base_lr": cfg.value_lr}]

    def prepare(self, traj: Trajectories) -> RolloutBatch:
        """Advantages and returns of the collected (T, B) trajectories from ``cfg.advantage``."""
        return self.estimator(traj)

    def extra_loss(self, mb: RolloutBatch) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """A term added to each minibatch's actor loss, with its logged terms (PPO: none). In ``update``,
        ``mb.aux['new_log_prob']`` holds the minibatch's log-probs under the current weights (the PPO
        ratio's numerator, differentiable)."""
        return None, {}

    def set_progress(self, fraction_done: float, env_steps: int | None = None) -> None:
        """Update the learning rate for a linear schedule (fraction of the run done, 0..1)."""
        if self.cfg.lr_schedule == "linear":
            for group in self.optimizer.param_groups:
                group["lr"] = group.get("base_lr", self.cfg.lr) * max(0.0, 1.0 - fraction_done)

    def _unit_log_probs(self, batch: RolloutBatch, mb_size: int) -> RolloutBatch:
        """``batch`` with its log-probs rescored per unit under the rollout weights (before any step)."""
        parts = []
        with torch.no_grad():
            for start in range(0, batch.size, mb_size):
                mb = batch.index(torch.arange(start, min(batch.size, start + mb_size)))
                parts.append(self.calls("evaluate", mb.obs, mb.extras)[0].detach())
        return dataclasses.replace(batch, log_prob=torch.cat(parts))

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        cfg = self.cfg
        n = batch.size
        mb_size = max(1, n // cfg.minibatches)
        if isinstance(self.policy, FineRatios) and self.policy.ratio_unit != "chunk":
            batch = self._unit_log_probs(batch, mb_size)
        logged = TermMeans()
        stop = False
        epochs_run = 0
        warmup = self.updates < cfg.critic_warmup_iters
        huber = cfg.huber_delta if cfg.value_loss == "huber" else None
        if cfg.norm_adv and cfg.norm_adv_scope == "batch" and n > 1:
            batch = dataclasses.replace(
                batch, advantages=(batch.advantages - batch.advantages.mean()) / (batch.advantages.std() + 1e-8))
        for _ in range(cfg.epochs):
            perm = torch.randperm(n, generator=self.generator)
            epochs_run += 1
            for start in range(0, n - mb_size + 1, mb_size):
                idx = perm[start:start + mb_size]
                mb = batch.index(idx)
                new_log_prob, entropy, new_value = self.calls("evaluate", mb.obs, mb.extras)
                adv = mb.advantages
                if cfg.norm_adv and cfg.norm_adv_scope == "minibatch" and adv.numel() > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                terms = ppo_losses(new_log_prob, mb.log_prob, adv, new_value, mb.values, mb.returns,
                                   cfg.clip_coef, cfg.clip_value, huber)
                entropy_mean = entropy.mean()
                if warmup:
                    loss = cfg.vf_coef * terms["value_loss"]
                else:
                    loss = terms["policy_loss"] + cfg.vf_coef * terms["value_loss"] - cfg.ent_coef * entropy_mean
                    extra, extra_terms = self.extra_loss(dataclasses.replace(mb, aux=mb.aux | {"new_log_prob": new_log_prob}))
                    if extra is not None:
                        loss = loss + extra
                    terms.update(extra_terms)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if warmup:  # fit the critic only: the actor (and a trunk it shares) stays as it is
                    for p in self._actor_params:
                        p.grad = None
                grad_norm = torch.nn.utils.clip_grad_norm_([p for p in self.policy.parameters() if p.requires_grad],
                                                           cfg.max_grad_norm)
                self.optimizer.step()
                logged.add({**terms, "entropy": entropy_mean, "grad_norm": grad_norm, "loss": loss})
                if not warmup and cfg.target_kl is not None and float(self.calls.mean(terms["approx_kl"])) > cfg.target_kl:
                    stop = True
                    break
            if stop:
                break
        out = logged.means()
        with torch.no_grad():
            var_y = batch.returns.var()
            out["explained_variance"] = float(1 - (batch.returns - batch.values).var() / var_y) if var_y > 0 else 0.0
        out["epochs"] = float(epochs_run)
        out["critic_warmup"] = float(warmup)
        self.updates += 1
        out["lr"] = float(self.optimizer.param_groups[0]["lr"])
        return out
