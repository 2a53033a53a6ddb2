"""The openpi PyTorch key layout of pi0 (also LeRobot's, after its ``model.`` prefix): key names,
their transformers PI0 names, and the architecture read off the tensor shapes.

openpi keys (``examples/convert_jax_model_to_pytorch.py``; ``save_model`` keeps one name of a tied
pair, so the PaliGemma token embedding is stored as ``paligemma.lm_head.weight``)::

    paligemma_with_expert.paligemma.model.vision_tower.vision_model.{embeddings,encoder.layers.N,post_layernorm}.*
    paligemma_with_expert.paligemma.model.multi_modal_projector.linear.{weight,bias}
    paligemma_with_expert.paligemma.model.language_model.{layers.N.*,norm.weight}   (+ embed_tokens.weight: LeRobot)
    paligemma_with_expert.paligemma.lm_head.weight                                  (vocab, lm_hidden)
    paligemma_with_expert.gemma_expert.model.{layers.N.*,norm.weight}
    paligemma_with_expert.gemma_expert.lm_head.weight                               (vocab, expert_hidden)
    state_proj / action_in_proj / action_out_proj / action_time_mlp_in / action_time_mlp_out .{weight,bias}

Mapped as transformers' "pi0" ``WeightRenaming`` rules do (``conversion_mapping.py``), plus its
SigLIP ``vision_model.`` prefix removal. The expert's lm_head goes to ``model.dit.embed_tokens`` like
transformers does; pi0 never reads either (openpi sets the expert's ``embed_tokens = None`` and its
converter leaves that lm_head untrained), so nothing depends on it. When both the PaliGemma
``lm_head`` and ``embed_tokens`` are present, ``embed_tokens`` is the one pi0 reads (openpi embeds the
prompt with it; lm_head is never applied) and lm_head is dropped.

Sizes: layer counts from the highest layer index; widths / MLP sizes from weight shapes; Gemma
heads = q_proj rows / head_dim and KV heads = k_proj rows / head_dim, head_dim from the variant
(openpi ``models/gemma.py`` ``get_config``); SigLIP heads from its width by big_vision's ViT table
(``decode_variant``, copied in openpi's ``models/siglip.py``), patch from the patch-embedding
kernel, image size from the position table ((image / patch)^2 rows).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from robo_rl.errors import CheckpointError
from vla.pi0.model import Pi0Arch

PG = "paligemma_with_expert.paligemma."
EXPERT = "paligemma_with_expert.gemma_expert."
VISION = PG + "model.vision_tower.vision_model."
LM = PG + "model.language_model."
DIT_EMBED = "model.dit.embed_tokens.weight"
VLM_EMBED = "model.vlm.language_model.embed_tokens.weight"
# openpi prefix -> transformers PI0 prefix (first match wins)
RENAMES = (
    (VISION, "model.vlm.vision_tower."),
    (PG + "model.multi_modal_projector.", "model.vlm.multi_modal_projector."),
    (LM, "model.vlm.language_model."),
    (EXPERT + "model.", "model.dit."),
    (EXPERT + "lm_head.", "model.dit.embed_tokens."),
    ("state_proj.", "embed_action_time.state_proj."),
    ("action_in_proj.", "embed_action_time.action_in_proj."),
    ("action_time_mlp_in.", "embed_action_time.action_time_mlp_in."),
    ("action_time_mlp_out.", "embed_action_time.action_time_mlp_out."),
    ("time_mlp_in.", "embed_action_time.action_time_mlp_in."),  # older pi0 spelling LeRobot renames
    ("time_mlp_out.", "embed_action_time.action_time_mlp_out."),
    ("action_out_proj.", "action_out_proj."),
)
# openpi gemma.get_config: width, depth, mlp_dim, num_heads, num_kv_heads, head_dim
GEMMA_VARIANTS = {"dummy": (64, 4, 128, 8, 1, 16), "gemma_300m": (1024, 18, 4096, 8, 1, 256),
                  "gemma_2b": (2048, 18, 16384, 8, 1, 256)}
GEMMA_VARIANTS.update({"gemma_300m_lora": GEMMA_VARIANTS["gemma_300m"], "gemma_2b_lora": GEMMA_VARIANTS["gemma_2b"]})
# big_vision ViT widths -> heads (mu, Ti, S, M, B, L, So400m, H, g, g-opt/G-opt, G, e)
VIT_HEADS = {32: 2, 192: 3, 384: 6, 512: 8, 768: 12, 1024: 16, 1152: 16, 1280: 16, 1408: 16, 1536: 16, 1664: 16, 1792: 16}


def map_openpi_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """openpi-named tensors -> transformers PI0 names (values shared); unknown keys keep their name."""
    out: dict[str, torch.Tensor] = {}
    lm_head = state.get(PG + "lm_head.weight")
    for k, v in state.items():
        if k == PG + "lm_head.weight":
            continue
        new = next((hf + k[len(op):] for op, hf in RENAMES if k.startswith(op)), k)
        if new in out:
            raise CheckpointError(f"checkpoint tensors {k} and another key both map to {new}")
        out[new] = v
    if lm_head is not None and VLM_EMBED not in out:
        out[VLM_EMBED] = lm_head  # tied: the prompt embedding was saved under the lm_head name
    return out


def openpi_name(key: str) -> str:
    """transformers PI0 name -> the openpi name it is read from (for messages)."""
    special = {VLM_EMBED: PG + "lm_head.weight", DIT_EMBED: EXPERT + "lm_head.weight"}
    if key in special:
        return special[key]
    return next((op + key[len(hf):] for op, hf in RENAMES if key.startswith(hf) and not op.startswith("time_")), key)


def reject_unsupported(state: dict[str, torch.Tensor], path: Path) -> None:
    """pi0.5 (adaRMS expert norms, no state_proj) and legacy LeRobot pi0 files fail with one line."""
    if any(re.search(r"(layernorm|norm)\.dense\.", k) for k in state if k.startswith(EXPERT)) or (
            "state_proj.weight" not in state and "time_mlp_in.weight" in state):
        raise CheckpointError(f"'{path}' is a pi0.5 checkpoint (adaRMS expert norms, no state_proj); "
                              "pi0.5 is not supported yet, only pi0")
    if any(k.startswith((PG + "language_model.model.", "normalize_inputs.")) for k in state):
        raise CheckpointError(f"'{path}' is a legacy LeRobot pi0 checkpoint (before the openpi port, 2025-09); "
                              "re-save it with a current LeRobot")


def _get(state: dict[str, torch.Tensor], key: str, path: Path) -> torch.Tensor:
    if key not in state:
        raise CheckpointError(f"checkpoint '{path}' lacks {key}, needed to read the model size")
    return state[key]


def _depth(state: dict[str, torch.Tensor], prefix: str, path: Path) -> int:
    idx = [int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))]
    if not idx:
        raise CheckpointError(f"checkpoint '{path}' has no {prefix}<i>.* tensors")
    return max(idx) + 1


def gemma_sizes(state: dict[str, torch.Tensor], prefix: str, variant: str | None, field: str,
                path: Path) -> tuple[int, int, int, int, int, int]:
    """(width, depth, mlp, heads, kv heads, head_dim) of the Gemma under ``prefix``, checked against
    the variant named by config field ``field``."""
    if variant not in GEMMA_VARIANTS:
        raise CheckpointError(f"'{path}/config.json' {field} = {variant!r} is not an openpi Gemma variant; "
                              f"known: {', '.join(GEMMA_VARIANTS)}")
    spec = GEMMA_VARIANTS[variant]
    hd = spec[5]
    q = _get(state, prefix + "layers.0.self_attn.q_proj.weight", path)  # (heads * head_dim, width)
    k = _get(state, prefix + "layers.0.self_attn.k_proj.weight", path)  # (kv_heads * head_dim, width)
    mlp = _get(state, prefix + "layers.0.mlp.gate_proj.weight", path).shape[0]
    got = (q.shape[1], _depth(state, prefix + "layers.", path), mlp, q.shape[0] / hd, k.shape[0] / hd, hd)
    if got != spec:
        fmt = "width {}, depth {}, mlp {}, heads {:g}, kv heads {:g}, head_dim {}"
        raise CheckpointError(f"'{path}/config.json' {field} = {variant!r} ({fmt.format(*spec)}) does not match the "
                              f"weights under {prefix} ({fmt.format(*got)})")
    return spec


def infer_arch(state: dict[str, torch.Tensor], path: Path, paligemma: str | None, expert: str | None, chunk: int,
               num_steps: int, cameras: int) -> Pi0Arch:
    """``Pi0Arch`` of openpi-named ``state`` (tensor shapes), checked against the config's variants."""
    patch = _get(state, VISION + "embeddings.patch_embedding.weight", path)  # (D, 3, p, p)
    rows = _get(state, VISION + "embeddings.position_embedding.weight", path).shape[0]  # (image / p)^2
    side = math.isqrt(rows)
    if side * side != rows:
        raise CheckpointError(f"checkpoint '{path}' SigLIP position table has {rows} rows, not a square patch grid")
    width = patch.shape[0]
    if width not in VIT_HEADS:
        raise CheckpointError(f"checkpoint '{path}' SigLIP width {width} is not a big_vision ViT width "
                              f"({', '.join(map(str, VIT_HEADS))}); its head count is unknown")
    lm = gemma_sizes(state, LM, paligemma, "paligemma_variant", path)
    ex = gemma_sizes(state, EXPERT + "model.", expert, "action_expert_variant", path)
    if (ex[1], ex[4], ex[5]) != (lm[1], lm[4], lm[5]):
        raise CheckpointError(f"checkpoint '{path}': the action expert (depth {ex[1]}, kv heads {ex[4]}, head_dim "
                              f"{ex[5]}) must match the PaliGemma LM ({lm[1]}, {lm[4]}, {lm[5]}) to share its KV cache")
    emb = state.get(LM + "embed_tokens.weight")
    vocab = (emb if emb is not None else _get(state, PG + "lm_head.weight", path)).shape[0]
    s_in = _get(state, "state_proj.weight", path).shape[1]  # (expert_hidden, max_state_dim)
    a_in = _get(state, "action_in_proj.weight", path).shape[1]  # (expert_hidden, max_action_dim)
    return Pi0Arch(image_size=side * patch.shape[-1], patch_size=patch.shape[-1], vision_hidden=width,
                   vision_layers=_depth(state, VISION + "encoder.layers.", path), vision_heads=VIT_HEADS[width],
                   vision_mlp=_get(state, VISION + "encoder.layers.0.mlp.fc1.weight", path).shape[0],
                   lm_hidden=lm[0], lm_layers=lm[1], lm_heads=lm[3], lm_kv_heads=lm[4], head_dim=lm[5], lm_mlp=lm[2],
                   vocab_size=vocab, expert_hidden=ex[0], expert_mlp=ex[2], expert_heads=ex[3], chunk_size=chunk,
                   max_state_dim=s_in, max_action_dim=a_in, num_steps=num_steps, cameras=cameras)
