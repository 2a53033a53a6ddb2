"""Denoising samplers for a flow-matching VLA, with exact log-probs for RL (the pi_RL ideas).

Time runs from t = 1 (noise) to 0 (action) in K Euler steps: t_k = 1 - k/K, dt = -1/K, and
``x_{k+1} = x_k + dt * v(x_k, t_k)`` is the deterministic ODE sample (``kind: ode``).

- ``noise`` (Flow-Noise): every step is Gaussian, ``x_{k+1} ~ N(x_k + dt v_k, sigma_k^2)``, with
  sigma_k from a learned noise head on the expert latents and t (bounded to [min_std, max_std]); the
  chunk's log-prob is the sum over the K transitions.
- ``sde`` (Flow-SDE): the ODE turned into the SDE with the same marginals (as Flow-GRPO does for
  rectified flow), noise level a: sigma_t = a * sqrt(t / (1 - t)) (the denominator floored at |dt|),
  mean = x + dt * (v + sigma_t^2 / (2 t) * (x + (1 - t) v)), std = sigma_t * sqrt(|dt|). Hybrid: one
  step per chunk, drawn at random, is stochastic and carries the log-prob; the others are ODE steps.

Log-probs and entropies are sums over the elements where ``mask`` (H, A) is true: the executed chunk
steps and the real action dimensions, never the padding. Shapes: x (B, H, A); path (B, K + 1, H, A)
= x_0 (the initial noise) .. x_K (the action chunk); step (B,) the stochastic step (-1 if none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from robo_rl.config import check_ranges, ranged
from robo_rl.errors import ConfigError
from vla.pi0.model import Pi0Model, Prefix

SamplerKind = Literal["ode", "noise", "sde"]
KINDS = ("ode", "noise", "sde")
UNITS = ("chunk", "action", "element")


@dataclass(frozen=True)
class SamplerConfig:
    """How rollouts sample action chunks."""

    kind: SamplerKind = "sde"
    """ode (deterministic, no log-prob), noise (Flow-Noise) or sde (Flow-SDE, one stochastic step)."""
    noise_level: float = ranged(0.5, ge=0)
    """Flow-SDE noise level a. Range: >= 0."""
    min_std: float = ranged(0.02, gt=0)
    """Flow-Noise: smallest per-step std of the noise head (below ``max_std``). Range: > 0."""
    max_std: float = ranged(0.3, gt=0)
    """Flow-Noise: largest per-step std. Range: > 0."""
    unit: str = "chunk"
    """What one log-prob (one PPO ratio) covers in ``path_log_prob``: "chunk", the sum over the stochastic
    transitions, executed steps and action dims (B,); "action", per executed step (B, E): the mean over
    transitions of the sum over dims; "element", per executed (step, dim) (B, E * A): the mean over
    transitions (RLinf's token-level Flow-Noise ratios)."""

    def __post_init__(self) -> None:
        check_ranges(self, "policy")
        if self.kind not in KINDS:
            raise ConfigError(f"sampler kind {self.kind!r} is unknown; choose one of {', '.join(KINDS)}")
        if self.unit not in UNITS:
            raise ConfigError(f"config key 'policy.ratio_unit' = {self.unit!r}; choose one of {', '.join(UNITS)}")
        if not self.min_std < self.max_std:
            raise ConfigError(f"config keys 'policy.min_std' = {self.min_std} and 'policy.max_std' = "
                              f"{self.max_std}: min_std must be below max_std")


class NoiseHead(nn.Module):
    """Flow-Noise std: (expert latents (B, H, D), t (B,)) -> (B, H, A) in [min_std, max_std].
    ``space`` "std": std = min + (max - min) * sigmoid(u); "logvar" (pi_RL's): the same sigmoid
    interpolates the log-variance, log std^2 = log min^2 + (log max^2 - log min^2) * sigmoid(u), so equal
    steps of u scale the std by equal factors. Both start at sigmoid(0) = 1/2 (u = 0)."""

    def __init__(self, hidden: int, action_dim: int, min_std: float, max_std: float, space: str = "std") -> None:
        super().__init__()
        if space not in ("std", "logvar"):
            raise ConfigError(f"config key 'policy.noise_space' = {space!r}; choose 'std' or 'logvar'")
        self.min_std, self.max_std, self.space = min_std, max_std, space
        self.proj = nn.Linear(hidden + 1, action_dim)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)  # starts at the middle of the range

    def forward(self, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        x = torch.cat([h.float(), t.float()[:, None, None].expand(-1, h.shape[1], 1)], dim=-1)
        w = torch.sigmoid(self.proj(x))
        if self.space == "logvar":
            lo, hi = 2.0 * math.log(self.min_std), 2.0 * math.log(self.max_std)
            return torch.exp(0.5 * (lo + (hi - lo) * w))
        return self.min_std + (self.max_std - self.min_std) * w


@dataclass
class SampleResult:
    actions: torch.Tensor
    """(B, H, A) the final sample x_K (normalized action space, padded)."""
    path: torch.Tensor
    """(B, K + 1, H, A) every x_k."""
    step: torch.Tensor
    """(B,) long: Flow-SDE's stochastic step, -1 otherwise."""
    log_prob: torch.Tensor
    """(B,) log-prob of the path's stochastic transitions (0 for ode)."""
    entropy: torch.Tensor
    """(B,) entropy of those transitions."""
    latents: torch.Tensor | None
    """(B, K, H, D) expert latents per denoising step (for RL^2 steering), when asked for."""


def step_times(k: int, device: torch.device | None = None) -> tuple[torch.Tensor, float]:
    """(t_k for k = 0..K-1, dt)."""
    dt = -1.0 / k
    return 1.0 + dt * torch.arange(k, dtype=torch.float32, device=device), dt


def _sde_mean_std(x: torch.Tensor, v: torch.Tensor, t: torch.Tensor, dt: float, a: float) -> tuple[torch.Tensor, torch.Tensor]:
    tt = t.float()[:, None, None]
    sigma = a * torch.sqrt(tt / (1.0 - tt).clamp_min(abs(dt)))
    mean = x + dt * (v + sigma**2 / (2.0 * tt) * (x + (1.0 - tt) * v))
    return mean, (sigma * math.sqrt(abs(dt))).expand_as(mean)


def _gaussian_elements(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise log N(x; mean, std^2) and entropy, each shaped as ``x``."""
    std = std.float()
    logp = -((x.float() - mean.float()) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    return logp, (0.5 + 0.5 * math.log(2 * math.pi) + torch.log(std)).expand_as(logp)


def _gaussian(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over masked elements of log N(x; mean, std^2) and of the entropy; each (B,)."""
    logp, ent = _gaussian_elements(x, mean, std)
    m = mask.to(logp.dtype)
    return (logp * m).flatten(1).sum(-1), (ent * m).flatten(1).sum(-1)


def reduce_units(logp: torch.Tensor, mask: torch.Tensor, unit: str) -> torch.Tensor:
    """Elementwise log-probs summed over the stochastic transitions, (B, H, A), divided into ``unit``s over
    the masked elements (mask (H, A): executed steps x real dims); n transitions per row give the
    mean for "action" / "element" after the caller divides by n. chunk (B,), action (B, E), element (B, E * A)."""
    m = mask.to(logp.dtype)
    if unit == "chunk":
        return (logp * m).flatten(1).sum(-1)
    steps = m.any(-1) if m.ndim == 2 else m[0].bool().any(-1)
    if unit == "action":
        return (logp * m).sum(-1)[:, steps.bool()]
    flat = (m if m.ndim == 2 else m[0]).bool()
    return logp[:, flat]


def sample(model: Pi0Model, prefix: Prefix, state: torch.Tensor, x0: torch.Tensor, cfg: SamplerConfig,
           mask: torch.Tensor, noise_head: NoiseHead | None = None, generator: torch.Generator | None = None,
           return_latents: bool = False, noise_scale: float = 1.0) -> SampleResult:
    """Denoise x0 (B, H, A) in K = arch.num_steps steps with sampler ``cfg``; mask (H, A) or (B, H, A).
    ``noise_scale`` multiplies the injected Gaussian noise (0: the stochastic steps take their means)."""
    b, k = x0.shape[0], model.arch.num_steps
    ts, dt = step_times(k, x0.device)
    if cfg.kind == "noise" and noise_head is None:
        raise ConfigError("the Flow-Noise sampler needs a noise head")
    step = (torch.randint(0, k, (b,), generator=generator, device=x0.device) if cfg.kind == "sde"
            else torch.full((b,), -1, dtype=torch.long, device=x0.device))
    x, path, lat = x0.float(), [x0.float()], []
    logp = torch.zeros(b, device=x0.device)
    ent = torch.zeros(b, device=x0.device)
    mask = mask.expand_as(x0) if mask.ndim == 2 else mask
    for i in range(k):
        t = ts[i].expand(b)
        v, h = model.velocity(prefix, state, x, t)
        if return_latents:
            lat.append(h)
        ode = x + dt * v
        if cfg.kind == "ode":
            x = ode
        else:
            if cfg.kind == "noise":
                mean, std, rows = ode, noise_head(h, t), torch.ones(b, dtype=torch.bool, device=x.device)
            else:
                mean, std = _sde_mean_std(x, v, t, dt, cfg.noise_level)
                rows = step == i
            z = torch.randn(x.shape, generator=generator, device=x.device) * noise_scale
            nxt = torch.where(rows[:, None, None], mean + std * z, ode)
            if rows.any():
                lp, en = _gaussian(nxt, mean, std, mask)
                logp = logp + torch.where(rows, lp, torch.zeros_like(lp))
                ent = ent + torch.where(rows, en, torch.zeros_like(en))
            x = nxt
        path.append(x)
    return SampleResult(x, torch.stack(path, 1), step, logp, ent, torch.stack(lat, 1) if return_latents else None)


def path_log_prob(model: Pi0Model, prefix: Prefix, state: torch.Tensor, path: torch.Tensor, step: torch.Tensor,
                  cfg: SamplerConfig, mask: torch.Tensor, noise_head: NoiseHead | None = None,
                  per_step: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_prob (B,), entropy (B,)) of a stored path under the current weights, in one batched pass:
    Flow-SDE scores the one stochastic step of each row; Flow-Noise all K steps (the prefix is
    batch-repeated K times, so the K velocities come from a single expert forward). ``per_step``:
    (B, n) per stochastic transition instead (n = 1 for Flow-SDE, K for Flow-Noise), e.g. for OPD."""
    b = path.shape[0]
    mask = mask.expand_as(path[:, 0]) if mask.ndim == 2 else mask
    nxt, mean, std = _stored_kernels(model, prefix, state, path, step, cfg, noise_head)
    n = nxt.shape[0] // b
    lp, en = _gaussian(nxt, mean, std, mask.repeat_interleave(n, 0))
    if per_step:
        return lp.view(b, n), en.view(b, n)
    if cfg.unit != "chunk":  # the mean over the n stochastic transitions of each unit
        elements = _gaussian_elements(nxt, mean, std)[0].view(b, n, *path.shape[2:]).mean(1)
        return reduce_units(elements, mask[0], cfg.unit), en.view(b, n).sum(-1)
    return lp.view(b, n).sum(-1), en.view(b, n).sum(-1)


def _stored_kernels(model: Pi0Model, prefix: Prefix, state: torch.Tensor, path: torch.Tensor, step: torch.Tensor,
                    cfg: SamplerConfig, noise_head: NoiseHead | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_{k+1}, mean, std), each (B * n, H, A) row-major over (B, n), of the n stochastic transitions of each
    stored path under the current weights: Flow-SDE's one (n = 1), Flow-Noise's K (one expert forward over the
    prefix repeated K times)."""
    b, k = path.shape[0], path.shape[1] - 1
    ts, dt = step_times(k, path.device)
    if cfg.kind == "ode":
        raise ConfigError("the ode sampler has no log-probs; PPO needs sampler kind 'noise' or 'sde'")
    if cfg.kind == "sde":
        rows = torch.arange(b, device=path.device)
        x, t = path[rows, step], ts[step]
        v, _ = model.velocity(prefix, state, x, t)
        mean, std = _sde_mean_std(x, v, t, dt, cfg.noise_level)
        return path[rows, step + 1], mean, std
    if noise_head is None:
        raise ConfigError("the Flow-Noise sampler needs a noise head")
    x = path[:, :-1].reshape(b * k, *path.shape[2:])
    t = ts.repeat(b)
    v, h = model.velocity(prefix.repeat(k), state.repeat_interleave(k, 0), x, t)
    return path[:, 1:].reshape(b * k, *path.shape[2:]), x + dt * v, noise_head(h, t)


def path_distributions(model: Pi0Model, prefix: Prefix, state: torch.Tensor, path: torch.Tensor, step: torch.Tensor,
                       cfg: SamplerConfig, mask: torch.Tensor,
                       noise_head: NoiseHead | None = None) -> torch.distributions.Independent:
    """The Gaussian kernel of each stochastic transition of stored paths, given the stored x_k: batch shape
    (B, n) as ``path_log_prob(per_step=True)`` (n = K for Flow-Noise, 1 for Flow-SDE), event (M,) the M
    elements where ``mask`` (H, A) is true (executed steps x real dims). ``log_prob(x_{k+1})`` of it is
    that per-step log-prob; ``kl_divergence`` of two of them is a closed-form per-transition KL."""
    if mask.ndim != 2:
        raise ValueError(f"path_distributions takes one (H, A) mask for the whole batch, got {tuple(mask.shape)}")
    b, keep = path.shape[0], mask.bool()
    _, mean, std = _stored_kernels(model, prefix, state, path, step, cfg, noise_head)
    n = mean.shape[0] // b
    mean, std = mean.float()[:, keep].view(b, n, -1), std.float()[:, keep].view(b, n, -1)
    return torch.distributions.Independent(torch.distributions.Normal(mean, std), 1)
