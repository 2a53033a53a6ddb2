"""OpenVLA-style VLA behind the ``Policy`` contract.

Input: ``obs["rgb"]`` (B, V, H, W, 3) uint8 (camera ``cfg.camera`` is used, resized to the model's
image size as OpenVLA's "resize-naive"), ``obs["instruction"]`` list[str] of length B (or the
config's default). Output actions (B, A) float32 in env units: the decoded bin centres un-normalized
with the checkpoint's q01/q99 statistics. ``extras``: ``action_index`` (B, N) long (token id -
first action id, N = A), ``prompt_ids``/``prompt_mask`` (B, L) so ``evaluate`` recomputes log-probs in
one teacher-forced pass. log_prob / entropy are sums over the N action tokens; the value head reads the
hidden state just before the first action token.

Action chunks (``policy.chunk`` H > 1, OpenVLA-OFT's chunking kept autoregressive over the same 256-bin
tokens): SFT learns the next H actions as H x A tokens (time-major: action 0's A tokens, then action
1's, ...); ``act`` decodes only the E = ``exec_steps`` actions that are executed (E x A tokens: decoding
can stop early because later tokens never condition earlier ones) and returns (B, E, A), which the VecEnv
executes as one step (its rewards summed). Then N = E x A and log_prob sums over exactly the executed
tokens.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from robo_rl.config import check_ranges, ranged
from robo_rl.contracts import ArraySpec, PolicyOutput
from robo_rl.errors import ConfigError
from robo_rl.rollout.normalize import RunningMeanStd
from vla.openvla.decode import batch_decode, teacher_forced, teacher_forced_distribution
from vla.openvla.model import ARCH_PRESETS, OpenVLAModel, VLAArch
from vla.openvla.text import ByteTokenizer, TextTokenizer, batch_instructions, check_prompt
from vla.openvla.tokenizer import NormStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenVLAConfig:
    """OpenVLA-style policy."""

    name: str = "openvla"
    """Registry name of the policy."""
    arch: str = "tiny"
    """Architecture preset for a random-init model (used when ``checkpoint`` is null)."""
    checkpoint: str | None = None
    """Local directory: a released OpenVLA HF checkpoint, or one written by robo-rl (``vla build-mini``)."""
    unnorm_key: str | None = None
    """Dataset key of the checkpoint's norm_stats used to un-normalize actions (null if it has one)."""
    camera: int = ranged(0, ge=0)
    """Which camera of ``obs['rgb']`` (V axis) the model sees. Range: >= 0."""
    prompt: str = "In: What action should the robot take to {instruction}?\nOut:"
    """Prompt template; the instruction is lower-cased as OpenVLA does."""
    default_instruction: str = "complete the task"
    """Instruction used when the observation carries none."""
    max_prompt_tokens: int = ranged(128, ge=1)
    """Prompt budget in tokens; a longer instruction is an error (never silently truncated). Range: >= 1."""
    temperature: float = ranged(1.0, gt=0)
    """Sampling temperature of rollouts (evaluation is greedy); log-probs are under this temperature.
    Range: > 0."""
    value_hidden: int = ranged(256, ge=1)
    """Hidden width of the value head (reads the hidden state before the first action token). Range: >= 1."""
    value_detach: bool = False
    """Stop the value loss's gradient at the value head's input: the shared trunk (the actor) then learns
    from the policy loss only and the value head fits its features (RL4VLA lets both flow: false)."""
    lora_rank: int = ranged(0, ge=0)
    """LoRA rank on the Llama projections through peft (0 = full fine-tuning). Range: >= 0."""
    lora_alpha: float = ranged(16.0, gt=0)
    """LoRA alpha (the adapters' output is scaled by lora_alpha / lora_rank). Range: > 0."""
    freeze_vision: bool = False
    """Keep the vision backbone fixed."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights dtype of the VLA (value head stays float32)."""
    state_token: bool = False
    """Add one prefix token projected from ``obs['state']`` (running-normalized), after the image
    patches, as OpenVLA-OFT's proprio projector does. Needed where the image does not show the goal
    (ManiSkill PickCube's goal is only in the state)."""
    chunk: int = ranged(1, ge=1)
    """Action chunk H: SFT targets are the next H actions (H x A tokens); 1 = OpenVLA's single action.
    Range: >= 1."""
    exec_steps: int | None = ranged(None, ge=1)
    """Actions of the chunk decoded and executed per call (E <= H; null = H). Range: >= 1."""

    def __post_init__(self) -> None:
        check_ranges(self, "policy")
        if self.exec_steps is not None and not 1 <= self.exec_steps <= self.chunk:
            raise ConfigError(f"config key 'policy.exec_steps' = {self.exec_steps} must be in [1, policy.chunk = "
                              f"{self.chunk}] (or null for the whole chunk)")
        if self.checkpoint is None and self.arch not in ARCH_PRESETS:
            raise ConfigError(f"config key 'policy.arch' = {self.arch!r} is not a preset; known: {', '.join(ARCH_PRESETS)}")
        if "{instruction}" not in self.prompt:
            raise ConfigError("config key 'policy.prompt' must contain '{instruction}'")


class OpenVLAPolicy(nn.Module):
    """``Policy`` over an ``OpenVLAModel``; see the module docstring for shapes."""

    Config = OpenVLAConfig

    def __init__(self, cfg: OpenVLAConfig, obs_spec: dict[str, ArraySpec] | None = None,
                 action_spec: ArraySpec | None = None, model: OpenVLAModel | None = None,
                 text_tokenizer: TextTokenizer | None = None, norm_stats: NormStats | None = None,
                 append_token_id: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        if model is None:
            if cfg.checkpoint is not None:
                from vla.openvla.checkpoint import load_pretrained

                loaded = load_pretrained(cfg.checkpoint, cfg.unnorm_key)
                model, text_tokenizer, norm_stats, append_token_id = (
                    loaded.model, loaded.text_tokenizer, loaded.norm_stats, loaded.append_token_id)
            else:
                arch = ARCH_PRESETS[cfg.arch]
                if action_spec is not None:  # a random-init model decodes what the env takes
                    arch = dataclasses.replace(arch, action_dim=int(action_spec.shape[-1]))
                model = OpenVLAModel(arch)
        self.model = model
        arch: VLAArch = model.arch
        self.text = text_tokenizer or ByteTokenizer()
        self.append_token_id = append_token_id
        if obs_spec is not None and "rgb" not in obs_spec:
            raise ConfigError(f"policy 'openvla' needs an 'rgb' observation; the env gives {sorted(obs_spec)} "
                              "(set env.obs_mode: rgb)")
        if action_spec is not None and int(action_spec.shape[-1]) != arch.action_dim:
            raise ConfigError(f"policy 'openvla' decodes {arch.action_dim}-D actions but the env expects "
                              f"{action_spec.shape[-1]}-D (choose a matching controller or checkpoint)")
        if norm_stats is None:
            bounds = action_spec.bounds() if action_spec is not None else None
            lo, hi = bounds if bounds is not None else (np.full(arch.action_dim, -1.0), np.full(arch.action_dim, 1.0))
            norm_stats = NormStats(tuple(map(float, lo)), tuple(map(float, hi)), (True,) * arch.action_dim)
        self.register_buffer("q01", torch.tensor(norm_stats.q01, dtype=torch.float32))
        self.register_buffer("q99", torch.tensor(norm_stats.q99, dtype=torch.float32))
        self.register_buffer("norm_mask", torch.tensor(norm_stats.mask, dtype=torch.bool))
        mean, std = model.vision_backbone.norm_constants()
        self.register_buffer("pix_mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("pix_std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)
        hidden = arch.llm.hidden
        self.value_head = nn.Sequential(nn.Linear(hidden, cfg.value_hidden), nn.GELU(), nn.Linear(cfg.value_hidden, 1))
        nn.init.zeros_(self.value_head[2].weight)
        nn.init.zeros_(self.value_head[2].bias)
        self.state_proj: nn.Module | None = None
        self.state_norm: RunningMeanStd | None = None
        if cfg.state_token:
            if obs_spec is None or "state" not in obs_spec:
                raise ConfigError("policy.state_token needs a 'state' observation from the env")
            d = int(obs_spec["state"].shape[-1])
            self.state_norm = RunningMeanStd((d,))
            self.state_proj = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        if cfg.dtype == "bfloat16":
            self.model.to(torch.bfloat16)
        if cfg.lora_rank > 0:
            self._add_lora()
        if cfg.freeze_vision:
            self.model.vision_backbone.requires_grad_(False)
        self._prompt_cache: dict[str, list[int]] = {}
        self.exec_steps = cfg.exec_steps or cfg.chunk

    @property
    def action_horizon(self) -> int:
        """Chunk length H SFT learns (the demo targets are chunks of H actions when H > 1)."""
        return self.cfg.chunk

    def train(self, mode: bool = True) -> OpenVLAPolicy:
        """Train mode everywhere except BatchNorm (MobileNet), which keeps its pretrained statistics:
        otherwise ``evaluate`` in train mode would score actions with batch statistics that ``act``
        (eval mode, during rollouts) never saw, and PPO's ratio would be off from the first step."""
        super().train(mode)
        for mod in self.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                mod.eval()
        return self

    # -- setup helpers -----------------------------------------------------------------------------
    def _add_lora(self) -> None:
        from peft import LoraConfig, inject_adapter_in_model

        lm = self.model.language_model
        lm.requires_grad_(False)
        lora = LoraConfig(r=self.cfg.lora_rank, lora_alpha=self.cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
        inject_adapter_in_model(lora, lm.model)

    @property
    def norm_stats(self) -> NormStats:
        return NormStats(tuple(self.q01.tolist()), tuple(self.q99.tolist()), tuple(bool(x) for x in self.norm_mask.tolist()))

    def set_norm_stats(self, stats: NormStats) -> None:
        """Use a dataset's action statistics (SFT does this before training)."""
        if stats.action_dim != self.model.arch.action_dim:
            raise ConfigError(f"norm stats are {stats.action_dim}-D but the model decodes {self.model.arch.action_dim}-D actions")
        self.q01.copy_(torch.tensor(stats.q01))
        self.q99.copy_(torch.tensor(stats.q99))
        self.norm_mask.copy_(torch.tensor(stats.mask))

    def fit_action_stats(self, actions: np.ndarray, keep_last: bool = False) -> None:
        """Action bins from demonstrations (M, A): q01/q99 per dim (all dims, or all but the last
        (gripper) when ``keep_last``, as OpenVLA does for datasets whose gripper is already in [-1, 1])."""
        self.set_norm_stats(NormStats.from_actions(actions, None if keep_last else (True,) * actions.shape[1]))

    def value_parameters(self) -> list[nn.Parameter]:
        """Parameters of the critic (PPO may give them their own learning rate)."""
        return list(self.value_head.parameters())

    # -- observation processing ------------------------------------------------------------------
    def pixels(self, rgb: Any) -> torch.Tensor:
        """(B, V, H, W, 3) uint8 -> (B, C, S, S) normalized float (C = 3, or 6 for fused towers)."""
        x = torch.as_tensor(rgb)
        if x.dtype != torch.uint8:
            raise ValueError(f"obs['rgb'] must be uint8 (B, V, H, W, 3); got dtype {x.dtype}")
        if x.ndim != 5 or x.shape[-1] != 3:
            raise ValueError(f"obs['rgb'] must have shape (B, V, H, W, 3); got {tuple(x.shape)}")
        if not 0 <= self.cfg.camera < x.shape[1]:
            raise ValueError(f"policy.camera = {self.cfg.camera} but obs['rgb'] has {x.shape[1]} camera(s)")
        img = x[:, self.cfg.camera].permute(0, 3, 1, 2).float().div_(255.0)
        size = self.model.arch.vision.image_size
        if img.shape[-2:] != (size, size):
            img = F.interpolate(img, size=(size, size), mode="bicubic", antialias=True, align_corners=False).clamp_(0, 1)
        if self.model.vision_backbone.in_channels == 6:
            img = torch.cat([img, img], dim=1)
        img = (img.to(self.pix_mean.device) - self.pix_mean) / self.pix_std
        return img.to(self.model.language_model.get_input_embeddings().weight.dtype)

    def _prompt(self, instruction: str) -> list[int]:
        ids = self._prompt_cache.get(instruction)
        if ids is None:
            ids = self.text.encode(self.cfg.prompt.format(instruction=instruction.lower()))
            if self.append_token_id is not None and (not ids or ids[-1] != self.append_token_id):
                ids.append(self.append_token_id)
            self._prompt_cache[instruction] = check_prompt(instruction, ids, self.cfg.max_prompt_tokens)
        return ids

    def prompts(self, obs: dict[str, Any], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids and mask (B, max_prompt_tokens)."""
        instr = batch_instructions(obs, batch, self.cfg.default_instruction)
        n = self.cfg.max_prompt_tokens
        ids = torch.full((batch, n), self.model.arch.llm.pad_id, dtype=torch.long)
        mask = torch.zeros(batch, n, dtype=torch.long)
        for i, text in enumerate(instr):
            p = self._prompt(str(text))
            ids[i, n - len(p):] = torch.tensor(p)
            mask[i, n - len(p):] = 1
        dev = self.q01.device
        return ids.to(dev), mask.to(dev)

    def _unnormalize(self, index: torch.Tensor) -> torch.Tensor:
        """(..., A) action indices -> (..., A) env-unit actions."""
        tok = self.model.action_tokenizer
        centers = torch.as_tensor(tok.bin_centers, dtype=torch.float32, device=index.device)
        # index k <-> token id first_id + k; decode uses bin vocab - id - 1 = n_bins - 1 - k
        a = centers[(tok.n_bins - 1 - index).clamp(0, centers.shape[0] - 1)]
        return torch.where(self.norm_mask, 0.5 * (a + 1.0) * (self.q99 - self.q01) + self.q01, a)

    def actions_to_index(self, actions: Any) -> torch.Tensor:
        """(B, A) env-unit actions, or chunks (B, H, A) -> (B, A) / (B, H x A) action indices (OpenVLA's
        tokenizer, time-major, for SFT targets)."""
        a = np.asarray(torch.as_tensor(actions, dtype=torch.float32).cpu())
        if a.ndim not in (2, 3) or a.shape[-1] != self.model.arch.action_dim:
            raise ValueError(f"actions must be (B, {self.model.arch.action_dim}) or (B, T, {self.model.arch.action_dim}); "
                             f"got {a.shape}")
        flat = a.reshape(-1, a.shape[-1])
        ids = self.model.action_tokenizer.encode(self.norm_stats.normalize(flat))
        index = self.model.action_tokenizer.ids_to_index(torch.from_numpy(ids))
        return index.reshape(a.shape[0], -1).to(self.q01.device)

    def _extra(self, obs: dict[str, Any]) -> torch.Tensor | None:
        """(B, 1, D) state token, or None."""
        if self.state_proj is None or self.state_norm is None:
            return None
        x = self.state_norm(torch.as_tensor(obs["state"], dtype=torch.float32).to(self.q01.device))
        return self.state_proj(x)[:, None]

    def update_normalizer(self, obs: dict[str, Any]) -> None:
        """Update the running state statistics (the trainer calls this with rollout observations)."""
        if self.state_norm is not None:
            self.state_norm.update(torch.as_tensor(obs["state"], dtype=torch.float32))

    # -- Policy contract ---------------------------------------------------------------------------
    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        pixels = self.pixels(obs["rgb"])
        ids, mask = self.prompts(obs, pixels.shape[0])
        a = self.model.arch.action_dim
        out = batch_decode(self.model, pixels, ids, mask, self.cfg.temperature, greedy=deterministic,
                           extra=self._extra(obs), n_tokens=self.exec_steps * a)
        value = self._value(out.prefix_hidden)
        actions = self._unnormalize(out.index.view(out.index.shape[0], self.exec_steps, a))
        if self.cfg.chunk == 1:
            actions = actions[:, 0]
        return PolicyOutput(actions=actions, log_prob=out.log_prob.sum(-1), value=value,
                            extras={"action_index": out.index, "prompt_ids": ids, "prompt_mask": mask})

    def evaluate(self, obs: dict[str, Any], extras: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pixels = self.pixels(obs["rgb"])
        out = teacher_forced(self.model, pixels, extras["prompt_ids"], extras["prompt_mask"], extras["action_index"],
                             self.cfg.temperature, extra=self._extra(obs))
        value = self._value(out.prefix_hidden)
        return out.log_prob.sum(-1), out.entropy.sum(-1), value

    def imitation_loss(self, obs: dict[str, Any], actions: torch.Tensor,
                       valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean NLL, mean entropy) per demo row of expert actions (B, A) or chunks (B, H, A) with ``valid``
        (B, T) (steps past the episode's end are masked out), summed over the row's valid tokens; one
        teacher-forced pass."""
        extras = self.extras_for_actions(obs, actions)
        pixels = self.pixels(obs["rgb"])
        out = teacher_forced(self.model, pixels, extras["prompt_ids"], extras["prompt_mask"], extras["action_index"],
                             self.cfg.temperature, extra=self._extra(obs))
        if valid is None:
            return -out.log_prob.sum(-1).mean(), out.entropy.sum(-1).mean()
        m = torch.as_tensor(valid, dtype=torch.float32, device=out.log_prob.device)
        m = m.repeat_interleave(self.model.arch.action_dim, dim=1)
        return -(out.log_prob * m).sum(-1).mean(), (out.entropy * m).sum(-1).mean()

    def token_log_probs(self, obs: dict[str, Any], extras: dict[str, Any]) -> torch.Tensor:
        """(B, A) log-prob of each stored action token (what ``evaluate`` sums), for token-level
        distillation."""
        pixels = self.pixels(obs["rgb"])
        return teacher_forced(self.model, pixels, extras["prompt_ids"], extras["prompt_mask"], extras["action_index"],
                              self.cfg.temperature, extra=self._extra(obs)).log_prob

    def token_distributions(self, obs: dict[str, Any], extras: dict[str, Any]) -> torch.distributions.Categorical:
        """The full 256-bin distribution at each stored action token's position (batch shape (B, A), each
        given the stored tokens before it): what exact-KL distillation compares."""
        pixels = self.pixels(obs["rgb"])
        return teacher_forced_distribution(self.model, pixels, extras["prompt_ids"], extras["prompt_mask"],
                                           extras["action_index"], self.cfg.temperature, extra=self._extra(obs))

    def token_space(self) -> dict[str, Any]:
        """What a token means: a teacher scoring this policy's tokens must have the same (OPD)."""
        tok = self.model.action_tokenizer
        return {"kind": "openvla-action-tokens", "action_dim": self.model.arch.action_dim, "bins": tok.n_bins,
                "first_action_id": tok.first_id, "text_tokenizer": type(self.text).__name__,
                "prompt": self.cfg.prompt, "q01": [round(x, 6) for x in self.q01.tolist()],
                "q99": [round(x, 6) for x in self.q99.tolist()], "state_token": self.cfg.state_token,
                "exec_steps": self.exec_steps if self.cfg.chunk > 1 else 1}

    def extras_for_actions(self, obs: dict[str, Any], actions: Any) -> dict[str, torch.Tensor]:
        """What ``evaluate`` needs to score given env actions (B, A) or chunks (B, H, A) (behaviour cloning
        targets; T x A tokens)."""
        pixels_b = int(torch.as_tensor(obs["rgb"]).shape[0])
        ids, mask = self.prompts(obs, pixels_b)
        return {"action_index": self.actions_to_index(actions), "prompt_ids": ids, "prompt_mask": mask}

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        pixels = self.pixels(obs["rgb"])
        ids, mask = self.prompts(obs, pixels.shape[0])
        embeds, m, pos = self.model.embed_prefix(pixels, ids, mask, self._extra(obs))
        hidden, _ = self.model.backbone(embeds, m, pos)
        return self._value(hidden[:, -1])

    def _value(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B,) value from the (B, D) hidden state before the first action token."""
        if self.cfg.value_detach:
            hidden = hidden.detach()
        return self.value_head(hidden.float()).squeeze(-1)

    def reset(self, env_ids: Any = None) -> None:
        """Stateless (the VecEnv executes a chunk within one step): nothing to clear."""

    # -- save / load ---------------------------------------------------------------------------------
    def save_pretrained(self, path: str | Path) -> Path:
        from vla.openvla.checkpoint import save_pretrained

        return save_pretrained(self, path)
