"""pi0-style flow-matching VLA on transformers' ``PI0ForConditionalGeneration``.

transformers brings the modules (PaliGemma prefix: SigLIP + Gemma; Gemma action expert sharing the
prefix's KV cache; the action/time embedding and output projection). What we add: a prefix computed
once per observation and reused for every denoising step (and batch-repeated for scoring many
steps in one pass), the action-expert hidden states (latents) next to each velocity, a masked
flow-matching loss, and size presets.

Shapes: pixels (B, V, 3, S, S) float in [-1, 1]; prompt ids / mask (B, L) (right-padded); state
(B, max_state_dim); x_t and velocities (B, H, max_action_dim) with H = chunk_size; t (B,) in (0, 1],
t = 1 is pure noise. Flow matching: x_t = t * noise + (1 - t) * action, target u = noise - action.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Pi0Arch:
    """Sizes of a pi0-style model. The expert shares the prefix's KV cache, so it has the prefix
    LM's layer count, KV heads and head dim."""

    image_size: int
    patch_size: int
    vision_hidden: int
    vision_layers: int
    vision_heads: int
    vision_mlp: int
    lm_hidden: int
    lm_layers: int
    lm_heads: int
    lm_kv_heads: int
    head_dim: int
    lm_mlp: int
    vocab_size: int
    expert_hidden: int
    expert_mlp: int
    expert_heads: int
    chunk_size: int
    max_state_dim: int
    max_action_dim: int
    num_steps: int
    """Denoising (Euler) steps at inference."""
    cameras: int = 1

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def image_token_id(self) -> int:
        """Placeholder id of image positions (outside the vocabulary, as transformers' PI0 uses)."""
        return self.vocab_size

    def hf_config(self) -> Any:
        from transformers import PI0Config

        return PI0Config(
            vlm_config={
                "model_type": "paligemma",
                "text_config": {"model_type": "gemma", "hidden_size": self.lm_hidden, "num_hidden_layers": self.lm_layers,
                                "intermediate_size": self.lm_mlp, "num_attention_heads": self.lm_heads,
                                "num_key_value_heads": self.lm_kv_heads, "head_dim": self.head_dim,
                                "vocab_size": self.vocab_size},
                "vision_config": {"model_type": "siglip_vision_model", "hidden_size": self.vision_hidden,
                                  "intermediate_size": self.vision_mlp, "num_hidden_layers": self.vision_layers,
                                  "num_attention_heads": self.vision_heads, "patch_size": self.patch_size,
                                  "image_size": self.image_size, "vision_use_head": False},
                "projection_dim": self.lm_hidden, "image_token_id": self.image_token_id, "vocab_size": self.vocab_size},
            dit_config={"model_type": "gemma", "hidden_size": self.expert_hidden, "num_hidden_layers": self.lm_layers,
                        "intermediate_size": self.expert_mlp, "num_attention_heads": self.expert_heads,
                        "num_key_value_heads": self.lm_kv_heads, "head_dim": self.head_dim},
            chunk_size=self.chunk_size, max_state_dim=self.max_state_dim, max_action_dim=self.max_action_dim,
            num_inference_steps=self.num_steps)

    @classmethod
    def from_hf_config(cls, cfg: Any, cameras: int = 1) -> Pi0Arch:
        v, t, d = cfg.vlm_config.vision_config, cfg.vlm_config.text_config, cfg.dit_config
        return cls(image_size=v.image_size, patch_size=v.patch_size, vision_hidden=v.hidden_size,
                   vision_layers=v.num_hidden_layers, vision_heads=v.num_attention_heads, vision_mlp=v.intermediate_size,
                   lm_hidden=t.hidden_size, lm_layers=t.num_hidden_layers, lm_heads=t.num_attention_heads,
                   lm_kv_heads=t.num_key_value_heads, head_dim=t.head_dim, lm_mlp=t.intermediate_size,
                   vocab_size=t.vocab_size, expert_hidden=d.hidden_size, expert_mlp=d.intermediate_size,
                   expert_heads=d.num_attention_heads, chunk_size=cfg.chunk_size, max_state_dim=cfg.max_state_dim,
                   max_action_dim=cfg.max_action_dim, num_steps=cfg.num_inference_steps, cameras=cameras)


ARCH_PRESETS: dict[str, Pi0Arch] = {
    # unit tests: 16 image tokens, 2 layers, ~0.2 M parameters
    "tiny": Pi0Arch(32, 8, 32, 2, 2, 64, 64, 2, 2, 1, 32, 128, 512, 32, 64, 2, 4, 32, 8, 4),
    # CPU training: 128 px in 32 px patches -> 16 image tokens, 3-layer prefix, chunks of 8
    "small": Pi0Arch(128, 32, 128, 2, 4, 256, 128, 3, 4, 1, 32, 256, 512, 64, 128, 2, 8, 32, 8, 5),
    # pi0: SigLIP So400m/14 at 224 + Gemma 2B prefix, Gemma 300M action expert, 50-step chunks, 32-D padding
    "pi0": Pi0Arch(224, 14, 1152, 27, 16, 4304, 2048, 18, 8, 1, 256, 16384, 257152, 1024, 4096, 8, 50, 32, 32, 10),
}


@dataclass
class Prefix:
    """The VLM prefix of a batch, computed once: its KV cache, mask (B, P) and pooled hidden (B, D)."""

    cache: Any
    mask: torch.Tensor
    pooled: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def repeat(self, k: int) -> Prefix:
        """Each row repeated k times in place of the batch (row b -> rows b*k .. b*k+k-1)."""
        import copy

        cache = copy.copy(self.cache)
        cache.layers = [copy.copy(layer) for layer in self.cache.layers]
        cache.batch_repeat_interleave(k)
        return Prefix(cache, self.mask.repeat_interleave(k, 0), self.pooled.repeat_interleave(k, 0))


class Pi0Model(nn.Module):
    """Wraps ``transformers.PI0ForConditionalGeneration`` (attribute ``hf``)."""

    def __init__(self, arch: Pi0Arch, hf: Any = None) -> None:
        super().__init__()
        if hf is None:
            from transformers import PI0ForConditionalGeneration

            hf = PI0ForConditionalGeneration(arch.hf_config())
        self.arch = arch
        self.hf = hf

    @property
    def dtype(self) -> torch.dtype:
        return self.hf.action_out_proj.weight.dtype

    def embed_prefix(self, pixels: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> Prefix:
        """pixels (B, V, 3, S, S), prompt ids / mask (B, L) -> the prefix [image tokens x V, prompt]."""
        b, v = pixels.shape[:2]
        n_img = v * self.arch.tokens_per_image
        img_ids = torch.full((b, n_img), self.arch.image_token_id, dtype=torch.long, device=ids.device)
        input_ids = torch.cat([img_ids, ids], dim=1)
        attn = torch.cat([torch.ones(b, n_img, dtype=mask.dtype, device=mask.device), mask], dim=1)
        cam_mask = torch.ones(b, v, dtype=torch.bool, device=pixels.device)
        model = self.hf.model
        embeds = model.embed_prefix(input_ids, pixels.to(self.dtype), cam_mask)
        out = model.vlm(inputs_embeds=embeds, attention_mask=attn, position_ids=attn.cumsum(-1) - 1,
                        token_type_ids=torch.zeros_like(attn), use_cache=True)
        hidden = out.last_hidden_state
        w = attn.to(hidden.dtype)[..., None]
        pooled = (hidden * w).sum(1) / w.sum(1).clamp_min(1.0)
        return Prefix(out.cache if hasattr(out, "cache") else out.past_key_values, attn, pooled)

    def velocity(self, prefix: Prefix, state: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(v (B, H, A), expert latents (B, H, D)) at noisy chunk x (B, H, A) and times t (B,).
        The prefix's cache is left as it was (the suffix is cropped off again)."""
        hf = self.hf
        emb = hf.embed_action_time(state.to(self.dtype), x.to(self.dtype), t.float())
        cache = prefix.cache
        before = cache.get_seq_length()
        try:
            out = hf.model(action_embeds=emb, attention_mask=prefix.mask, cache=cache)
        finally:
            grown = cache.get_seq_length() - before
            if grown:
                cache.crop(-grown)
        h = out.last_hidden_state[:, -self.arch.chunk_size:]
        return hf.action_out_proj(h).float(), h

    def flow_matching_loss(self, prefix: Prefix, state: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor,
                           generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean over the masked elements of |v(x_t, t) - (noise - action)|^2; actions and mask (B, H, A)
        (normalized, zero-padded). t = Beta(1.5, 1) * 0.999 + 0.001 as pi0 samples it."""
        b = actions.shape[0]
        cfg = self.hf.config
        beta = torch.distributions.Beta(torch.tensor(cfg.time_sampling_beta_alpha), torch.tensor(cfg.time_sampling_beta_beta))
        t = beta.sample((b,)).to(actions.device) * cfg.time_sampling_scale + cfg.time_sampling_offset
        noise = torch.randn(actions.shape, generator=generator, device=actions.device)
        x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * actions
        v, _ = self.velocity(prefix, state, x_t, t)
        err = (v - (noise - actions)) ** 2 * mask
        return err.sum() / mask.sum().clamp_min(1.0)

