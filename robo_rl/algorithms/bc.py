"""Behaviour cloning / SFT over the ``Policy`` contract: maximize the log-likelihood of expert
actions. The policy turns expert actions into what its ``evaluate`` scores (``extras_for_actions``:
action tokens for a token VLA, the raw action for a Gaussian policy), so this file knows no model.
A policy whose likelihood is intractable (a flow-matching VLA) brings its own ``imitation_loss(obs,
actions, valid)`` instead (its training objective, e.g. the flow-matching loss on action chunks);
then the reported "nll" is that loss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from robo_rl.algorithms.optim import load_optimizer_state
from robo_rl.capabilities import Imitator
from robo_rl.config import check_ranges, ranged
from robo_rl.errors import ConfigError


@dataclass(frozen=True)
class BCConfig:
    """Supervised fine-tuning on demonstrations (offline: no env interaction while training)."""

    name: str = "bc"
    """Registry name of the algorithm."""
    dataset: str | list[str] = ""
    """robo-rl episodes file (``robo-rl demos generate``) or an official LIBERO hdf5 file, or a list of
    episodes files pooled into one dataset (same env, task and modes; disjoint seeds)."""
    lr: float = ranged(1e-4, gt=0)
    """AdamW learning rate. Range: > 0."""
    weight_decay: float = ranged(0.0, ge=0)
    """AdamW weight decay. Range: >= 0."""
    batch_size: int = ranged(32, ge=1)
    """Transitions per gradient step. Range: >= 1."""
    epochs: float = ranged(10.0, gt=0)
    """Passes over the training transitions. Range: > 0."""
    max_grad_norm: float = ranged(1.0, gt=0)
    """Global gradient-norm clip (``clip_grad_norm_``; a negative max would flip the gradient). Range: > 0."""
    val_fraction: float = ranged(0.1, ge=0, lt=1, what="a fraction")
    """Episodes held out to report validation loss. Range: in [0, 1)."""
    only_success: bool = True
    """Train only on episodes that ended in success."""
    max_episodes: int | None = ranged(None, ge=1)
    """Use at most this many episodes (null: all). Range: >= 1."""
    norm_mask: Literal["all", "all_but_last"] = "all"
    """Action dims normalized by dataset quantiles for token policies: all, or all but the gripper
    (OpenVLA's choice for datasets whose gripper action is already in [-1, 1])."""
    log_every: int = ranged(50, ge=1)
    """Gradient steps per metrics row. Range: >= 1."""
    eval_every: int = ranged(500, ge=0)
    """Gradient steps between policy evaluations in the env (0 disables). Range: >= 0."""
    keep_best_val: bool = False
    """Early stopping on the validation NLL (checked every ``log_every`` steps): the saved checkpoint and the
    final evaluation use the weights with the lowest validation NLL, not the last (needs val_fraction > 0;
    holds one copy of the weights in host memory)."""

    image_shift: int = ranged(0, ge=0, unit="pixels")
    """Random-shift augmentation of training images (DrQ / random crop): each image is padded by this
    many edge pixels and cropped back at a random offset, per image and camera (0: off; validation and
    evaluation images are never shifted). Off by default: with one fixed camera pixel position is world
    position, and shifting hurt the small pi0 on PushCube (docs/results/cpu.md).
    Range: >= 0 pixels."""

    def __post_init__(self) -> None:
        check_ranges(self, "algo")
        if not self.dataset:
            raise ConfigError("config key 'algo.dataset' is required for bc: a demonstrations file from 'robo-rl demos generate'")
        if self.keep_best_val and self.val_fraction <= 0:
            raise ConfigError("config key 'algo.keep_best_val' needs held-out episodes: set 'algo.val_fraction' > 0 "
                              "(e.g. 0.1) or keep_best_val: false")


class BC:
    """Negative log-likelihood of expert actions under the policy."""

    Config = BCConfig
    offline = True

    def __init__(self, cfg: BCConfig, policy: Any, generator: torch.Generator | None = None) -> None:
        self.cfg = cfg
        self.policy = policy
        params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.generator = generator

    def loss(self, obs: dict[str, Any], actions: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean NLL, mean entropy) of expert actions (B, A), or chunks (B, H, A) with ``valid`` (B, H),
        given obs (B, ...)."""
        if isinstance(self.policy, Imitator):  # its own objective: a loss, or (loss, entropy)
            out = self.policy.imitation_loss(obs, actions, valid)
            return out if isinstance(out, tuple) else (out, torch.zeros(()))
        extras = self.policy.extras_for_actions(obs, actions)
        log_prob, entropy, _ = self.policy.evaluate(obs, extras)
        return -log_prob.mean(), entropy.mean()

    def update(self, batch: tuple[Any, ...]) -> dict[str, float]:
        """``batch`` = (obs, actions) or (obs, action chunks, valid)."""
        nll, entropy = self.loss(*batch)
        self.optimizer.zero_grad(set_to_none=True)
        nll.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_([p for p in self.policy.parameters() if p.requires_grad],
                                                   self.cfg.max_grad_norm)
        self.optimizer.step()
        return {"nll": float(nll.detach()), "entropy": float(entropy.detach()), "grad_norm": float(grad_norm)}

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_optimizer_state(self.optimizer, state["optimizer"])
