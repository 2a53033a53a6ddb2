"""Load OpenVLA-style checkpoints from a local directory, and save our own.

Two layouts are read:

* the released OpenVLA Hugging Face layout (``config.json`` with ``model_type: "openvla"``,
  ``model.safetensors`` or ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``,
  ``norm_stats`` in the config or ``dataset_statistics.json``, the Llama tokenizer). The vision towers
  are timm ViTs there; their keys are mapped onto the transformers DINOv2/SigLIP modules we use
  (fused ``attn.qkv`` split into q/k/v, LayerScale ``scale_factor`` -> ``lambda1``, DINOv2's
  class-free ``pos_embed`` given a zero class row, SigLIP's ``attn_pool`` -> ``head``).
* our own: ``config.json`` with ``format: "robo-rl-openvla"`` (the full ``VLAArch``), ``model.safetensors``
  with our module names, optional tokenizer files. Written atomically (temp dir, then rename).

Unknown or missing keys fail with the list of names; a checkpoint of another architecture fails on
its ``model_type``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from robo_rl.errors import CheckpointError
from vla.openvla.model import LLMArch, OpenVLAModel, VLAArch
from vla.openvla.text import ByteTokenizer, HFTokenizer, TextTokenizer, has_hf_tokenizer
from vla.openvla.tokenizer import NormStats
from vla.openvla.vision import VisionArch

OUR_FORMAT = "robo-rl-openvla"
# timm tower id (prefix) -> (kind, heads); sizes are read from the weights.
_TIMM_TOWERS = {"vit_large_patch14_reg4_dinov2": ("dinov2", 16), "vit_so400m_patch14_siglip": ("siglip", 16),
                "vit_base_patch14_reg4_dinov2": ("dinov2", 12), "vit_base_patch16_siglip": ("siglip", 12)}
# Llama defaults the OpenVLA text_config relies on (it stores only non-default keys).
_LLAMA_DEFAULTS = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 11008,
                   "vocab_size": 32000, "rope_theta": 10000.0, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                   "tie_word_embeddings": False, "bos_token_id": 1, "pad_token_id": None}


@dataclass
class Loaded:
    model: OpenVLAModel
    text_tokenizer: TextTokenizer
    norm_stats: NormStats | None
    append_token_id: int | None


# --- reading ------------------------------------------------------------------------------------------

def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of the shards listed in ``model.safetensors.index.json``."""
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.is_file():
        from robo_rl.checkpoint import shard_files

        files = shard_files(path, index)  # each shard confined to the checkpoint directory
    else:
        files = [path / "model.safetensors"]
    out: dict[str, torch.Tensor] = {}
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"checkpoint file '{f}' is missing")
        try:
            out.update(load_file(str(f)))
        except Exception as err:  # safetensors raises its own error types
            raise CheckpointError(f"'{f}' is not a readable safetensors file ({err})") from None
    return out


def _read_config(path: Path) -> dict[str, Any]:
    cfg_file = path / "config.json"
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory '{path}' does not exist")
    if not cfg_file.is_file():
        raise CheckpointError(f"'{path}' has no config.json; expected an OpenVLA HF checkpoint or a robo-rl VLA directory")
    try:
        return json.loads(cfg_file.read_text())
    except ValueError as err:
        raise CheckpointError(f"'{cfg_file}' is not valid JSON ({err})") from None


def load_pretrained(path: str | Path, unnorm_key: str | None = None) -> Loaded:
    """Model, prompt tokenizer and action norm stats from a local checkpoint directory."""
    path = Path(path)
    cfg = _read_config(path)
    if cfg.get("format") == OUR_FORMAT:
        return _load_ours(path, cfg, unnorm_key)
    model_type = cfg.get("model_type")
    if model_type in ("openvla", "prismatic"):
        return _load_official(path, cfg, unnorm_key)
    raise CheckpointError(f"'{path}' holds a {model_type!r} checkpoint ({cfg.get('architectures')}); "
                          "the openvla policy loads model_type 'openvla' or a robo-rl VLA directory")


# DINOv2 attention parameter names before / after transformers 5.2x renamed them.
_DINO_RENAMES = ((".attention.attention.query.", ".attention.q_proj."), (".attention.attention.key.", ".attention.k_proj."),
                 (".attention.attention.value.", ".attention.v_proj."), (".attention.output.dense.", ".attention.o_proj."))


def _to_installed_names(state: dict[str, torch.Tensor], expected: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Rename DINOv2 attention keys to the spelling of the installed transformers."""
    old_style = any(".attention.attention.query." in k for k in expected)
    out = {}
    for k, v in state.items():
        for old, new in _DINO_RENAMES:
            a, b = (new, old) if old_style else (old, new)
            if a in k and "featurizer.encoder.layer." in k:
                k = k.replace(a, b)
        out[k] = v
    return out


def _finish(model: OpenVLAModel, state: dict[str, torch.Tensor], path: Path,
            optional: tuple[str, ...] = ()) -> None:
    expected = model.state_dict()
    state = _to_installed_names(state, expected)
    missing = [k for k in expected if k not in state and not any(k.endswith(o) for o in optional)]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise CheckpointError(f"checkpoint '{path}' does not match the model: missing {missing[:8]}"
                              f"{' ...' if len(missing) > 8 else ''} ({len(missing)}), unexpected {unexpected[:8]}"
                              f"{' ...' if len(unexpected) > 8 else ''} ({len(unexpected)})")
    bad = [f"{k} {tuple(v.shape)} vs {tuple(expected[k].shape)}" for k, v in state.items() if v.shape != expected[k].shape]
    if bad:
        raise CheckpointError(f"checkpoint '{path}' has tensors of the wrong shape: {bad[:5]}")
    model.load_state_dict(state, strict=False)


def _tokenizer(path: Path) -> TextTokenizer:
    if not has_hf_tokenizer(path):
        return ByteTokenizer()
    try:
        return HFTokenizer(path)
    except (OSError, ValueError, TypeError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"'{path}' has tokenizer files that transformers cannot load ({first}); expected "
                              f"tokenizer.json or tokenizer.model with tokenizer_config.json") from None


def _load_ours(path: Path, cfg: dict[str, Any], unnorm_key: str | None) -> Loaded:
    try:
        a = cfg["arch"]
        arch = VLAArch(VisionArch(**a["vision"]), LLMArch(**a["llm"]), a["projector"], a["n_action_bins"], a["action_dim"])
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"'{path}/config.json' has a malformed arch ({err})") from None
    model = OpenVLAModel(arch)
    _finish(model, read_state_dict(path), path, optional=("lm_head.weight",) if arch.llm.tie_embeddings else ())
    if arch.llm.tie_embeddings:
        model.language_model.tie_weights()
    stats = NormStats.from_norm_stats(cfg["norm_stats"], unnorm_key) if cfg.get("norm_stats") else None
    if stats is not None and stats.action_dim != arch.action_dim:
        raise CheckpointError(f"'{path}/config.json' has {stats.action_dim}-D norm_stats but its model decodes "
                              f"{arch.action_dim}-D actions; the checkpoint is inconsistent")
    return Loaded(model, _tokenizer(path), stats, cfg.get("append_token_id"))


def save_pretrained(policy: Any, path: str | Path) -> Path:
    """Write ``policy.model`` (+ norm stats, tokenizer) as a robo-rl VLA directory, atomically."""
    from safetensors.torch import save_file

    from robo_rl.files import check_replaceable, replace_dir

    path = Path(path)
    check_replaceable(path, is_robo_rl_dir, "robo-rl OpenVLA checkpoint")
    model: OpenVLAModel = policy.model
    arch = dataclasses.asdict(model.arch)
    cfg = {"format": OUR_FORMAT, "version": 1, "arch": arch, "norm_stats": {"robo_rl": policy.norm_stats.to_dict()},
           "append_token_id": policy.append_token_id}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    lora = _lora_layers(model)
    for layer in lora:  # write LoRA-tuned weights as plain weights (W + BA); undone below
        layer.merge()
    try:
        tied = model.arch.llm.tie_embeddings  # the output head shares the input embedding: store it once
        state = {_base_name(k): v.detach().contiguous().cpu() for k, v in model.state_dict().items()
                 if "lora_" not in k and not (tied and k == "language_model.lm_head.weight")}
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        if isinstance(policy.text, HFTokenizer):
            policy.text.save(tmp)
        replace_dir(tmp, path)
    finally:
        for layer in lora:
            layer.unmerge()
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def is_robo_rl_dir(path: Path) -> bool:
    """Whether ``path`` holds a robo-rl OpenVLA-style directory (its config.json says so)."""
    try:
        return json.loads((path / "config.json").read_text()).get("format") == OUR_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _base_name(key: str) -> str:
    """A LoRA-wrapped linear keeps its weight under ``<name>.base_layer.``; plain models have ``<name>.``."""
    return key.replace(".base_layer.", ".")


def _lora_layers(model: torch.nn.Module) -> list[Any]:
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return []
    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


# --- the official OpenVLA layout ------------------------------------------------------------------------

def _tower_kind(timm_id: str) -> tuple[str, int]:
    for prefix, (kind, heads) in _TIMM_TOWERS.items():
        if timm_id.startswith(prefix):
            return kind, heads
    if "dinov2" in timm_id:
        return "dinov2", 0
    if "siglip" in timm_id:
        return "siglip", 0
    raise CheckpointError(f"vision tower {timm_id!r} is not supported; known: DINOv2 (reg4) and SigLIP timm ViTs")


def _tower_shape(state: dict[str, torch.Tensor], prefix: str, heads: int) -> tuple[int, int, int, int, int]:
    """(hidden, layers, heads, mlp, patch) of a timm ViT read off its weights."""
    try:
        proj = state[f"{prefix}patch_embed.proj.weight"]
        mlp = state[f"{prefix}blocks.0.mlp.fc1.weight"].shape[0]
    except KeyError as err:
        raise CheckpointError(f"vision tower weights {err} are missing under '{prefix}'") from None
    layers = 1 + max(int(m.group(1)) for k in state if (m := re.match(rf"{re.escape(prefix)}blocks\.(\d+)\.", k)))
    hidden = proj.shape[0]
    return hidden, layers, heads or max(1, hidden // 64), mlp, proj.shape[-1]


def official_arch(cfg: dict[str, Any], state: dict[str, torch.Tensor]) -> VLAArch:
    """Our ``VLAArch`` for an OpenVLA config.json (tower sizes read from the weights)."""
    ids = cfg.get("timm_model_ids") or []
    sizes = cfg.get("image_sizes") or [224]
    fused = bool(cfg.get("use_fused_vision_backbone", len(ids) == 2))
    if not ids or (fused and len(ids) != 2):
        raise CheckpointError(f"config.json timm_model_ids = {ids} does not describe {'two' if fused else 'one'} vision tower(s)")
    k1, h1 = _tower_kind(ids[0])
    s1 = _tower_shape(state, "vision_backbone.featurizer.", h1)
    if fused:
        k2, h2 = _tower_kind(ids[1])
        if (k1, k2) != ("dinov2", "siglip"):
            raise CheckpointError(f"fused towers {ids} are not supported; expected [DINOv2, SigLIP]")
        s2 = _tower_shape(state, "vision_backbone.fused_featurizer.", h2)
        vision = VisionArch("dinosiglip", int(sizes[0]), s1[4], s1[0], s1[1], s1[2], s1[3], s2[0], s2[1], s2[2], s2[3],
                            "gelu")  # timm's ViT (OpenVLA's towers) uses exact GELU
    else:
        vision = VisionArch(k1, int(sizes[0]), s1[4], *s1[:4], siglip_act="gelu")  # type: ignore[arg-type]
    text = {**_LLAMA_DEFAULTS, **(cfg.get("text_config") or {})}
    if text.get("model_type", "llama") != "llama":
        raise CheckpointError(f"text_config model_type {text.get('model_type')!r} is not supported; the LM must be Llama")
    pad_multiple = int(cfg.get("pad_to_multiple_of", 0) or 0)
    vocab = int(text["vocab_size"])
    pad_id = cfg.get("pad_token_id", text.get("pad_token_id"))
    llm = LLMArch(int(text["hidden_size"]), int(text["num_hidden_layers"]), int(text["num_attention_heads"]),
                  int(text.get("num_key_value_heads") or text["num_attention_heads"]), int(text["intermediate_size"]),
                  vocab, vocab - pad_multiple, float(text["rope_theta"]), int(text["max_position_embeddings"]),
                  float(text["rms_norm_eps"]), bool(text["tie_word_embeddings"]), int(text["bos_token_id"]),
                  int(pad_id if pad_id is not None else 0))
    spec = str(cfg.get("arch_specifier", "gelu-mlp"))
    projector = "fused-gelu-mlp" if "fused-gelu-mlp" in spec else "gelu-mlp"
    if "gelu-mlp" not in spec:
        raise CheckpointError(f"arch_specifier {spec!r} is not supported; expected '...gelu-mlp' or '...fused-gelu-mlp'")
    return VLAArch(vision, llm, projector, int(cfg.get("n_action_bins", 256)), 7)


def _map_attention(out: dict[str, torch.Tensor], block: str, rest: str, v: torch.Tensor, attn: str, proj: str) -> bool:
    """timm's fused ``attn.qkv`` (split in q, k, v order) and ``attn.proj`` of one block; False if
    ``rest`` is neither."""
    suffix = rest.rsplit(".", 1)[1]
    if rest.startswith("attn.qkv."):
        for part, t in zip(("q_proj", "k_proj", "v_proj"), v.chunk(3, dim=0)):
            out[f"{block}{attn}.{part}.{suffix}"] = t
        return True
    if rest.startswith("attn.proj."):
        out[f"{block}{attn}.{proj}.{suffix}"] = v
        return True
    return False


def _map_dinov2(src: dict[str, torch.Tensor], p: str, q: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for k, v in src.items():
        if not k.startswith(p):
            continue
        name = k[len(p):]
        if name == "cls_token":
            out[q + "embeddings.cls_token"] = v
        elif name == "reg_token":
            out[q + "embeddings.register_tokens"] = v
        elif name == "pos_embed":  # class-free position table: the class token gets a zero row
            out[q + "embeddings.position_embeddings"] = torch.cat([torch.zeros_like(v[:, :1]), v], dim=1)
        elif name.startswith("patch_embed.proj."):
            out[q + "embeddings.patch_embeddings.projection." + name.rsplit(".", 1)[1]] = v
        elif name.startswith("norm."):
            out[q + "layernorm." + name.split(".", 1)[1]] = v
        elif m := re.match(r"blocks\.(\d+)\.(.+)", name):
            i, rest = m.groups()
            b = f"{q}encoder.layer.{i}."
            if _map_attention(out, b, rest, v, "attention", "o_proj"):
                pass
            elif rest in ("ls1.scale_factor", "ls2.scale_factor"):
                out[b + f"layer_scale{rest[2]}.lambda1"] = v
            else:
                out[b + rest] = v  # norm1, norm2, mlp.fc1, mlp.fc2
        else:
            out[k] = v  # unknown: reported under its checkpoint name
    return out


def _map_siglip(src: dict[str, torch.Tensor], p: str, q: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    pool_q: dict[str, torch.Tensor] = {}
    pool_kv: dict[str, torch.Tensor] = {}
    for k, v in src.items():
        if not k.startswith(p):
            continue
        name = k[len(p):]
        if name == "pos_embed":
            out[q + "embeddings.position_embedding.weight"] = v[0]
        elif name.startswith("patch_embed.proj."):
            out[q + "embeddings.patch_embedding." + name.rsplit(".", 1)[1]] = v
        elif name.startswith("norm."):
            out[q + "post_layernorm." + name.split(".", 1)[1]] = v
        elif name == "attn_pool.latent":
            out[q + "head.probe"] = v
        elif name.startswith("attn_pool.q."):
            pool_q[name.rsplit(".", 1)[1]] = v
        elif name.startswith("attn_pool.kv."):
            pool_kv[name.rsplit(".", 1)[1]] = v
        elif name.startswith("attn_pool.proj."):
            out[q + "head.attention.out_proj." + name.rsplit(".", 1)[1]] = v
        elif name.startswith("attn_pool.norm."):
            out[q + "head.layernorm." + name.rsplit(".", 1)[1]] = v
        elif name.startswith("attn_pool.mlp."):
            out[q + "head.mlp." + name.split(".", 2)[2]] = v
        elif m := re.match(r"blocks\.(\d+)\.(.+)", name):
            i, rest = m.groups()
            b = f"{q}encoder.layers.{i}."
            if _map_attention(out, b, rest, v, "self_attn", "out_proj"):
                pass
            elif rest.startswith("norm1.") or rest.startswith("norm2."):
                out[b + f"layer_norm{rest[4]}." + rest.split(".", 1)[1]] = v
            else:
                out[b + rest] = v  # mlp.fc1, mlp.fc2
        else:
            out[k] = v  # unknown: reported under its checkpoint name
    for suffix in ("weight", "bias"):
        if suffix in pool_q and suffix in pool_kv:
            out[q + f"head.attention.in_proj_{suffix}"] = torch.cat([pool_q[suffix], pool_kv[suffix]], dim=0)
    return out


def map_official_keys(state: dict[str, torch.Tensor], arch: VLAArch) -> dict[str, torch.Tensor]:
    """OpenVLA HF state dict -> our ``OpenVLAModel`` state dict (names only; values shared)."""
    out = {k: v for k, v in state.items() if k.startswith(("projector.", "language_model."))}
    kind = arch.vision.kind
    f_in, f_out = "vision_backbone.featurizer.", "vision_backbone.featurizer."
    if kind in ("dinov2", "dinosiglip"):
        out.update(_map_dinov2(state, f_in, f_out))
    else:
        out.update(_map_siglip(state, f_in, f_out))
    if kind == "dinosiglip":
        out.update(_map_siglip(state, "vision_backbone.fused_featurizer.", "vision_backbone.fused_featurizer."))
    leftover = [k for k in state if not k.startswith(("projector.", "language_model.", "vision_backbone.featurizer.",
                                                        "vision_backbone.fused_featurizer."))]
    out.update({k: state[k] for k in leftover})
    return out


def _official_norm_stats(path: Path, cfg: dict[str, Any], key: str | None) -> NormStats:
    stats = cfg.get("norm_stats")
    if not stats and (path / "dataset_statistics.json").is_file():
        try:
            stats = json.loads((path / "dataset_statistics.json").read_text())
        except json.JSONDecodeError as err:
            raise CheckpointError(f"'{path}/dataset_statistics.json' is not valid JSON ({err})") from None
    if not stats:
        raise CheckpointError(f"'{path}' has no norm_stats (config.json) or dataset_statistics.json; "
                              "actions cannot be un-normalized")
    return NormStats.from_norm_stats(stats, key)


def _load_official(path: Path, cfg: dict[str, Any], unnorm_key: str | None) -> Loaded:
    state = read_state_dict(path)
    arch = official_arch(cfg, state)
    stats = _official_norm_stats(path, cfg, unnorm_key)
    arch = dataclasses.replace(arch, action_dim=stats.action_dim)
    model = OpenVLAModel(arch)
    mapped = map_official_keys(state, arch)
    # DINOv2's mask token is not part of the timm tower (unused at inference): keep its init.
    _finish(model, mapped, path, optional=("embeddings.mask_token",))
    tok = _tokenizer(path)
    # OpenVLA's predict_action appends the Llama "▁" token (29871) to the prompt; only for its 32k vocab.
    append = 29871 if arch.llm.base_vocab == 32000 else None
    return Loaded(model, tok, stats, append)
