"""The OpenVLA-style network: vision backbone -> projector -> Llama, plus action-token heads.

Sequence layout (one row per env): ``[BOS, patches (P), pad..., prompt tokens (L_i)]`` with the
attention mask 0 on pads and ``position_ids = cumsum(mask) - 1``, so every row is numerically the
unpadded OpenVLA sequence ``[BOS, patches, prompt]`` while all rows end at the same column (the
position that predicts the first action token). Action logits are computed only for the ``n_bins``
action ids (rows of ``lm_head``), never over the full vocabulary.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from vla.openvla.tokenizer import ActionTokenizer
from vla.openvla.vision import VisionArch, VisionBackbone


@dataclass(frozen=True)
class LLMArch:
    """Llama shape. ``base_vocab`` is the vocabulary the 256 action ids are carved from (its last
    ids); ``vocab_size`` the embedding rows (OpenVLA: 32064 = 32000 + 64 padding)."""

    hidden: int = 64
    layers: int = 2
    heads: int = 2
    kv_heads: int = 2
    mlp: int = 128
    vocab_size: int = 512
    base_vocab: int = 512
    rope_theta: float = 10000.0
    max_positions: int = 2048
    rms_eps: float = 1e-6
    tie_embeddings: bool = False
    bos_id: int = 1
    pad_id: int = 0


@dataclass(frozen=True)
class VLAArch:
    """Whole-model shape; presets in ``ARCH_PRESETS``."""

    vision: VisionArch = field(default_factory=VisionArch)
    llm: LLMArch = field(default_factory=LLMArch)
    projector: Literal["gelu-mlp", "fused-gelu-mlp"] = "gelu-mlp"
    n_action_bins: int = 256
    action_dim: int = 7


ARCH_PRESETS: dict[str, VLAArch] = {
    # Random-init model for tests: 32 px SigLIP (16 patches), 2-layer Llama, 512-token vocabulary.
    "tiny": VLAArch(VisionArch("siglip", 32, 8, 64, 2, 2, 128), LLMArch(), "gelu-mlp", 256, 7),
    # Random-init model that trains on 2 CPU cores (the counterpart of pi0's "small"): 128 px SigLIP
    # (16 patches of 32 px, 2 layers x 128), 3-layer 128-wide Llama over the byte vocabulary + 256 action ids.
    "small": VLAArch(VisionArch("siglip", 128, 32, 128, 2, 4, 256),
                     LLMArch(128, 3, 4, 2, 384, 512, 512), "gelu-mlp", 256, 7),
    # OpenVLA-7B's shapes (prism-dinosiglip-224px + Llama-2-7B), for dry runs and GPU benchmarks.
    "openvla-7b": VLAArch(VisionArch("dinosiglip", 224, 14, 1024, 24, 16, 4096, 1152, 27, 16, 4304, "gelu"),
                          LLMArch(4096, 32, 32, 32, 11008, 32064, 32000, 10000.0, 2048, 1e-6, False, 1, 32000),
                          "fused-gelu-mlp", 256, 7),
}


class Projector(nn.Module):
    """OpenVLA projector: ``gelu-mlp`` fc1 (F->D), GELU, fc2 (D->D); ``fused-gelu-mlp`` fc1 (F->4F),
    GELU, fc2 (4F->D), GELU, fc3 (D->D)."""

    def __init__(self, kind: str, vision_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.kind = kind
        if kind == "fused-gelu-mlp":
            self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
            self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
            self.fc3: nn.Linear | None = nn.Linear(llm_dim, llm_dim)
        elif kind == "gelu-mlp":
            self.fc1 = nn.Linear(vision_dim, llm_dim)
            self.fc2 = nn.Linear(llm_dim, llm_dim)
            self.fc3 = None
        else:
            raise ValueError(f"unknown projector {kind!r}; known: gelu-mlp, fused-gelu-mlp")
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc2(self.act(self.fc1(x)))
        if self.fc3 is not None:
            x = self.fc3(self.act(x))
        return x


def _cache_kwarg(lm: nn.Module) -> str:
    """transformers renamed the KV-cache argument from ``past_key_values`` to ``cache`` during 5.x."""
    return _cache_kwarg_of(type(lm))


@functools.cache
def _cache_kwarg_of(cls: type) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def build_llama(arch: LLMArch) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=arch.vocab_size, hidden_size=arch.hidden, num_hidden_layers=arch.layers,
                      num_attention_heads=arch.heads, num_key_value_heads=arch.kv_heads, intermediate_size=arch.mlp,
                      rope_theta=arch.rope_theta, max_position_embeddings=arch.max_positions, rms_norm_eps=arch.rms_eps,
                      tie_word_embeddings=arch.tie_embeddings, bos_token_id=arch.bos_id, pad_token_id=arch.pad_id,
                      eos_token_id=2)
    return LlamaForCausalLM(cfg)


class OpenVLAModel(nn.Module):
    """Submodules are named as in OpenVLA's HF checkpoint: ``vision_backbone``, ``projector``,
    ``language_model`` (a transformers ``LlamaForCausalLM``)."""

    def __init__(self, arch: VLAArch) -> None:
        super().__init__()
        self.arch = arch
        self.vision_backbone = VisionBackbone(arch.vision)
        self.projector = Projector(arch.projector, self.vision_backbone.feature_dim, arch.llm.hidden)
        self.language_model = build_llama(arch.llm)
        self.action_tokenizer = ActionTokenizer(arch.llm.base_vocab, arch.n_action_bins)

    # -- pieces ----------------------------------------------------------------------------------
    def embed_prefix(self, pixels: torch.Tensor, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                     extra: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """pixels (B, C, H, W) normalized; prompt_ids/mask (B, L) left-padded, without BOS; ``extra``
        (B, K, D) optional embeddings placed after the patches (e.g. a proprioceptive-state token).

        Returns embeds (B, 1+P+K+L', D), mask, position_ids (same length), where L' <= L drops the
        columns that are padding in every row."""
        emb = self.language_model.get_input_embeddings()
        b = pixels.shape[0]
        keep = prompt_mask.bool().any(0)
        if not bool(keep.all()):  # columns that are padding in every row: dropping them changes nothing
            prompt_ids, prompt_mask = prompt_ids[:, keep], prompt_mask[:, keep]
        patches = self.projector(self.vision_backbone(pixels))
        patches = patches.to(emb.weight.dtype)
        if extra is not None:
            patches = torch.cat([patches, extra.to(emb.weight.dtype)], dim=1)
        bos = emb(torch.full((b, 1), self.arch.llm.bos_id, dtype=torch.long, device=pixels.device))
        text = emb(prompt_ids)
        embeds = torch.cat([bos, patches, text], dim=1)
        ones = torch.ones(b, 1 + patches.shape[1], dtype=torch.long, device=pixels.device)
        mask = torch.cat([ones, prompt_mask.long()], dim=1)
        return embeds, mask, mask.cumsum(-1) - 1

    def backbone(self, embeds: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                 cache: object | None = None, use_cache: bool = False) -> tuple[torch.Tensor, object | None]:
        """Llama trunk: (B, S, D) -> last hidden states (B, S, D) (final norm applied) and the cache."""
        kw = {_cache_kwarg(self.language_model.model): cache}
        out = self.language_model.model(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids,
                                        use_cache=use_cache, **kw)
        if not use_cache:
            return out.last_hidden_state, None
        return out.last_hidden_state, getattr(out, "cache", None) or getattr(out, "past_key_values", None)

    def action_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) hidden states -> (..., n_bins) logits of the action ids (index k = id - first_id)."""
        w = self.language_model.get_output_embeddings().weight
        first = self.action_tokenizer.first_id
        return hidden @ w[first:first + self.arch.n_action_bins].t()

    def embed_action_index(self, index: torch.Tensor) -> torch.Tensor:
        """(B, T) action indices -> (B, T, D) input embeddings of their token ids."""
        return self.language_model.get_input_embeddings()(self.action_tokenizer.index_to_ids(index))

    def full_logits(self, pixels: torch.Tensor, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits (B, 1+P+L, V) of the prefix, as the HF model computes them (format tests)."""
        embeds, mask, pos = self.embed_prefix(pixels, prompt_ids, prompt_mask)
        h, _ = self.backbone(embeds, mask, pos)
        return self.language_model.lm_head(h)
