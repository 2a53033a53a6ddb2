"""RL^2 latent steering for flow VLAs: the math (no I/O, no model code).

A lightweight velocity policy v_phi reads the frozen VLA's action-expert latents z and is composed
with the VLA's own flow velocity at every denoising step, only where failure is predicted:

    v = v_vla(x_t, t, o) + g(o) * beta * v_phi(x_t, t, z),     g(o) = 1[p_fail(o) > tau]

With g = 0 the output is the frozen VLA's exactly (rows with g = 0 never see v_phi). v_phi is fit
offline from logged rollouts by advantage-weighted flow matching: for a logged (normalized) action
chunk a with advantage A, t ~ U(0, 1), noise n, x_t = t n + (1 - t) a,

    L(phi) = E[ w(A) * | v_vla(x_t, t) + beta * v_phi(x_t, t, z) - (n - a) |^2 ],  w = min(exp(A / T), w_max)

(the frozen v_vla and z computed at the same x_t, t), so chunks that did better than expected are the
ones the composed flow learns to generate.

With ``baseline`` (the default) v_phi = h_w - h_1: a weighted fit h_w and an unweighted fit h_1 of the
same samples (one network with a weighted/unweighted flag input when ``shared_head``), so the composed
field keeps v_vla and adds only the difference the advantage weighting makes. The advantage is the
return-to-go minus a fitted value V(o) (``advantage="value"``), GAE(lambda) on that value (``"gae"``) or
the standardized return-to-go (``"return"``); the return is the sparse success return by default
(``returns="success"``). Why these defaults: docs/guides/steering.md.

The failure predictor p_fail is a classifier on the prefix features trained on the same logs (label:
the episode failed); its AUROC is reported.
Shapes: x (B, H, A); t (B,); z (B, H, D); features (B, F).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from robo_rl.algorithms.advantages import gae
from robo_rl.config import check_ranges, ranged


@dataclass(frozen=True)
class SteeringConfig:
    """RL^2 steering hyper-parameters."""

    beta: float = ranged(1.0, gt=0)
    """Weight of v_phi in the composed velocity. Range: > 0."""
    tau: float = ranged(0.5)
    """Steer only where p_fail > tau (below 0: every call; 1 or more: none). Range: any finite number."""
    hidden: int = ranged(128, ge=1)
    """Hidden width of v_phi and of the failure predictor. Range: >= 1."""
    temperature: float = ranged(1.0, gt=0)
    """Advantage temperature T of the weights w = exp(A / T). Range: > 0."""
    max_weight: float = ranged(20.0, gt=0)
    """Clip of the advantage weights. Range: > 0."""
    baseline: bool = True
    """Steer with the advantage shift only: v_phi = h_w - h_1 (see the module docstring)."""
    advantage: str = "value"
    """"value": return-to-go minus a fitted V(o); "gae": GAE(gae_lambda) on that V; "return": the
    standardized return-to-go."""
    gae_lambda: float = ranged(0.9, ge=0, le=1)
    """GAE lambda of ``advantage="gae"`` (1 = the "value" advantage, 0 = one-step TD). Range: in [0, 1]."""
    shared_head: bool = True
    """With ``baseline``: h_w and h_1 are one network with a weighted/unweighted flag (False: two nets)."""
    returns: str = "success"
    """What the advantages rank: "success", the sparse return 1[episode succeeded] at every call
    (``task_returns``); "dense", the logged return-to-go of the env's shaped reward. Where an episode ends on
    success (our ManiSkill and LIBERO tasks), a dense return-to-go ranks success *below* failure: a failing
    episode keeps collecting shaped reward until its time limit (measured on a PushCube log: the dense
    advantage correlated -0.52 with success)."""
    gate: str = "tau"
    """"tau": steer a call where p_fail > tau; "conformal": steer from the first call where the episode's
    running failure score crosses its time-indexed conformal band (``robo_rl.algorithms.conformal``; the
    bands are fit by ``steer fit --gate conformal --alpha A``) until the episode ends."""
    head: str = "flow"
    """"flow": v_phi(x_t, t, z) on the action expert's latents, fit by (advantage-shift) flow matching;
    "mean": the advantage shift of the chunk's mean on the pooled prefix, v_phi = -(m_w - m_1) at every step
    (``MeanShiftHead``)."""

    def __post_init__(self) -> None:
        if self.advantage not in ("value", "gae", "return"):
            raise ValueError(f"SteeringConfig.advantage={self.advantage!r}; choose 'value', 'gae' or 'return'")
        if self.returns not in ("dense", "success"):
            raise ValueError(f"SteeringConfig.returns={self.returns!r}; choose 'dense' or 'success'")
        if self.gate not in ("tau", "conformal"):
            raise ValueError(f"SteeringConfig.gate={self.gate!r}; choose 'tau' or 'conformal'")
        if self.head not in ("flow", "mean"):
            raise ValueError(f"SteeringConfig.head={self.head!r}; choose 'flow' or 'mean'")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"SteeringConfig.gae_lambda={self.gae_lambda}: GAE lambda is in [0, 1]")
        if not self.temperature > 0:
            raise ValueError(f"SteeringConfig.temperature={self.temperature}: the advantage temperature must be > 0")
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise ValueError(f"SteeringConfig.beta={self.beta}: the steering scale must be a finite number > 0")
        check_ranges(self, "steering")


class VelocityHead(nn.Module):
    """v_phi(x_t, t, z): per action token, an MLP on [x_t token, z token, t] -> (B, H, A). The output
    layer starts at zero, so an untrained head leaves the VLA unchanged."""

    def __init__(self, action_dim: int, latent_dim: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(action_dim + latent_dim + 1, hidden), nn.SiLU(), nn.Linear(hidden, hidden),
                                 nn.SiLU(), nn.Linear(hidden, action_dim))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        tt = t.float()[:, None, None].expand(-1, x.shape[1], 1)
        return self.net(torch.cat([x.float(), z.float(), tt], dim=-1))


class ShiftHead(nn.Module):
    """v_phi = h_w - h_1 (advantage shift only): h_w is fit with the advantage weights, h_1 without; both
    start at zero, so an untrained head leaves the VLA unchanged. ``shared``: one ``VelocityHead`` reads a
    flag (+1 = weighted, -1 = reference) as one more latent channel, its input weights starting at zero:
    the two losses are then mirror images in the flag, so with equal weights the flag's weights get zero
    gradient and h_w = h_1 exactly; only the weighting moves them apart. ``shared=False``: two heads."""

    def __init__(self, action_dim: int, latent_dim: int, hidden: int, shared: bool = True) -> None:
        super().__init__()
        self.shared = shared
        if shared:
            self.cond = VelocityHead(action_dim, latent_dim + 1, hidden)
            with torch.no_grad():
                self.cond.net[0].weight[:, action_dim + latent_dim].zero_()  # the flag's column (x, z, flag, t)
        else:
            self.h_weighted = VelocityHead(action_dim, latent_dim, hidden)
            self.h_reference = VelocityHead(action_dim, latent_dim, hidden)

    def _flagged(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor, flag: float) -> torch.Tensor:
        return self.cond(x, t, torch.cat([z.float(), torch.full_like(z[..., :1], flag, dtype=torch.float32)], -1))

    def weighted(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """h_w (B, H, A)."""
        return self._flagged(x, t, z, 1.0) if self.shared else self.h_weighted(x, t, z)

    def reference(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """h_1 (B, H, A)."""
        return self._flagged(x, t, z, -1.0) if self.shared else self.h_reference(x, t, z)

    def load_state_dict(self, state: Any, strict: bool = True, assign: bool = False) -> Any:
        # heads saved before the shared head named the two nets "weighted." / "reference."
        state = {("h_" + k) if k.startswith(("weighted.", "reference.")) else k: v for k, v in state.items()}
        return super().load_state_dict(state, strict=strict, assign=assign)

    def forward(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.weighted(x, t, z) - self.reference(x, t, z)


class MeanShiftHead(nn.Module):
    """The "mean" steering head: advantage-weighted regression of the logged chunk's mean, m_w(f), and the
    plain regression m_1(f), one MLP on the pooled prefix f (B, F) with a +1 / -1 flag input whose weights
    start at zero (as ``ShiftHead``: equal weights leave m_w = m_1 exactly). Its velocity is constant over
    the denoising steps, v_phi = -(m_w - m_1) (B, H, A), so the ODE's Euler steps (dt summing to -1) add
    +beta * (m_w - m_1) to the chunk, before the frozen field's response. Regressing the clean chunk has
    none of flow matching's noise-target variance, which buried the shift in the velocity head's fit.
    ``mask`` (H, A) keeps the executed steps' real action dims (the rest stays exactly 0)."""

    def __init__(self, features: int, mask: torch.Tensor, hidden: int) -> None:
        super().__init__()
        self.register_buffer("mask", mask.float(), persistent=False)
        t, a = mask.shape
        self.net = nn.Sequential(nn.Linear(features + 1, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, t * a))
        with torch.no_grad():
            self.net[0].weight[:, features].zero_()  # the flag's column

    def mean(self, f: torch.Tensor, flag: float) -> torch.Tensor:
        """m_w (flag +1) or m_1 (flag -1): (B, H, A) predicted normalized chunk."""
        x = torch.cat([f.float(), torch.full_like(f[:, :1], flag, dtype=torch.float32)], -1)
        return self.net(x).view(f.shape[0], *self.mask.shape) * self.mask

    def shift(self, f: torch.Tensor) -> torch.Tensor:
        """m_w - m_1 (B, H, A)."""
        return self.mean(f, 1.0) - self.mean(f, -1.0)

    def loss(self, f: torch.Tensor, actions: torch.Tensor, weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Weighted MSE of m_w plus plain MSE of m_1 to the normalized chunks ``actions`` (B, H, A);
        ``valid`` (B, H, A) marks real elements."""
        def mse(pred: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            per_row = ((pred - actions) ** 2 * valid).flatten(1).sum(-1) / valid.flatten(1).sum(-1).clamp_min(1.0)
            return (w * per_row).sum() / w.sum().clamp_min(1e-8)
        return mse(self.mean(f, 1.0), weights) + mse(self.mean(f, -1.0), torch.ones_like(weights))


class FailurePredictor(nn.Module):
    """p_fail(o) from prefix features (B, F) -> (B,) logits."""

    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.SiLU(), nn.Linear(hidden, 1))

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.net(f.float()).squeeze(-1)


class ChunkScorer(nn.Module):
    """The test-time verifier: logit of the episode's success from the pooled prefix f (B, F) and a
    normalized executed chunk c (B, E, A) -> (B,), fit on logged calls (BCE on success). Used to pick the
    best of N composed samples where the gate is open."""

    def __init__(self, features: int, chunk: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features + chunk, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, f: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([f.float(), c.flatten(1).float()], -1)).squeeze(-1)


class ValueBaseline(FailurePredictor):
    """V(o) from prefix features (B, F) -> (B,): regression of the (standardized) return-to-go, the
    baseline of the advantages the steering head is weighted by."""


def compose(v_vla: torch.Tensor, v_phi: torch.Tensor | None, gate: torch.Tensor, beta: float) -> torch.Tensor:
    """v_vla + g * beta * v_phi per row; rows with g = 0 are v_vla itself, bit for bit."""
    if v_phi is None or not bool(gate.any()):
        return v_vla
    return torch.where(gate[:, None, None], v_vla + beta * v_phi.to(v_vla.dtype), v_vla)


def advantage_weights(advantages: torch.Tensor, temperature: float, max_weight: float) -> torch.Tensor:
    """(B,) w = min(exp(A / T), w_max), detached."""
    return torch.exp(advantages.detach().float() / temperature).clamp(max=max_weight)


def awfm_loss(v_vla: torch.Tensor, v_phi: torch.Tensor, noise: torch.Tensor, actions: torch.Tensor,
              weights: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """Advantage-weighted flow matching of the composed velocity; ``mask`` (B, H, A) keeps real
    elements. v_vla is treated as a constant (the VLA is frozen)."""
    err = (v_vla.detach() + beta * v_phi - (noise - actions)) ** 2 * mask
    per_row = err.flatten(1).sum(-1) / mask.flatten(1).sum(-1).clamp_min(1.0)
    return (weights * per_row).sum() / weights.sum().clamp_min(1e-8)


def task_returns(rtg: torch.Tensor, failed: torch.Tensor, kind: str) -> torch.Tensor:
    """(N,) the returns-to-go the advantages rank: the logged dense ``rtg`` (N,) as is ("dense"), or the sparse
    success return 1 - ``failed`` (N,) of each call's episode ("success"; its per-call reward is 1 at the
    episode's last call, 0 before, as ``episode_gae`` reads it)."""
    if kind == "dense":
        return rtg.float()
    if kind == "success":
        return 1.0 - failed.float()
    raise ValueError(f"returns={kind!r}; choose 'dense' or 'success'")


def episode_gae(rtg: torch.Tensor, values: torch.Tensor, episode: torch.Tensor, lam: float) -> torch.Tensor:
    """GAE(lam) advantages (N,) of logged calls from their undiscounted return-to-go (N,) and V(o) (N,) in
    the same units; ``episode`` (N,) ids, each episode's rows in time order. The reward of a call is
    rtg_t - rtg_{t+1} (its last call: rtg), and an episode's end is terminal (V = 0 after it), so lam = 1
    gives rtg - V exactly."""
    adv = torch.empty_like(values)
    for e in torch.unique(episode):
        rows = torch.nonzero(episode == e).flatten()
        g, v = rtg[rows].float(), values[rows].float()
        rew = g - torch.cat([g[1:], g.new_zeros(1)])
        nxt = torch.cat([v[1:], v.new_zeros(1)])
        end = torch.zeros(len(rows), 1, dtype=torch.bool)
        end[-1] = True
        a, _ = gae(rew[:, None], v[:, None], nxt[:, None], end, torch.zeros_like(end), 1.0, lam)
        adv[rows] = a[:, 0].to(adv.dtype)
    return adv


def youden_threshold(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """The gate threshold tau maximizing TPR - FPR of ``probs > tau`` for binary ``labels`` (nan if one
    class): the calibrated "predicted to fail" cut."""
    p, y = probs.detach().float().flatten(), labels.detach().bool().flatten()
    if y.all() or not y.any():
        return float("nan")
    cuts = torch.cat([p.unique().sort().values, p.new_tensor([-1.0])])  # steer where p > cut
    pred = p[None, :] > cuts[:, None]
    j = (pred & y).sum(1) / y.sum() - (pred & ~y).sum(1) / (~y).sum()
    return float(cuts[int(j.argmax())])


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels`` (ties count half); nan if one class."""
    s, y = scores.detach().float().flatten(), labels.detach().bool().flatten()
    pos, neg = s[y], s[~y]
    if pos.numel() == 0 or neg.numel() == 0:
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).float().sum()
    ties = (pos[:, None] == neg[None, :]).float().sum()
    return float((greater + 0.5 * ties) / (pos.numel() * neg.numel()))
