"""RL^2 latent steering around a frozen pi0-style policy (``robo_rl.algorithms.rl2`` has the math).

``SteeredPi0Policy`` is a ``Policy``: it runs the base VLA's prefix once, predicts failure from the
pooled prefix, and denoises with v = v_vla + g * beta * v_phi(x_t, t, z) where g = 1[p_fail > tau]
per env. Rows with g = 0 follow the base policy's own ODE bit for bit. Only the steering head and
the failure predictor have trainable parameters; the base stays frozen.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from robo_rl.algorithms.rl2 import (
    FailurePredictor,
    MeanShiftHead,
    ShiftHead,
    SteeringConfig,
    VelocityHead,
    advantage_weights,
    awfm_loss,
    compose,
)
from robo_rl.contracts import PolicyOutput
from vla.pi0.policy import Pi0Policy
from vla.pi0.sampling import step_times


class SteeredPi0Policy(nn.Module):
    """A frozen ``Pi0Policy`` plus a latent velocity head and a failure gate."""

    def __init__(self, base: Pi0Policy, cfg: SteeringConfig) -> None:
        super().__init__()
        self.base = base.eval().requires_grad_(False)
        self.cfg = cfg
        arch = base.model.arch
        self.head: nn.Module
        if cfg.head == "mean":
            mask = torch.zeros(arch.chunk_size, arch.max_action_dim)
            mask[: base.exec_steps, : base.action_dim] = 1.0
            self.head = MeanShiftHead(arch.lm_hidden, mask, cfg.hidden)
        elif cfg.baseline:
            self.head = ShiftHead(arch.max_action_dim, arch.expert_hidden, cfg.hidden, cfg.shared_head)
        else:
            self.head = VelocityHead(arch.max_action_dim, arch.expert_hidden, cfg.hidden)
        self.fail = FailurePredictor(arch.lm_hidden, cfg.hidden)
        self.rows_seen = 0  # env rows acted for, and how many of them were steered (g = 1)
        self.rows_steered = 0

    def gate(self, pooled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g (B,) bool, p_fail (B,)) from the pooled prefix."""
        p = torch.sigmoid(self.fail(pooled))
        return p > self.cfg.tau, p

    @torch.no_grad()
    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        base = self.base
        pre, state = base.prefix(obs)
        arch = base.model.arch
        b = state.shape[0]
        shape = (b, arch.chunk_size, arch.max_action_dim)
        x = torch.zeros(shape, device=state.device) if deterministic else torch.randn(shape, device=state.device)
        g, p_fail = self.gate(pre.pooled)
        self.rows_seen += b
        self.rows_steered += int(g.sum())
        ts, dt = step_times(arch.num_steps, state.device)
        mean_head = isinstance(self.head, MeanShiftHead)
        v_const = -self.head.shift(pre.pooled) if mean_head and bool(g.any()) else None
        for i in range(arch.num_steps):
            t = ts[i].expand(b)
            v, z = base.model.velocity(pre, state, x, t)
            v_phi = v_const if mean_head else (self.head(x, t, z) if bool(g.any()) else None)
            x = x + dt * compose(v, v_phi, g, self.cfg.beta)
        return PolicyOutput(actions=base._unnormalize(x[:, : base.exec_steps]), extras={"steered": g, "p_fail": p_fail})

    def steering_loss(self, obs: dict[str, Any], actions: torch.Tensor, advantages: torch.Tensor,
                      valid: torch.Tensor | None = None) -> torch.Tensor:
        """Advantage-weighted flow matching of the composed velocity on logged chunks ``actions``
        (B, T', A) in env units (``valid`` (B, T') marks real steps), advantages (B,). With a
        ``ShiftHead`` both parts are fit on the same samples: h_w weighted, h_1 unweighted."""
        base = self.base
        with torch.no_grad():
            pre, state = base.prefix(obs)
            target, mask = (part.to(state.device) for part in self.normalized_chunks(actions, valid))
            t = torch.rand(target.shape[0], device=state.device)
            noise = torch.randn_like(target)
            x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * target
            v_vla, z = base.model.velocity(pre, state, x_t, t)
        w = advantage_weights(torch.as_tensor(advantages, device=state.device), self.cfg.temperature, self.cfg.max_weight)
        if isinstance(self.head, ShiftHead):
            return (awfm_loss(v_vla, self.head.weighted(x_t, t, z), noise, target, w, mask, self.cfg.beta)
                    + awfm_loss(v_vla, self.head.reference(x_t, t, z), noise, target, torch.ones_like(w), mask,
                                self.cfg.beta))
        return awfm_loss(v_vla, self.head(x_t, t, z), noise, target, w, mask, self.cfg.beta)

    def normalized_chunks(self, actions: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logged chunks (B, T', A) in env units -> (normalized chunks, mask), both (B, T, A_max), padded
        with zeros; ``valid`` (B, T') marks real steps."""
        base, arch = self.base, self.base.model.arch
        a = torch.as_tensor(actions, dtype=torch.float32)
        target = torch.zeros(a.shape[0], arch.chunk_size, arch.max_action_dim)
        target[:, : a.shape[1]] = base.normalize_actions(a)
        mask = torch.zeros_like(target)
        rows = torch.ones(a.shape[:2]) if valid is None else torch.as_tensor(valid, dtype=torch.float32)
        mask[:, : a.shape[1], : base.action_dim] = rows[..., None]
        return target, mask

    def reset(self, env_ids: Any = None) -> None:
        """Stateless: nothing to clear."""
