"""pi0-style flow-matching VLA behind the ``Policy`` contract.

Input: ``obs["rgb"]`` (B, V, H, W, 3) uint8 (the configured cameras, each exactly the model's image
size; other sizes or dtypes are errors), ``obs["state"]`` (B, S) float32 (mean/std-normalized, zero-
padded to max_state_dim), ``obs["instruction"]`` list[str]. Output ``actions`` (B, E, A): the first
E = ``exec_steps`` actions of the sampled chunk, un-normalized to env units (A = the env's action
dim, the rest of the model's max_action_dim is padding). ``extras``: ``path`` (B, K + 1, H, A_max),
``step`` (B,) and the prompt ids/mask (B, max_prompt_tokens), so ``evaluate`` re-scores exactly the
sampled transitions; ``log_prob`` covers the executed steps and the real action dims only. The value head reads the pooled VLM prefix.
``act(deterministic=True)`` runs the ODE from x_0 = 0 (reproducible evaluation).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from robo_rl.config import check_ranges, ranged
from robo_rl.contracts import ArraySpec, PolicyOutput
from robo_rl.errors import ConfigError
from vla.openvla.text import ByteTokenizer, TextTokenizer, batch_instructions, check_prompt
from vla.pi0.model import ARCH_PRESETS, Pi0Arch, Pi0Model, Prefix
from vla.pi0.sampling import NoiseHead, SamplerConfig, path_distributions, path_log_prob, sample

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Pi0PolicyConfig:
    """pi0-style policy."""

    name: str = "pi0"
    """Registry name of the policy."""
    arch: str = "tiny"
    """Architecture preset for a random-init model (used when ``checkpoint`` is null)."""
    checkpoint: str | None = None
    """Local directory: transformers PI0, openpi or LeRobot pi0 layout, or one written by robo-rl."""
    norm_asset_id: str | None = None
    """openpi checkpoints: which ``assets/<asset_id>/norm_stats.json`` to use (needed when there are several)."""
    cameras: tuple[int, ...] = ranged((0,), ge=0)
    """Which cameras of ``obs['rgb']`` (V axis) the model sees, in its camera order (at least one).
    Range: each >= 0."""
    exec_steps: int | None = ranged(None, ge=1)
    """Actions executed per chunk (null: the whole chunk). Range: >= 1."""
    sampler: Literal["ode", "noise", "sde"] = "sde"
    """Rollout sampler: sde (Flow-SDE), noise (Flow-Noise) or ode (no log-probs: evaluation/SFT only)."""
    noise_level: float = ranged(0.5, ge=0)
    """Flow-SDE noise level a (> 0 with sampler sde). Range: >= 0."""
    min_std: float = ranged(0.02, gt=0)
    """Flow-Noise noise-head std lower bound (below ``max_std``). Range: > 0."""
    max_std: float = ranged(0.3, gt=0)
    """Flow-Noise noise-head std upper bound. Range: > 0."""
    ratio_unit: Literal["chunk", "action", "element"] = "chunk"
    """What one PPO ratio covers (``evaluate``'s log-prob): the whole chunk (B,), each executed action
    (B, E) or each executed action element (B, E * A); the finer units average over the denoising
    transitions (RLinf's token-level Flow-Noise ratios), and PPO recomputes their old log-probs."""
    noise_space: Literal["std", "logvar"] = "std"
    """Flow-Noise noise head: interpolate the std linearly between the bounds, or the log-variance
    (pi_RL's parametrisation, with bounds [0.08, 0.16] in its configs)."""
    default_instruction: str = "complete the task"
    """Instruction used when the observation carries none."""
    use_state: bool = True
    """Feed the proprioceptive state to the action expert (false: zeros in its place, the policy acts from
    images and instruction alone, as OpenVLA does on LIBERO). A state beside a weak vision tower is a
    shortcut: the expert can fit the demonstrations from the state's phase cues and never learn where the
    goal is in the image. Checkpoints record it; loading one trained the other way is an error."""
    state_clip: float | None = ranged(None, gt=0)
    """Clip the normalized state to +-this many standard deviations (null: no clip). A state far outside
    the demonstrations (an end-effector orientation the expert never held) otherwise enters the model
    tens of standard deviations out. Range: > 0."""
    max_prompt_tokens: int = ranged(48, ge=1)
    """Prompt budget (pi0: 48); a longer instruction is an error, never truncated. Range: >= 1."""
    value_hidden: int = ranged(256, ge=1)
    """Hidden width of the value head on the pooled prefix. Range: >= 1."""
    freeze_vision: bool = False
    """Keep the SigLIP tower fixed."""
    require_norm_stats: bool = True
    """A checkpoint without normalization statistics is an error (false: start from identity, e.g.
    when SFT will fit them from the demonstrations)."""

    def __post_init__(self) -> None:
        check_ranges(self, "policy")
        if self.checkpoint is None and self.arch not in ARCH_PRESETS:
            raise ConfigError(f"config key 'policy.arch' = {self.arch!r} is not a preset; known: {', '.join(ARCH_PRESETS)}")
        if not self.cameras:
            raise ConfigError("config key 'policy.cameras' = []: list at least one camera index (e.g. [0])")
        SamplerConfig(self.sampler, self.noise_level, self.min_std, self.max_std, self.ratio_unit)  # validates
        if self.sampler == "sde" and self.noise_level == 0:
            raise ConfigError("config key 'policy.noise_level' = 0 with sampler sde has zero std, so no "
                              "log-probability for PPO; use noise_level > 0 (e.g. 0.5), or sampler ode for evaluation")


def _state_use_error(source: str, trained_with: bool) -> str:
    return (f"{source} was trained {'with' if trained_with else 'without'} the state but the config says "
            f"policy.use_state: {str(not trained_with).lower()}; set policy.use_state: {str(trained_with).lower()}")


def _check_state_use(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Load pre-hook: state dicts saved before ``uses_state`` existed were trained with the state; one
    trained the other way than the policy is configured is refused (its inputs would mean something else)."""
    key = prefix + "uses_state"
    trained_with = bool(float(state_dict[key])) if key in state_dict else True
    state_dict[key] = torch.tensor(float(trained_with))
    if trained_with != module.cfg.use_state:
        raise ConfigError(_state_use_error("the pi0 weights being loaded", trained_with))


class Pi0Policy(nn.Module):
    """``Policy`` over a ``Pi0Model``; see the module docstring for shapes."""

    Config = Pi0PolicyConfig

    def __init__(self, cfg: Pi0PolicyConfig, obs_spec: dict[str, ArraySpec] | None = None,
                 action_spec: ArraySpec | None = None, model: Pi0Model | None = None,
                 text_tokenizer: TextTokenizer | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        if model is None:
            if cfg.checkpoint is not None:
                from vla.pi0.checkpoint import load_pretrained

                loaded = load_pretrained(cfg.checkpoint, asset_id=cfg.norm_asset_id)
                model, text_tokenizer = loaded.model, loaded.text_tokenizer
                norm, heads = loaded.norm, loaded.heads
                if loaded.use_state is not None and loaded.use_state != cfg.use_state:
                    raise ConfigError(_state_use_error(f"pi0 checkpoint '{cfg.checkpoint}'", loaded.use_state))
                if norm is None and cfg.require_norm_stats:
                    raise ConfigError(f"pi0 checkpoint '{cfg.checkpoint}' carries no normalization statistics (state/action "
                                      "mean and std); its actions would come out in normalized units. Use a checkpoint "
                                      "with them, or set policy.require_norm_stats: false when SFT fits them from demos")
            else:
                model, norm, heads = Pi0Model(ARCH_PRESETS[cfg.arch]), None, None
        else:
            norm, heads = None, None
        self.model = model
        arch: Pi0Arch = model.arch
        self.text = text_tokenizer or ByteTokenizer()
        self.sampler = SamplerConfig(cfg.sampler, cfg.noise_level, cfg.min_std, cfg.max_std, cfg.ratio_unit)
        self.ratio_unit = cfg.ratio_unit  # robo_rl.contracts.FineRatios: PPO recomputes per-unit old log-probs
        self.exec_steps = cfg.exec_steps or arch.chunk_size
        if self.exec_steps > arch.chunk_size:
            raise ConfigError(f"policy.exec_steps = {self.exec_steps} exceeds the model's chunk of {arch.chunk_size}")
        self.action_dim = arch.max_action_dim if action_spec is None else int(action_spec.shape[-1])
        if self.action_dim > arch.max_action_dim:
            raise ConfigError(f"the env takes {self.action_dim}-D actions but the pi0 model has max_action_dim "
                              f"{arch.max_action_dim} (choose a matching controller or checkpoint)")
        self.state_dim = 0
        if obs_spec is not None:
            if "rgb" not in obs_spec:
                raise ConfigError(f"policy 'pi0' needs an 'rgb' observation; the env gives {sorted(obs_spec)} (set env.obs_mode: rgb)")
            v, h, w = obs_spec["rgb"].shape[:3]
            if max(cfg.cameras) >= v:
                raise ConfigError(f"policy.cameras = {list(cfg.cameras)} but the env has {v} camera(s)")
            if (h, w) != (arch.image_size, arch.image_size):
                raise ConfigError(f"the env renders {h}x{w} images but the pi0 model takes {arch.image_size}x"
                                  f"{arch.image_size} (set env.image_size: {arch.image_size})")
            if "state" in obs_spec:
                self.state_dim = int(obs_spec["state"].shape[-1])
                if self.state_dim > arch.max_state_dim:
                    raise ConfigError(f"the env's state is {self.state_dim}-D but the pi0 model has max_state_dim "
                                      f"{arch.max_state_dim}")
        # normalization (LeRobot/openpi MEAN_STD): identity until SFT or a checkpoint sets it
        self.register_buffer("state_mean", torch.zeros(arch.max_state_dim))
        self.register_buffer("state_std", torch.ones(arch.max_state_dim))
        self.register_buffer("action_mean", torch.zeros(arch.max_action_dim))
        self.register_buffer("action_std", torch.ones(arch.max_action_dim))
        # 1.0 / 0.0: whether the weights were trained with the state (travels in every state dict)
        self.register_buffer("uses_state", torch.tensor(float(cfg.use_state)))
        self.register_load_state_dict_pre_hook(_check_state_use)
        if norm is not None:
            self._check_norm_dims(norm, obs_spec is not None, action_spec is not None)
            self.set_norm_stats(**norm)
        self.noise_head = NoiseHead(arch.expert_hidden, arch.max_action_dim, cfg.min_std, cfg.max_std, cfg.noise_space)
        self.value_head = nn.Sequential(nn.Linear(arch.lm_hidden, cfg.value_hidden), nn.GELU(), nn.Linear(cfg.value_hidden, 1))
        nn.init.zeros_(self.value_head[2].weight)
        nn.init.zeros_(self.value_head[2].bias)
        if heads:
            from vla.pi0.checkpoint import load_heads

            load_heads(self, heads, cfg.checkpoint)
        if cfg.freeze_vision:
            self.model.hf.model.vlm.vision_tower.requires_grad_(False)
        self._prompt_cache: dict[str, list[int]] = {}

    # -- normalization ---------------------------------------------------------------------------
    def set_norm_stats(self, state_mean: Any = None, state_std: Any = None, action_mean: Any = None,
                       action_std: Any = None) -> None:
        """Dataset statistics (shorter vectors fill the leading dims; std is floored at 1e-6)."""
        for name, value in (("state_mean", state_mean), ("state_std", state_std), ("action_mean", action_mean),
                            ("action_std", action_std)):
            if value is None:
                continue
            v = torch.as_tensor(np.asarray(value, np.float32)).flatten()
            buf = getattr(self, name)
            if v.numel() > buf.numel():
                raise ConfigError(f"norm stats '{name}' have {v.numel()} entries; the model has {buf.numel()} dims")
            buf[: v.numel()] = v.clamp_min(1e-6) if name.endswith("std") else v

    def _check_norm_dims(self, norm: dict[str, Any], have_obs: bool, have_actions: bool) -> None:
        """A checkpoint's statistics must cover the env's state and action dims: shorter ones would leave
        the rest un-normalized (actions out in normalized units, state scaled for another robot)."""
        for prefix, dim, known in (("state", self.state_dim, have_obs and self.state_dim > 0),
                                   ("action", self.action_dim, have_actions)):
            for name in (f"{prefix}_mean", f"{prefix}_std"):
                if known and norm.get(name) is not None and 0 < np.asarray(norm[name]).size < dim:
                    raise ConfigError(f"pi0 checkpoint '{self.cfg.checkpoint}' has {np.asarray(norm[name]).size}-D "
                                      f"{name} but the env's {prefix} is {dim}-D; use the checkpoint's robot setup "
                                      f"(its controller and state) or norm stats for this one (policy.norm_asset_id)")

    @property
    def action_horizon(self) -> int:
        """Chunk horizon H the model predicts (SFT targets are chunks of H demo actions)."""
        return self.model.arch.chunk_size

    def fit_state_stats(self, states: Any) -> None:
        """Mean/std of demonstration states (M, S), kept fixed afterwards (PPO does not move them)."""
        s = torch.as_tensor(states, dtype=torch.float64)
        self.set_norm_stats(state_mean=s.mean(0).float(), state_std=s.std(0).float())

    def fit_action_stats(self, actions: Any, keep_last: bool = False) -> None:
        """Mean/std of demonstration actions (M, A) (MEAN_STD, as LeRobot's pi0); ``keep_last``
        leaves the last dim (the gripper) un-normalized."""
        a = torch.as_tensor(np.asarray(actions), dtype=torch.float64)
        mean, std = a.mean(0), a.std(0)
        if keep_last:
            mean[-1], std[-1] = 0.0, 1.0
        self.set_norm_stats(action_mean=mean.float(), action_std=std.float())

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """(..., A) env units -> (..., A_max) normalized, zero-padded."""
        a = torch.as_tensor(actions, dtype=torch.float32, device=self.action_mean.device)
        a = (a - self.action_mean[: a.shape[-1]]) / self.action_std[: a.shape[-1]]
        return torch.nn.functional.pad(a, (0, self.model.arch.max_action_dim - a.shape[-1]))

    def _unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        a = x[..., : self.action_dim]
        return a * self.action_std[: self.action_dim] + self.action_mean[: self.action_dim]

    # -- observation processing ------------------------------------------------------------------
    def pixels(self, rgb: Any) -> torch.Tensor:
        """(B, V, H, W, 3) uint8 -> (B, V', 3, S, S) in [-1, 1] for the configured cameras."""
        x = torch.as_tensor(rgb)
        s = self.model.arch.image_size
        if x.dtype != torch.uint8:
            raise ValueError(f"obs['rgb'] must be uint8 (B, V, H, W, 3); got dtype {x.dtype}")
        if x.ndim != 5 or x.shape[-1] != 3 or tuple(x.shape[2:4]) != (s, s):
            raise ValueError(f"obs['rgb'] must have shape (B, V, {s}, {s}, 3) for this pi0 model; got {tuple(x.shape)}")
        if max(self.cfg.cameras) >= x.shape[1]:
            raise ValueError(f"policy.cameras = {list(self.cfg.cameras)} but obs['rgb'] has {x.shape[1]} camera(s)")
        img = x[:, list(self.cfg.cameras)].permute(0, 1, 4, 2, 3).float() / 127.5 - 1.0
        return img.to(self.action_mean.device)

    def state(self, obs: dict[str, Any], batch: int) -> torch.Tensor:
        """(B, max_state_dim) normalized, zero-padded (zeros when the env gives no state or
        ``use_state`` is off)."""
        d = self.model.arch.max_state_dim
        if "state" not in obs or not self.cfg.use_state:
            return torch.zeros(batch, d, device=self.action_mean.device)
        s = torch.as_tensor(obs["state"], dtype=torch.float32).to(self.action_mean.device)
        if s.shape[-1] > d:
            raise ValueError(f"obs['state'] is {s.shape[-1]}-D; this pi0 model takes at most {d}")
        s = (s - self.state_mean[: s.shape[-1]]) / self.state_std[: s.shape[-1]]
        if self.cfg.state_clip is not None:
            s = s.clamp(-self.cfg.state_clip, self.cfg.state_clip)
        return torch.nn.functional.pad(s, (0, d - s.shape[-1]))

    def _prompt(self, instruction: str) -> list[int]:
        ids = self._prompt_cache.get(instruction)
        if ids is None:
            # pi0's prompt: BOS + instruction + "\n" (Gemma's <bos> from an HF tokenizer; 1 for the byte tokenizer)
            bos = getattr(getattr(self.text, "tok", None), "bos_token_id", None)
            ids = [1 if bos is None else int(bos), *self.text.encode(instruction), *self.text.encode("\n")]
            self._prompt_cache[instruction] = check_prompt(instruction, ids, self.cfg.max_prompt_tokens)
        return ids

    def prompts(self, obs: dict[str, Any], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded prompt ids and mask (B, max_prompt_tokens) (pi0 pads right)."""
        instr = batch_instructions(obs, batch, self.cfg.default_instruction)
        rows = [self._prompt(str(t)) for t in instr]
        n = self.cfg.max_prompt_tokens
        ids = torch.zeros(batch, n, dtype=torch.long)
        mask = torch.zeros(batch, n, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        dev = self.action_mean.device
        return ids.to(dev), mask.to(dev)

    def steered(self, cfg: Any) -> Any:
        """This policy, frozen, with RL^2 steering heads (``robo_rl.contracts.Steerable``; ``cfg`` a
        ``robo_rl.algorithms.rl2.SteeringConfig``)."""
        from vla.pi0.steer import SteeredPi0Policy

        return SteeredPi0Policy(self, cfg)

    def prefix(self, obs: dict[str, Any], prompt: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[Prefix, torch.Tensor]:
        """(the VLM prefix, the normalized state (B, max_state_dim)) of a batch of observations;
        ``prompt`` (ids, mask) as ``act`` stored them (rollout buffers keep tensors, not strings)."""
        pixels = self.pixels(obs["rgb"])
        ids, mask = prompt if prompt is not None else self.prompts(obs, pixels.shape[0])
        keep = int(mask.sum(0).nonzero().max()) + 1 if mask.any() else 0  # drop columns that are padding in every row
        return self.model.embed_prefix(pixels, ids[:, :keep], mask[:, :keep]), self.state(obs, pixels.shape[0])

    def log_prob_mask(self) -> torch.Tensor:
        """(H, A_max) bool: the executed steps and the real action dims."""
        arch = self.model.arch
        m = torch.zeros(arch.chunk_size, arch.max_action_dim, dtype=torch.bool, device=self.action_mean.device)
        m[: self.exec_steps, : self.action_dim] = True
        return m

    # -- Policy contract ---------------------------------------------------------------------------
    def act(self, obs: dict[str, Any], deterministic: bool = False, return_latents: bool = False) -> PolicyOutput:
        prompt = self.prompts(obs, int(torch.as_tensor(obs["rgb"]).shape[0]))
        pre, state = self.prefix(obs, prompt)
        b, arch = state.shape[0], self.model.arch
        shape = (b, arch.chunk_size, arch.max_action_dim)
        if deterministic:
            x0 = torch.zeros(shape, device=state.device)
            res = sample(self.model, pre, state, x0, SamplerConfig("ode"), self.log_prob_mask(), return_latents=return_latents)
        else:
            x0 = torch.randn(shape, device=state.device)
            res = sample(self.model, pre, state, x0, self.sampler, self.log_prob_mask(), self.noise_head,
                         return_latents=return_latents)
        extras = {"path": res.path, "step": res.step, "prompt_ids": prompt[0], "prompt_mask": prompt[1]}
        if res.latents is not None:
            extras["latents"] = res.latents
        value = self.value_head(pre.pooled.float()).squeeze(-1)
        return PolicyOutput(actions=self._unnormalize(res.actions[:, : self.exec_steps]), log_prob=res.log_prob,
                            value=value, extras=extras)

    def evaluate(self, obs: dict[str, Any], extras: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pre, state = self.prefix(obs, (extras["prompt_ids"], extras["prompt_mask"]))
        logp, ent = self._path_log_prob(pre, state, extras)
        return logp, ent, self.value_head(pre.pooled.float()).squeeze(-1)

    def _path_log_prob(self, pre: Any, state: torch.Tensor, extras: dict[str, Any],
                       per_step: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-prob, entropy) of the stored paths given the prefix: per action (B,), or per transition (B, n)."""
        return path_log_prob(self.model, pre, state, extras["path"], extras["step"], self.sampler,
                             self.log_prob_mask(), self.noise_head, per_step=per_step)

    def token_log_probs(self, obs: dict[str, Any], extras: dict[str, Any]) -> torch.Tensor:
        """(B, n) log-prob of each stochastic denoising transition of the stored paths (n = K for
        Flow-Noise, 1 for Flow-SDE): the "tokens" of on-policy distillation for a flow VLA."""
        pre, state = self.prefix(obs, (extras["prompt_ids"], extras["prompt_mask"]))
        return self._path_log_prob(pre, state, extras, per_step=True)[0]

    def token_distributions(self, obs: dict[str, Any], extras: dict[str, Any]) -> torch.distributions.Independent:
        """The Gaussian kernel of each stochastic denoising transition of the stored paths, given the stored
        x_k (batch shape (B, n) as ``token_log_probs``; event: the executed steps x real action dims)."""
        pre, state = self.prefix(obs, (extras["prompt_ids"], extras["prompt_mask"]))
        return path_distributions(self.model, pre, state, extras["path"], extras["step"], self.sampler,
                                  self.log_prob_mask(), self.noise_head)

    def token_space(self) -> dict[str, Any]:
        """What a transition means: a teacher scoring this policy's paths must agree on these."""
        arch = self.model.arch
        return {"kind": "pi0-flow", "sampler": self.cfg.sampler, "noise_level": self.cfg.noise_level,
                "num_steps": arch.num_steps, "chunk_size": arch.chunk_size, "max_action_dim": arch.max_action_dim,
                "exec_steps": self.exec_steps, "action_dim": self.action_dim,
                "action_mean": [round(x, 6) for x in self.action_mean.tolist()],
                "action_std": [round(x, 6) for x in self.action_std.tolist()]}

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        pre, _ = self.prefix(obs)
        return self.value_head(pre.pooled.float()).squeeze(-1)

    def value_parameters(self) -> list[nn.Parameter]:
        """Parameters of the critic (PPO may give them their own learning rate)."""
        return list(self.value_head.parameters())

    def imitation_loss(self, obs: dict[str, Any], actions: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Flow-matching loss of demo chunks ``actions`` (B, H', A) in env units (H' <= H; ``valid``
        (B, H') marks real steps, e.g. not past the episode's end); padding dims are excluded."""
        pre, state = self.prefix(obs)
        arch = self.model.arch
        a = torch.as_tensor(actions, dtype=torch.float32, device=state.device)
        if a.ndim == 2:
            a = a[:, None]
        if a.shape[1] > arch.chunk_size or a.shape[-1] != self.action_dim:
            raise ValueError(f"demo actions {tuple(a.shape)} do not fit chunks of {arch.chunk_size} x {self.action_dim}")
        target = torch.zeros(a.shape[0], arch.chunk_size, arch.max_action_dim, device=state.device)
        target[:, : a.shape[1]] = self.normalize_actions(a)
        mask = torch.zeros_like(target)
        rows = torch.ones(a.shape[:2], device=state.device) if valid is None else torch.as_tensor(valid, dtype=torch.float32)
        mask[:, : a.shape[1], : self.action_dim] = rows.to(state.device)[..., None]
        return self.model.flow_matching_loss(pre, state, target, mask)

    def self_imitation_loss(self, obs: dict[str, Any], extras: dict[str, Any], weights: torch.Tensor) -> torch.Tensor:
        """Flow-matching loss of the policy's own sampled chunks: target x_K = ``extras["path"][:, -1]`` (the
        chunk ``act`` sampled, normalized), on the executed steps and real action dims, under the prompt
        ``act`` stored. Row i counts with weight ``weights[i]`` >= 0 (N,): a weighted mean over the masked
        elements (0 when every weight is 0)."""
        pre, state = self.prefix(obs, (extras["prompt_ids"], extras["prompt_mask"]))
        return self._self_imitation(pre, state, extras, weights)

    def score_and_imitate(self, obs: dict[str, Any], extras: dict[str, Any], weights: torch.Tensor,
                          per_token: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``token_log_probs`` (``per_token``; entropy None) or ``evaluate``'s log-prob and entropy, and
        ``self_imitation_loss``, on one prefix pass (the VLM embeds the images and prompt once): equal to
        the two calls in that order."""
        pre, state = self.prefix(obs, (extras["prompt_ids"], extras["prompt_mask"]))
        logp, ent = self._path_log_prob(pre, state, extras, per_step=per_token)
        return logp, None if per_token else ent, self._self_imitation(pre, state, extras, weights)

    def _self_imitation(self, pre: Any, state: torch.Tensor, extras: dict[str, Any], weights: torch.Tensor) -> torch.Tensor:
        target = extras["path"][:, -1].to(state.device, torch.float32)
        w = torch.as_tensor(weights, dtype=torch.float32, device=state.device).clamp_min(0.0)
        mask = self.log_prob_mask().to(target.dtype)[None] * w[:, None, None]
        return self.model.flow_matching_loss(pre, state, target, mask)

    def save_pretrained(self, path: str | Path) -> Path:
        """Write model, norm stats, heads and tokenizer as a robo-rl pi0 directory (atomically); load it
        back with ``Pi0PolicyConfig(checkpoint=path)``."""
        from vla.pi0.checkpoint import save_pretrained

        return save_pretrained(self, path)

    def reset(self, env_ids: Any = None) -> None:
        """Stateless: the VecEnv executes each chunk; nothing to clear."""
