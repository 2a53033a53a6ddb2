"""RL^2 latent steering around a frozen pi0-style policy (``robo_rl.algorithms.rl2`` has the math).

``SteeredPi0Policy`` is a ``Policy``: it runs the base VLA's prefix once, predicts failure from the
pooled prefix, and denoises with v = v_vla + g * beta * v_phi(x_t, t, z) where g = 1[p_fail > tau]
per env, or (``gate="conformal"``) g = 1 from the first call whose running failure score crosses the
conformal band at that call's index until the env's episode ends (``reset``). Rows with g = 0 follow the base policy's own ODE bit for bit. Only the steering head and
the failure predictor have trainable parameters; the base stays frozen.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from robo_rl.algorithms.conformal import ConformalBands
from robo_rl.algorithms.rl2 import (
    ChunkScorer,
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
from vla.pi0.sampling import SamplerConfig, path_log_prob, sample, step_times


class _Composed:
    """A stand-in for the base's ``Pi0Model`` in ``sample`` / ``path_log_prob`` whose velocity is the
    composed field v_vla + g * beta * v_phi (rows with g = 0: the base's own); gradient reaches the head
    only through gated rows."""

    def __init__(self, steered: SteeredPi0Policy, gate: torch.Tensor) -> None:
        self.arch, self._steered, self._gate = steered.base.model.arch, steered, gate

    def velocity(self, prefix: Any, state: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self._steered
        with torch.no_grad():
            v, z = s.base.model.velocity(prefix, state, x, t)
        gate = self._gate.repeat_interleave(x.shape[0] // self._gate.shape[0], 0)
        if isinstance(s.head, MeanShiftHead):
            v_phi = -s.head.shift(prefix.pooled)
        else:
            v_phi = s.head(x, t, z)
        return compose(v, v_phi, gate, s.cfg.beta), z


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
        self.scorer = ChunkScorer(arch.lm_hidden, base.exec_steps * base.action_dim, cfg.hidden)
        self.samples = 1  # composed samples per steered call; > 1: the scorer picks the best (test-time scaling)
        self.bands: ConformalBands | None = None  # set by steer fit / load_steered with gate="conformal"
        self._opened = torch.zeros(0, dtype=torch.bool)  # per env: the gate opened in its current episode
        self.episode_steered: list[list[bool]] = []  # per env, for each ended episode: did the gate open
        self._score_sum = torch.zeros(0)  # per env: running sum of failure logits, calls so far, gate latched
        self._calls = torch.zeros(0, dtype=torch.long)
        self._latched = torch.zeros(0, dtype=torch.bool)
        self.rows_seen = 0  # env rows acted for, and how many of them were steered (g = 1)
        self.rows_steered = 0
        self.monitor = False  # True: the gate runs and is recorded, the actions stay the base's (steer eval --mode off)
        self._max_exc = torch.zeros(0, dtype=torch.float64)  # per env: the conformal score's largest band excursion
        self.episode_excursion: list[list[float]] = []  # per env, for each ended episode (conformal gate only)

    def gate(self, pooled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g (B,) bool, p_fail (B,)) from the pooled prefix (the conformal gate also advances each env's
        episode state: call it once per call)."""
        logits = self.fail(pooled)
        p = torch.sigmoid(logits)
        if self.cfg.gate != "conformal":
            return p > self.cfg.tau, p
        if self.bands is None:
            raise RuntimeError("gate 'conformal' without bands: fit them with 'robo-rl steer fit --gate conformal'")
        b = logits.shape[0]
        if self._calls.shape[0] != b:
            self.reset()
            self._score_sum, self._calls = torch.zeros(b, dtype=torch.float64), torch.zeros(b, dtype=torch.long)
            self._latched, self._max_exc = torch.zeros(b, dtype=torch.bool), torch.full((b,), -math.inf, dtype=torch.float64)
            self.episode_excursion = [[] for _ in range(b)]
        self._score_sum += logits.detach().double().cpu()
        running = (self._score_sum / (self._calls + 1)).numpy()
        exc = torch.from_numpy(self.bands.excursion(running, self._calls.numpy()))
        fired = exc > self.bands.lam
        self._max_exc = torch.maximum(self._max_exc, exc)
        self._calls += 1
        self._latched |= fired
        return self._latched.clone().to(p.device), p

    @torch.no_grad()
    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        base = self.base
        pre, state = base.prefix(obs)
        arch = base.model.arch
        b = state.shape[0]
        shape = (b, arch.chunk_size, arch.max_action_dim)
        x = torch.zeros(shape, device=state.device) if deterministic else torch.randn(shape, device=state.device)
        g, p_fail = self.gate(pre.pooled)
        if self._opened.shape[0] != b:
            self._opened = torch.zeros(b, dtype=torch.bool)
            self.episode_steered = [[] for _ in range(b)]
        self._opened |= g.cpu()  # monitored too: where the gate would have opened
        if self.monitor:
            g = torch.zeros_like(g)
        self.rows_seen += b
        self.rows_steered += int(g.sum())
        x = self._denoise(pre, state, x, g)
        if self.samples > 1 and bool(g.any()):
            x = self._best_of(pre, state, x, g)
        return PolicyOutput(actions=base._unnormalize(x[:, : base.exec_steps]), extras={"steered": g, "p_fail": p_fail})

    def _denoise(self, pre: Any, state: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The composed ODE from x_0 (B, H, A) to the normalized chunk (B, H, A); rows with g = 0 are the base's."""
        arch = self.base.model.arch
        ts, dt = step_times(arch.num_steps, x.device)
        mean_head = isinstance(self.head, MeanShiftHead)
        v_const = -self.head.shift(pre.pooled) if mean_head and bool(g.any()) else None
        for i in range(arch.num_steps):
            t = ts[i].expand(x.shape[0])
            v, z = self.base.model.velocity(pre, state, x, t)
            v_phi = v_const if mean_head else (self.head(x, t, z) if bool(g.any()) else None)
            x = x + dt * compose(v, v_phi, g, self.cfg.beta)
        return x

    def _best_of(self, pre: Any, state: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Test-time scaling: ``samples`` - 1 more composed chunks from fresh Gaussian x_0 for every row, the
        scorer's best of them and ``x`` (B, H, A) kept where g = 1; rows with g = 0 keep ``x``."""
        b, k, base = x.shape[0], self.samples - 1, self.base
        more = self._denoise(pre.repeat(k), state.repeat_interleave(k, 0), torch.randn(b * k, *x.shape[1:], device=x.device),
                             g.repeat_interleave(k, 0))
        cand = torch.cat([x[:, None], more.view(b, k, *x.shape[1:])], 1)  # (B, N, H, A)
        feats = pre.pooled.float().repeat_interleave(k + 1, 0)
        scores = self.scorer(feats, cand[:, :, : base.exec_steps, : base.action_dim].flatten(0, 1)).view(b, k + 1)
        best = cand[torch.arange(b), scores.argmax(1)]
        return torch.where(g[:, None, None], best, x)

    @torch.no_grad()
    def online_act(self, obs: dict[str, Any], noise_level: float = 0.5) -> PolicyOutput:
        """A Flow-SDE sample of the composed field (one stochastic denoising step per chunk, noise level
        ``noise_level``) with its log-prob; ``extras`` hold what ``online_log_prob`` re-scores (the path,
        its stochastic step, the gate, the prompt)."""
        base = self.base
        prompt = base.prompts(obs, int(torch.as_tensor(obs["rgb"]).shape[0]))
        pre, state = base.prefix(obs, prompt)
        g, p_fail = self.gate(pre.pooled)
        arch = base.model.arch
        x0 = torch.randn(state.shape[0], arch.chunk_size, arch.max_action_dim, device=state.device)
        res = sample(_Composed(self, g), pre, state, x0, SamplerConfig("sde", noise_level), base.log_prob_mask())
        self.rows_seen += int(g.numel())
        self.rows_steered += int(g.sum())
        extras = {"path": res.path, "step": res.step, "gate": g, "prompt_ids": prompt[0], "prompt_mask": prompt[1]}
        return PolicyOutput(actions=base._unnormalize(res.actions[:, : base.exec_steps]), log_prob=res.log_prob,
                            extras={**extras, "steered": g, "p_fail": p_fail})

    def online_log_prob(self, obs: dict[str, Any], extras: dict[str, Any], noise_level: float = 0.5) -> torch.Tensor:
        """(B,) log-prob of stored ``online_act`` samples under the current head (differentiable in the
        head's parameters only; rows whose gate was closed do not depend on them)."""
        base = self.base
        with torch.no_grad():
            pre, state = base.prefix(obs, (extras["prompt_ids"], extras["prompt_mask"]))
        lp, _ = path_log_prob(_Composed(self, extras["gate"].bool()), pre, state, extras["path"], extras["step"],
                              SamplerConfig("sde", noise_level), base.log_prob_mask())
        return lp

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
        """Clear the conformal gate's episode state of ``env_ids`` (None: every env); the tau gate is stateless."""
        if env_ids is None:
            self._score_sum, self._calls = torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.long)
            self._latched, self._opened = torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.bool)
            self._max_exc = torch.zeros(0, dtype=torch.float64)
            self.episode_steered, self.episode_excursion = [], []
            return
        ids = torch.as_tensor(env_ids, dtype=torch.long)
        for i in ids.tolist():
            if i < len(self.episode_steered):
                self.episode_steered[i].append(bool(self._opened[i]))
                self._opened[i] = False
        for i in ids.tolist():
            if i < len(self.episode_excursion) and i < self._max_exc.shape[0]:
                self.episode_excursion[i].append(float(self._max_exc[i]))
        if self._calls.numel() and ids.numel():
            self._score_sum[ids], self._calls[ids], self._latched[ids] = 0.0, 0, False
            self._max_exc[ids] = -math.inf
