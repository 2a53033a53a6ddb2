"""The released OpenVLA HF layout (written here at tiny size, with the official key names, config
schema and sharding) loads, reproduces its logits after our save/load, and bad checkpoints fail
with the list of what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from robo_rl.errors import CheckpointError
from vla.openvla.checkpoint import load_pretrained
from vla.openvla.policy import OpenVLAConfig, OpenVLAPolicy

D1, L1, D2, L2, PATCH, IMG = 32, 2, 48, 3, 8, 32  # DINOv2 and SigLIP towers, 16 patches each
H, VOCAB, PAD = 64, 576, 64  # Llama hidden; embedding rows = 512 base ids + 64 padding
NORM = {"tiny_ds": {"action": {"q01": [-0.5] * 6 + [0.0], "q99": [0.5] * 6 + [1.0], "mask": [True] * 6 + [False],
                               "mean": [0.0] * 7, "std": [1.0] * 7, "max": [1.0] * 7, "min": [-1.0] * 7},
                    "proprio": {"q01": [0.0] * 7, "q99": [0.0] * 7}, "num_transitions": 10, "num_trajectories": 1}}


def _timm_vit(g: torch.Generator, prefix: str, d: int, layers: int, dino: bool) -> dict[str, torch.Tensor]:
    """timm VisionTransformer keys as OpenVLA's checkpoint stores them."""
    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.05

    n = (IMG // PATCH) ** 2
    s = {f"{prefix}pos_embed": r(1, n, d), f"{prefix}patch_embed.proj.weight": r(d, 3, PATCH, PATCH),
         f"{prefix}patch_embed.proj.bias": r(d), f"{prefix}norm.weight": 1 + r(d), f"{prefix}norm.bias": r(d)}
    if dino:
        s[f"{prefix}cls_token"] = r(1, 1, d)
        s[f"{prefix}reg_token"] = r(1, 4, d)
    for i in range(layers):
        b = f"{prefix}blocks.{i}."
        s.update({b + "norm1.weight": 1 + r(d), b + "norm1.bias": r(d), b + "attn.qkv.weight": r(3 * d, d),
                  b + "attn.qkv.bias": r(3 * d), b + "attn.proj.weight": r(d, d), b + "attn.proj.bias": r(d),
                  b + "norm2.weight": 1 + r(d), b + "norm2.bias": r(d), b + "mlp.fc1.weight": r(4 * d, d),
                  b + "mlp.fc1.bias": r(4 * d), b + "mlp.fc2.weight": r(d, 4 * d), b + "mlp.fc2.bias": r(d)})
        if dino:  # LayerScale gamma renamed to scale_factor by OpenVLA
            s[b + "ls1.scale_factor"] = 1e-1 + r(d)
            s[b + "ls2.scale_factor"] = 1e-1 + r(d)
    if not dino:  # SigLIP's MAP head exists in the checkpoint although unused
        p = f"{prefix}attn_pool."
        s.update({p + "latent": r(1, 1, d), p + "q.weight": r(d, d), p + "q.bias": r(d), p + "kv.weight": r(2 * d, d),
                  p + "kv.bias": r(2 * d), p + "proj.weight": r(d, d), p + "proj.bias": r(d), p + "norm.weight": 1 + r(d),
                  p + "norm.bias": r(d), p + "mlp.fc1.weight": r(4 * d, d), p + "mlp.fc1.bias": r(4 * d),
                  p + "mlp.fc2.weight": r(d, 4 * d), p + "mlp.fc2.bias": r(d)})
    return s


def write_official(path: Path, drop: str | None = None, extra: str | None = None) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    g = torch.Generator().manual_seed(0)
    state = _timm_vit(g, "vision_backbone.featurizer.", D1, L1, dino=True)
    state.update(_timm_vit(g, "vision_backbone.fused_featurizer.", D2, L2, dino=False))
    f = D1 + D2
    state.update({"projector.fc1.weight": torch.randn(4 * f, f, generator=g) * 0.05, "projector.fc1.bias": torch.zeros(4 * f),
                  "projector.fc2.weight": torch.randn(H, 4 * f, generator=g) * 0.05, "projector.fc2.bias": torch.zeros(H),
                  "projector.fc3.weight": torch.randn(H, H, generator=g) * 0.05, "projector.fc3.bias": torch.zeros(H)})
    text_config = {"model_type": "llama", "hidden_size": H, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "intermediate_size": 128, "vocab_size": VOCAB, "pad_token_id": 512, "torch_dtype": "bfloat16"}
    torch.manual_seed(1)
    lm = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in text_config.items() if k != "model_type"}))
    state.update({f"language_model.{k}": v for k, v in lm.state_dict().items()})
    if drop:
        state.pop(drop)
    if extra:
        state[extra] = torch.zeros(3)
    path.mkdir(parents=True, exist_ok=True)
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2], "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    weight_map = {}
    for name, ks in shards.items():
        save_file({k: state[k].contiguous() for k in ks}, str(path / name))
        weight_map.update({k: name for k in ks})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    config = {"model_type": "openvla", "architectures": ["OpenVLAForActionPrediction"],
              "auto_map": {"AutoConfig": "configuration_prismatic.OpenVLAConfig",
                           "AutoModelForVision2Seq": "modeling_prismatic.OpenVLAForActionPrediction"},
              "vision_backbone_id": "dinosiglip-vit-so-224px", "llm_backbone_id": "llama2-7b-pure",
              "arch_specifier": "no-align+fused-gelu-mlp", "use_fused_vision_backbone": True,
              "image_resize_strategy": "resize-naive", "image_sizes": [IMG, IMG],
              "timm_model_ids": ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"],
              "timm_override_act_layers": [None, None], "llm_max_length": 2048, "pad_token_id": 512,
              "pad_to_multiple_of": PAD, "output_projector_states": False, "n_action_bins": 256,
              "torch_dtype": "bfloat16", "text_config": text_config, "norm_stats": NORM}
    (path / "config.json").write_text(json.dumps(config))
    return path


def _inputs(policy: OpenVLAPolicy) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rgb = np.random.default_rng(0).integers(0, 255, (2, 1, 64, 64, 3), dtype=np.uint8)
    ids, mask = policy.prompts({"instruction": ["pick up the cube", "open the drawer"]}, 2)
    return policy.pixels(rgb), ids, mask


def test_official_layout_loads_and_round_trips_through_our_format(tmp_path):
    ckpt = write_official(tmp_path / "openvla-tiny")
    policy = OpenVLAPolicy(OpenVLAConfig(checkpoint=str(ckpt))).eval()
    arch = policy.model.arch
    assert arch.vision.kind == "dinosiglip" and arch.projector == "fused-gelu-mlp"
    assert arch.llm.base_vocab == 512 and policy.model.action_tokenizer.first_id == 256
    assert policy.norm_stats.mask[-1] is False and policy.append_token_id is None
    # the timm LayerScale and fused qkv arrived in the transformers modules
    dino = policy.model.vision_backbone.featurizer
    src = load_pretrained(ckpt).model  # fresh load, same weights
    torch.testing.assert_close(dino.encoder.layer[1].layer_scale2.lambda1, src.vision_backbone.featurizer.encoder.layer[1].layer_scale2.lambda1)
    with torch.no_grad():
        logits = policy.model.full_logits(*_inputs(policy))
        saved = policy.save_pretrained(tmp_path / "ours")
        again = OpenVLAPolicy(OpenVLAConfig(checkpoint=str(saved))).eval()
        logits2 = again.model.full_logits(*_inputs(again))
    assert logits.shape[-1] == VOCAB and torch.isfinite(logits).all()
    torch.testing.assert_close(logits, logits2, atol=1e-5, rtol=0)
    assert again.norm_stats == policy.norm_stats
    # timm's ViT (OpenVLA's SigLIP) uses exact GELU, not transformers' SigLIP default (tanh approximation)
    for p in (policy, again):
        assert p.model.vision_backbone.fused_featurizer.config.hidden_act == "gelu"
    # actions un-normalize with the checkpoint's q01/q99; the gripper dim passes through
    with torch.no_grad():
        acts = again.act({"rgb": np.zeros((2, 1, 64, 64, 3), np.uint8), "instruction": ["a", "b"]}).actions
    assert torch.all(acts[:, :6].abs() <= 0.5 + 1e-6) and torch.all(acts[:, 6].abs() <= 1.0)


def _timm_forward(raw: dict[str, torch.Tensor], prefix: str, x: torch.Tensor, d: int, layers: int, heads: int,
                  dino: bool) -> torch.Tensor:
    """timm's VisionTransformer on the checkpoint's own tensors (pre-norm blocks, fused qkv, exact GELU,
    LayerScale for DINOv2, cls + 4 registers prepended after the position embedding), returning the
    second-to-last block's patch tokens as OpenVLA's featurizer does."""
    import torch.nn.functional as F

    w = {k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix)}
    x = F.conv2d(x, w["patch_embed.proj.weight"], w["patch_embed.proj.bias"], stride=PATCH).flatten(2).transpose(1, 2)
    x = x + w["pos_embed"]
    if dino:
        x = torch.cat([w["cls_token"].expand(len(x), -1, -1), w["reg_token"].expand(len(x), -1, -1), x], 1)
    outs = []
    for i in range(layers):
        blk = {k[len(f"blocks.{i}."):]: v for k, v in w.items() if k.startswith(f"blocks.{i}.")}
        h = F.layer_norm(x, (d,), blk["norm1.weight"], blk["norm1.bias"], 1e-6)
        q, k, v = F.linear(h, blk["attn.qkv.weight"], blk["attn.qkv.bias"]).reshape(
            len(x), -1, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(len(x), -1, d)
        a = F.linear(a, blk["attn.proj.weight"], blk["attn.proj.bias"])
        x = x + (a * blk["ls1.scale_factor"] if dino else a)
        h = F.layer_norm(x, (d,), blk["norm2.weight"], blk["norm2.bias"], 1e-6)
        h = F.linear(F.gelu(F.linear(h, blk["mlp.fc1.weight"], blk["mlp.fc1.bias"])), blk["mlp.fc2.weight"],
                     blk["mlp.fc2.bias"])
        x = x + (h * blk["ls2.scale_factor"] if dino else h)
        outs.append(x)
    return outs[-2][:, 5:] if dino else outs[-2]


def test_vision_towers_compute_what_timm_computes_on_the_released_weights(tmp_path):
    """The loaded DINOv2 + SigLIP towers against a timm-semantics forward over the raw checkpoint tensors
    (catches key mapping, qkv order, LayerScale, prefix tokens and the activation, e.g. SigLIP's GELU
    variant, which only shifts activations by ~1e-4 here)."""
    from vla.openvla.checkpoint import read_state_dict

    ckpt = write_official(tmp_path / "c")
    raw = read_state_dict(ckpt)
    model = load_pretrained(ckpt).model.eval()
    vb = model.vision_backbone
    px = torch.randn(2, 6, IMG, IMG, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = vb(px)
        dino = _timm_forward(raw, "vision_backbone.featurizer.", px[:, :3], D1, L1,
                             vb.featurizer.config.num_attention_heads, dino=True)
        sig = _timm_forward(raw, "vision_backbone.fused_featurizer.", px[:, 3:], D2, L2,
                            vb.fused_featurizer.config.num_attention_heads, dino=False)
    torch.testing.assert_close(ours[..., :D1], dino, atol=1e-6, rtol=0)
    torch.testing.assert_close(ours[..., D1:], sig, atol=1e-6, rtol=0)


def test_split_qkv_follows_timm_order(tmp_path):
    ckpt = write_official(tmp_path / "c")
    from vla.openvla.checkpoint import read_state_dict

    raw = read_state_dict(ckpt)
    model = load_pretrained(ckpt).model
    qkv = raw["vision_backbone.fused_featurizer.blocks.0.attn.qkv.weight"]
    attn = model.vision_backbone.fused_featurizer.encoder.layers[0].self_attn
    torch.testing.assert_close(attn.q_proj.weight, qkv[:D2])
    torch.testing.assert_close(attn.v_proj.weight, qkv[2 * D2:])
    pos = raw["vision_backbone.featurizer.pos_embed"]
    emb = model.vision_backbone.featurizer.embeddings.position_embeddings
    assert torch.all(emb[:, 0] == 0) and torch.equal(emb[:, 1:], pos)


def test_missing_and_unknown_keys_are_listed(tmp_path):
    with pytest.raises(CheckpointError, match=r"missing \['projector.fc3.bias'\]"):
        load_pretrained(write_official(tmp_path / "a", drop="projector.fc3.bias"))
    with pytest.raises(CheckpointError, match=r"unexpected \['action_head.weight'\]"):
        load_pretrained(write_official(tmp_path / "b", extra="action_head.weight"))


def test_other_architectures_and_missing_stats_fail(tmp_path):
    other = tmp_path / "llava"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"]}))
    with pytest.raises(CheckpointError, match="holds a 'llava' checkpoint"):
        load_pretrained(other)
    ckpt = write_official(tmp_path / "c")
    with pytest.raises(CheckpointError, match="'bridge_orig' are missing; the checkpoint has \\['tiny_ds'\\]"):
        load_pretrained(ckpt, unnorm_key="bridge_orig")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.pop("norm_stats")
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no norm_stats"):
        load_pretrained(ckpt)
    (ckpt / "dataset_statistics.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="dataset_statistics.json' is not valid JSON"):
        load_pretrained(ckpt)
    (ckpt / "dataset_statistics.json").write_text(json.dumps({"ds": [1, 2]}))
    with pytest.raises(CheckpointError, match=r"norm_stats\['ds'\] must be \{'action'"):
        load_pretrained(ckpt)
    tok = write_official(tmp_path / "tok")
    (tok / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    with pytest.raises(CheckpointError, match="tokenizer files that transformers cannot load"):
        load_pretrained(tok)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_pretrained(tmp_path / "nowhere")
