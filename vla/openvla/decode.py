"""Batch decoding of action tokens with a KV cache, and the teacher-forced recomputation PPO needs.

Both work on action *indices* k in [0, n_bins) (token id = first_id + k) and on the distribution
``softmax(action_logits / temperature)`` restricted to the n_bins action ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vla.openvla.model import OpenVLAModel


@dataclass
class DecodeOutput:
    """index (B, A) long; log_prob, entropy (B, A) per token; prefix_hidden (B, D): the hidden state
    just before the first action token (what the value head reads)."""

    index: torch.Tensor
    log_prob: torch.Tensor
    entropy: torch.Tensor
    prefix_hidden: torch.Tensor


def _dist_terms(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp, entropy


def batch_decode(model: OpenVLAModel, pixels: torch.Tensor, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 temperature: float = 1.0, greedy: bool = False,
                 generator: torch.Generator | None = None, extra: torch.Tensor | None = None,
                 n_tokens: int | None = None) -> DecodeOutput:
    """Decode ``n_tokens`` action tokens (default ``action_dim``: one action; E x A for a chunk of E
    actions) for all B rows in one batched pass per token (prefix once, then one cached step per token).
    pixels (B, C, H, W); prompt_ids/mask (B, L); extra (B, K, D) or None. Output tensors (B, n_tokens)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature}); use greedy=True for argmax decoding")
    n_tokens = model.arch.action_dim if n_tokens is None else n_tokens
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1 (got {n_tokens})")
    embeds, mask, pos = model.embed_prefix(pixels, prompt_ids, prompt_mask, extra)
    hidden, cache = model.backbone(embeds, mask, pos, use_cache=True)
    last = hidden[:, -1]
    prefix_hidden = last
    next_pos = pos[:, -1:] + 1
    idx, logps, ents = [], [], []
    for step in range(n_tokens):
        logp, ent = _dist_terms(model.action_logits(last), temperature)
        if greedy:
            k = logp.argmax(-1)
        else:
            k = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        idx.append(k)
        logps.append(logp.gather(-1, k[:, None]).squeeze(-1))
        ents.append(ent)
        if step == n_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        h, cache = model.backbone(model.embed_action_index(k[:, None]), mask, next_pos, cache=cache, use_cache=True)
        last = h[:, -1]
        next_pos = next_pos + 1
    return DecodeOutput(torch.stack(idx, 1), torch.stack(logps, 1), torch.stack(ents, 1), prefix_hidden)


def teacher_forced(model: OpenVLAModel, pixels: torch.Tensor, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                   index: torch.Tensor, temperature: float = 1.0, extra: torch.Tensor | None = None) -> DecodeOutput:
    """Log-probs and entropies (B, N) of stored action indices (B, N) (N = A, or E x A for a chunk) in
    one forward pass."""
    h = _forced_hidden(model, pixels, prompt_ids, prompt_mask, index, extra)
    logp, ent = _dist_terms(model.action_logits(h), temperature)
    return DecodeOutput(index, logp.gather(-1, index[..., None]).squeeze(-1), ent, h[:, 0])


def teacher_forced_distribution(model: OpenVLAModel, pixels: torch.Tensor, prompt_ids: torch.Tensor,
                                prompt_mask: torch.Tensor, index: torch.Tensor, temperature: float = 1.0,
                                extra: torch.Tensor | None = None) -> torch.distributions.Categorical:
    """The whole next-token distribution over the n_bins action indices at each of the N positions of
    stored indices (B, N), each conditioned on the stored tokens before it: a ``Categorical`` of batch
    shape (B, N) (its ``log_prob(index)`` is ``teacher_forced``'s log_prob)."""
    h = _forced_hidden(model, pixels, prompt_ids, prompt_mask, index, extra)
    return torch.distributions.Categorical(logits=model.action_logits(h).float() / temperature)  # normalizes itself


def _forced_hidden(model: OpenVLAModel, pixels: torch.Tensor, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                   index: torch.Tensor, extra: torch.Tensor | None) -> torch.Tensor:
    """(B, N, D) hidden states that predict each stored action index (B, N), in one forward pass."""
    embeds, mask, pos = model.embed_prefix(pixels, prompt_ids, prompt_mask, extra)
    a = index.shape[1]
    act_emb = model.embed_action_index(index[:, :-1])
    embeds = torch.cat([embeds, act_emb.to(embeds.dtype)], dim=1)
    mask = torch.cat([mask, torch.ones(mask.shape[0], a - 1, dtype=mask.dtype, device=mask.device)], dim=1)
    pos = torch.cat([pos, pos[:, -1:] + torch.arange(1, a, device=pos.device)[None]], dim=1)
    hidden, _ = model.backbone(embeds, mask, pos)
    return hidden[:, -a:]
