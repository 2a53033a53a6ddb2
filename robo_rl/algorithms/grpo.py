"""GRPO: group-relative policy optimization with the DAPO refinements, over the ``Policy`` contract.

No critic: each env runs one episode from its group's initial state (``robo_rl.rollout.groups``) and
the episode's advantage is its outcome relative to its group's (``GroupRelative``), broadcast to every
action of the episode. The objective is PPO's clipped surrogate with asymmetric clipping (clip-higher:
``1 - clip_low`` .. ``1 + clip_high``), averaged over every element (token-level: every action token of
a token policy, every transition otherwise), with an optional KL penalty to the initial policy (k3
estimator) and an optional entropy bonus, both off by default. Groups whose outcomes are all equal are
dropped at collection (dynamic sampling).

Self-imitation (``sil_coef`` > 0, flow policies): the loss adds ``sil_coef`` x the policy's imitation loss
on its own sampled actions, each transition weighted by its advantage where that is positive (the episodes
that beat their group's mean) and 0 elsewhere. For a flow policy the clipped surrogate acts on the noisy
transitions the rollouts sampled; the flow-matching term moves the deterministic velocity field that a
greedy (ODE) evaluation follows towards the chunks of above-mean episodes, as iRe-VLA's SFT rounds on
successes do, here inside each update. Off by default.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

import torch

from robo_rl.algorithms.advantages import AdvantageEstimator
from robo_rl.algorithms.calls import LocalCalls, PolicyCalls
from robo_rl.algorithms.optim import OptimizerState, TermMeans, minibatch_indices
from robo_rl.batch import RolloutBatch, Trajectories
from robo_rl.capabilities import FineRatios, ScoreAndImitate, SelfImitator, TokenScorer, require
from robo_rl.config import check_ranges, ranged
from robo_rl.errors import ConfigError
from robo_rl.registry import ADVANTAGES


@dataclass(frozen=True)
class GRPOConfig:
    """GRPO hyper-parameters."""

    name: str = "grpo"
    """Registry name of the algorithm."""
    lr: float = ranged(3e-4, gt=0)
    """Adam learning rate. Range: > 0."""
    group_size: int = ranged(8, ge=2)
    """n: envs (episodes) per initial state; env.num_envs must be a multiple. Range: >= 2."""
    min_groups: int = ranged(1, ge=1)
    """Informative groups (outcomes not all equal) a batch needs before the update (dynamic sampling).
    Range: >= 1."""
    max_rounds: int = ranged(4, ge=1)
    """Rounds of group rollouts at most per batch (the cap of dynamic sampling). Range: >= 1."""
    max_episode_steps: int = ranged(1000, ge=1)
    """Vectorized steps a round may take before unfinished episodes are cut. Range: >= 1."""
    group_return: Literal["success", "return"] = "success"
    """What an episode's outcome R is: 1[succeeded], or its summed reward."""
    group_seeds: Literal["per_task", "per_group"] = "per_task"
    """Initial states of the groups when the envs cycle over several tasks: per_task, each task's groups take
    its next states in turn (every LIBERO init state of a task in use); per_group, group g of round k takes
    state k G + g, so with T tasks task t sees only the states = t (mod T) and the rest stay held out
    (``robo_rl.rollout.groups``)."""
    scale_std: bool = True
    """Divide by the group's std (GRPO); false = Dr. GRPO (mean-centred only)."""
    advantage: str = "group"
    """Advantage estimator (a name in ``robo_rl.registry.ADVANTAGES``)."""
    clip_low: float = ranged(0.2, gt=0, lt=1)
    """Ratio clip below 1. Range: in (0, 1)."""
    clip_high: float = ranged(0.28, gt=0)
    """Ratio clip above 1 (clip-higher: larger than clip_low). Range: > 0."""
    token_level: bool = True
    """For policies that score their own tokens/transitions (``TokenScorer``): one ratio per token,
    averaged over all tokens; else one ratio per action (the policy's joint log-prob)."""
    epochs: int = ranged(1, ge=1)
    """Passes over each batch. Range: >= 1."""
    minibatches: int = ranged(4, ge=1)
    """Minibatches per epoch. Range: >= 1."""
    kl_coef: float = ranged(0.0, ge=0)
    """Weight of the KL penalty to the initial policy (0 = off; it keeps a frozen copy). Range: >= 0."""
    ent_coef: float = ranged(0.0, ge=0)
    """Entropy bonus weight. Range: >= 0."""
    max_grad_norm: float = ranged(1.0, gt=0)
    """Global gradient-norm clip. Range: > 0."""
    sil_coef: float = ranged(0.0, ge=0)
    """Weight of the self-imitation term (see the module docstring; needs a ``SelfImitator`` policy such as
    the pi0-style one; 0 = off). Range: >= 0."""

    def __post_init__(self) -> None:
        check_ranges(self, "algo")
        ADVANTAGES.check(self.advantage)


def grpo_loss(new: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, clip_low: float,
              clip_high: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate averaged over every element: ``new``/``old`` log-probs (N,) or (N, K), ``adv`` (N,)
    broadcast over K. Returns (loss, {clip_frac_low, clip_frac_high, approx_kl})."""
    a = adv.reshape(adv.shape + (1,) * (new.dim() - 1))
    log_ratio = new - old
    ratio = log_ratio.exp()
    surrogate = torch.min(ratio * a, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * a)
    with torch.no_grad():
        terms = {"clip_frac_low": ((ratio < 1.0 - clip_low) & (a < 0)).float().mean(),
                 "clip_frac_high": ((ratio > 1.0 + clip_high) & (a > 0)).float().mean(),
                 "approx_kl": ((ratio - 1.0) - log_ratio).mean()}
    return -surrogate.mean(), terms


class GRPO(OptimizerState):
    """GRPO on any ``Policy`` that is also a ``torch.nn.Module``."""

    Config = GRPOConfig
    data_parallel: tuple[str, ...] = ()
    """Group rollouts run in the trainer's process (not on Ray rollout workers): no data-parallel learners."""

    def __init__(self, cfg: GRPOConfig, policy: Any, generator: torch.Generator | None = None) -> None:
        self.cfg, self.policy, self.generator = cfg, policy, generator
        self.calls: PolicyCalls = LocalCalls(policy)
        self.estimator: AdvantageEstimator = ADVANTAGES.get(cfg.advantage).from_config(cfg)
        self.tokens = cfg.token_level and isinstance(policy, TokenScorer)
        if cfg.sil_coef > 0:
            require(policy, SelfImitator, "policy", "GRPO with algo.sil_coef > 0 (set algo.sil_coef=0 for this policy)")
        self.optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr, eps=1e-5)
        self.reference = None
        self.snapshot_reference()
        self.updates = 0

    def snapshot_reference(self) -> None:
        """With ``kl_coef`` > 0: the KL reference := a frozen copy of the policy as it is now (the runner calls
        this again once ``run.init_from`` has loaded the starting weights)."""
        if self.cfg.kl_coef > 0:
            self.reference = copy.deepcopy(self.policy).eval().requires_grad_(False)

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        if self.reference is not None:  # a resumed run keeps regularising towards the same starting policy
            out["reference"] = {k: v.detach().cpu() for k, v in self.reference.state_dict().items()}
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.reference is None:
            return
        if "reference" not in state:  # written before the reference was saved: do not regularise towards another one
            raise ValueError("it holds no KL reference policy (algo.kl_coef > 0); resume with algo.kl_coef=0, "
                             "or start a new run from it with run.init_from=<this run>")
        self.reference.load_state_dict(state["reference"])

    def rollout_groups(self) -> dict[str, Any]:
        """The ``robo_rl.rollout.groups.GroupCollector`` settings this algorithm trains on."""
        c = self.cfg
        return {"group_size": c.group_size, "min_groups": c.min_groups, "max_rounds": c.max_rounds,
                "max_steps": c.max_episode_steps, "group_return": c.group_return, "group_seeds": c.group_seeds}

    def prepare(self, traj: Trajectories) -> RolloutBatch:
        """Group-relative advantages of the episodes, broadcast to their valid steps."""
        if traj.group is None:
            raise ConfigError("GRPO trains on group rollouts (robo_rl.rollout.groups.GroupCollector), "
                              "not on a fixed-length rollout")
        return self.estimator(traj)

    def _log_probs(self, obs: dict[str, Any], extras: dict[str, Any], policy: Any = None) -> torch.Tensor:
        """(N, K) per-token log-probs, or (N,) per action."""
        if policy is not None:
            return policy.token_log_probs(obs, extras) if self.tokens else policy.evaluate(obs, extras)[0]
        return self.calls("token_log_probs", obs, extras) if self.tokens else self.calls("evaluate", obs, extras)[0]

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        cfg, n = self.cfg, batch.size
        with torch.no_grad():  # the behaviour policy is the current one: nothing was updated since the rollout
            fine = isinstance(self.policy, FineRatios) and self.policy.ratio_unit != "chunk"
            old = self._log_probs(batch.obs, batch.extras) if self.tokens or fine else batch.log_prob
            ref = None if self.reference is None else self._log_probs(batch.obs, batch.extras, self.reference)
        logged = TermMeans()  # self_imitation is absent from minibatches without a positive row
        for idx in minibatch_indices(n, cfg.minibatches, cfg.epochs, self.generator):
            mb = batch.index(idx)
            weights = mb.advantages.clamp_min(0.0)
            imitate = cfg.sil_coef > 0 and bool((weights > 0).any())
            entropy = sil = None
            if imitate and isinstance(self.policy, ScoreAndImitate):  # one prefix pass for both terms
                new, entropy, sil = self.calls("score_and_imitate", mb.obs, mb.extras, weights, self.tokens)
            elif self.tokens:
                new = self._log_probs(mb.obs, mb.extras)
            else:
                new, entropy, _ = self.calls("evaluate", mb.obs, mb.extras)
            loss, terms = grpo_loss(new, old[idx], mb.advantages, cfg.clip_low, cfg.clip_high)
            terms["policy_loss"] = loss.detach()
            if ref is not None:  # k3: exp(ref - new) - (ref - new) - 1 >= 0, an unbiased KL(new || ref)
                d = ref[idx] - new
                kl = (d.exp() - d - 1.0).mean()
                loss = loss + cfg.kl_coef * kl
                terms["kl_ref"] = kl.detach()
            if imitate:
                if sil is None:
                    sil = self.calls("self_imitation_loss", mb.obs, mb.extras, weights)
                loss = loss + cfg.sil_coef * sil
                terms["self_imitation"] = sil.detach()
            if cfg.ent_coef > 0:
                if entropy is None:
                    entropy = self.calls("evaluate", mb.obs, mb.extras)[1]
                entropy = entropy.mean()
                loss = loss - cfg.ent_coef * entropy
                terms["entropy"] = entropy.detach()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_([p for p in self.policy.parameters() if p.requires_grad],
                                                       cfg.max_grad_norm)
            self.optimizer.step()
            logged.add({**terms, "grad_norm": grad_norm, "loss": loss})
        out = logged.means()
        out["advantage_abs_mean"] = float(batch.advantages.abs().mean()) if n else 0.0
        out["transitions"] = float(n)
        self.updates += 1
        return out
