"""pi0 checkpoints in the transformers, openpi and LeRobot layouts (written here at tiny size with
the official key names, config schemas and norm-stat files) load with sizes read off the tensors,
reproduce the original model's ODE samples, bring their norm stats, and survive our save/load; bad
checkpoints fail with one line naming what is wrong.

openpi / LeRobot configs can only name openpi Gemma variants, so those checkpoints use the tiny
preset with the Gemma sizes of openpi's "dummy" variant (``models/gemma.py``; LeRobot itself only
accepts gemma_300m / gemma_2b, too big for a unit test) and openpi's 10 denoising steps.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from robo_rl.contracts import ArraySpec
from robo_rl.errors import CheckpointError
from vla.pi0.checkpoint import load_pretrained
from vla.pi0.model import ARCH_PRESETS, Pi0Model
from vla.pi0.policy import Pi0Policy, Pi0PolicyConfig
from vla.pi0.sampling import SamplerConfig, sample

OBS_SPEC = {"rgb": ArraySpec((1, 32, 32, 3), "uint8"), "state": ArraySpec((5,), "float32")}
ACT = ArraySpec((7,), "float32", -1.0, 1.0)
INSTR = ["pick up the cube", "push the cube", "a", "stack the red cube on the green cube"]
TINY = ARCH_PRESETS["tiny"]
DUMMY = replace(TINY, lm_hidden=64, lm_layers=4, lm_mlp=128, lm_heads=8, lm_kv_heads=1, head_dim=16,
                expert_hidden=64, expert_mlp=128, expert_heads=8, num_steps=10)
NORM = {"state_mean": [0.1, -0.2, 0.3, 0.0, 0.5], "state_std": [1.5, 0.5, 2.0, 1.0, 0.25],
        "action_mean": [0.01, 0.02, -0.03, 0.0, 0.1, -0.1, 0.5], "action_std": [0.2, 0.3, 0.1, 1.0, 0.5, 0.4, 0.5]}
PG, EX = "paligemma_with_expert.paligemma.", "paligemma_with_expert.gemma_expert."


def _model(arch, seed: int = 0) -> Pi0Model:
    torch.manual_seed(seed)
    m = Pi0Model(arch).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # move every tensor off its init (norm weights start at 0, biases at 0)
        for p in m.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return m


def _obs(b: int = 4, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"rgb": torch.from_numpy(rng.integers(0, 255, (b, 1, 32, 32, 3), dtype=np.uint8)),
            "state": torch.from_numpy(rng.normal(size=(b, 5)).astype(np.float32)),
            "instruction": [INSTR[i % 4] for i in range(b)]}


def _ode(model: Pi0Model) -> torch.Tensor:
    """ODE sample from a fixed x0 for fixed observations (byte-tokenized prompts, identity norm)."""
    p = Pi0Policy(Pi0PolicyConfig(exec_steps=3), OBS_SPEC, ACT, model=model).eval()
    arch = model.arch
    x0 = torch.randn(4, arch.chunk_size, arch.max_action_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pre, state = p.prefix(_obs())
        return sample(model, pre, state, x0, SamplerConfig("ode"), p.log_prob_mask()).actions


def openpi_state(model: Pi0Model) -> dict[str, torch.Tensor]:
    """The model's tensors under openpi ``PI0Pytorch`` names as ``convert_jax_model_to_pytorch.py`` +
    ``safetensors.torch.save_model`` write them (tied PaliGemma embedding kept as lm_head; the expert's
    lm_head present; SigLIP under ``vision_tower.vision_model``)."""
    out = {}
    for k, v in model.hf.state_dict().items():
        if k == "model.dit.embed_tokens.weight":
            name = EX + "lm_head.weight"
        elif k == "model.vlm.language_model.embed_tokens.weight":
            name = PG + "lm_head.weight"
        elif k.startswith("model.vlm.vision_tower."):
            name = PG + "model.vision_tower.vision_model." + k.removeprefix("model.vlm.vision_tower.")
        elif k.startswith("model.vlm."):
            name = PG + "model." + k.removeprefix("model.vlm.")
        elif k.startswith("model.dit."):
            name = EX + "model." + k.removeprefix("model.dit.")
        else:
            name = k.removeprefix("embed_action_time.")
        out[name] = v.detach().clone().contiguous()
    for key in (PG + "model.vision_tower.vision_model.embeddings.patch_embedding.weight",  # converter's names
                PG + "model.vision_tower.vision_model.encoder.layers.0.self_attn.out_proj.bias",
                PG + "model.multi_modal_projector.linear.weight", PG + "model.language_model.layers.0.mlp.gate_proj.weight",
                PG + "model.language_model.norm.weight", EX + "model.layers.0.post_attention_layernorm.weight",
                EX + "model.norm.weight", "state_proj.weight", "action_time_mlp_in.bias", "action_out_proj.weight"):
        assert key in out, key
    return out


def _stats() -> dict:
    s, a = np.array(NORM["state_mean"]), np.array(NORM["action_mean"])
    return {"state": {"mean": NORM["state_mean"], "std": NORM["state_std"], "q01": (s - 1).tolist(), "q99": (s + 1).tolist()},
            "actions": {"mean": NORM["action_mean"], "std": NORM["action_std"], "q01": (a - 1).tolist(),
                        "q99": (a + 1).tolist()}}


def write_openpi(path: Path, model: Pi0Model, assets: tuple[str, ...] = ("robo/pickcube",),
                 state: dict[str, torch.Tensor] | None = None, variants: tuple[str, str] = ("dummy", "dummy")) -> Path:
    path.mkdir(parents=True)
    save_file(openpi_state(model) if state is None else state, str(path / "model.safetensors"))
    cfg = {"action_dim": model.arch.max_action_dim, "action_horizon": model.arch.chunk_size,
           "paligemma_variant": variants[0], "action_expert_variant": variants[1], "precision": "float32"}
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    for a in assets:  # copied from the JAX checkpoint: assets/<asset_id>/norm_stats.json
        (path / "assets" / a).mkdir(parents=True)
        (path / "assets" / a / "norm_stats.json").write_text(json.dumps({"norm_stats": _stats()}, indent=2))
    return path


def _features() -> dict:
    return {"observation.images.base_0_rgb": {"type": "VISUAL", "shape": [3, 32, 32]},
            "observation.state": {"type": "STATE", "shape": [5]}, "action": {"type": "ACTION", "shape": [7]}}


def write_lerobot(path: Path, model: Pi0Model, norm_file: str | None = "policy_preprocessor_step_6_normalizer_processor.safetensors",
                  kind: str = "pi0") -> Path:
    """What LeRobot's ``PI0Policy.save_pretrained`` + its processor pipelines write (draccus config dump,
    ``model.``-prefixed openpi keys, flat stats in the normalizer step's state_file)."""
    path.mkdir(parents=True)
    state = {"model." + k: v for k, v in openpi_state(model).items()}
    # from_pretrained copies paligemma.lm_head into embed_tokens, so a LeRobot save may hold both
    state["model." + PG + "model.language_model.embed_tokens.weight"] = state["model." + PG + "lm_head.weight"].clone()
    save_file(state, str(path / "model.safetensors"))
    a = model.arch
    feats = _features()
    cfg = {"type": kind, "n_obs_steps": 1, "input_features": {k: v for k, v in feats.items() if k != "action"},
           "output_features": {"action": feats["action"]}, "device": "cpu", "use_amp": False, "push_to_hub": False,
           "repo_id": None, "private": None, "tags": None, "license": None, "pretrained_path": None,
           "paligemma_variant": "dummy", "action_expert_variant": "dummy", "dtype": "float32",
           "chunk_size": a.chunk_size, "n_action_steps": a.chunk_size, "max_state_dim": a.max_state_dim,
           "max_action_dim": a.max_action_dim, "num_inference_steps": a.num_steps, "time_sampling_beta_alpha": 1.5,
           "time_sampling_beta_beta": 1.0, "time_sampling_scale": 0.999, "time_sampling_offset": 0.001,
           "min_period": 0.004, "max_period": 4.0, "use_relative_actions": False, "relative_exclude_joints": ["gripper"],
           "action_feature_names": None, "rtc_config": None, "image_resolution": [a.image_size, a.image_size],
           "empty_cameras": 0, "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
           "gradient_checkpointing": False, "compile_model": False, "compile_mode": "max-autotune",
           "freeze_vision_encoder": False, "train_expert_only": False, "optimizer_lr": 2.5e-05,
           "optimizer_betas": [0.9, 0.95], "optimizer_eps": 1e-08, "optimizer_weight_decay": 0.01,
           "optimizer_grad_clip_norm": 1.0, "scheduler_warmup_steps": 1000, "scheduler_decay_steps": 30000,
           "scheduler_decay_lr": 2.5e-06, "tokenizer_max_length": 48}
    (path / "config.json").write_text(json.dumps(cfg, indent=4))
    norm_cfg = {"eps": 1e-08, "features": feats, "norm_map": cfg["normalization_mapping"]}
    steps = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
             {"registry_name": "to_batch_processor", "config": {}},
             {"registry_name": "pi0_new_line_processor", "config": {}},
             {"registry_name": "tokenizer_processor", "config": {"max_length": 48, "task_key": "task",
              "padding_side": "right", "padding": "max_length", "truncation": True,
              "tokenizer_name": "google/paligemma-3b-pt-224"}},
             {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
             {"registry_name": "relative_actions_processor", "config": {"enabled": False}},
             {"registry_name": "normalizer_processor", "config": norm_cfg}]
    if norm_file:
        steps[-1]["state_file"] = norm_file
        flat = {}
        for feat, key in (("observation.state", "state"), ("action", "action")):
            flat[f"{feat}.mean"] = torch.tensor(NORM[f"{key}_mean"])
            flat[f"{feat}.std"] = torch.tensor(NORM[f"{key}_std"])
            flat[f"{feat}.min"], flat[f"{feat}.max"] = flat[f"{feat}.mean"] - 1, flat[f"{feat}.mean"] + 1
        save_file(flat, str(path / norm_file))
    (path / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": steps}, indent=2))
    return path


def write_transformers(path: Path, model: Pi0Model) -> Path:
    """``PI0ForConditionalGeneration.save_pretrained`` + a ``PI0Processor`` (tiny word-level tokenizer) with stats."""
    # (the image processor from its module: the top-level name asks for torchvision)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PI0Processor, PreTrainedTokenizerFast
    from transformers.models.pi0.image_processing_pi0 import PI0ImageProcessor

    model.hf.save_pretrained(str(path))
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, "pick": 4, "up": 5, "the": 6, "cube": 7, "a": 8}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")
    PI0Processor(image_processor=PI0ImageProcessor(), tokenizer=fast, state_mean=NORM["state_mean"],
                 state_std=NORM["state_std"], actions_mean=NORM["action_mean"],
                 actions_std=NORM["action_std"]).save_pretrained(str(path))
    return path


WRITERS = {"transformers": (TINY, write_transformers, 1), "openpi": (DUMMY, write_openpi, 3),
           "lerobot": (DUMMY, write_lerobot, 1)}


@pytest.mark.parametrize("layout", list(WRITERS))
def test_layout_loads_reproduces_samples_and_round_trips(layout, tmp_path):
    arch, write, cams = WRITERS[layout]
    model = _model(arch)
    src = write(tmp_path / layout, model)
    loaded = load_pretrained(src)
    assert loaded.source == layout
    assert loaded.model.arch == replace(arch, cameras=cams)  # every size read back
    torch.testing.assert_close(_ode(loaded.model), _ode(model), atol=1e-6, rtol=0)
    for k, v in NORM.items():
        np.testing.assert_allclose(loaded.norm[k], v, rtol=1e-6)
    assert (loaded.text_tokenizer is not None) == (layout == "transformers")

    obs = _obs()
    p1 = Pi0Policy(Pi0PolicyConfig(checkpoint=str(src), exec_steps=3), OBS_SPEC, ACT).eval()
    torch.testing.assert_close(p1.action_std[:7], torch.tensor(NORM["action_std"]))
    with torch.no_grad():  # heads away from their zero init, so the round trip shows
        for prm in [*p1.value_head.parameters(), *p1.noise_head.parameters()]:
            prm.normal_(0, 0.1)
        out1 = p1.act(obs, deterministic=True)
    assert p1.save_pretrained(tmp_path / "ours") == tmp_path / "ours"
    assert load_pretrained(tmp_path / "ours").source == "robo-rl"
    p2 = Pi0Policy(Pi0PolicyConfig(checkpoint=str(tmp_path / "ours"), exec_steps=3), OBS_SPEC, ACT).eval()
    with torch.no_grad():
        out2 = p2.act(obs, deterministic=True)
    torch.testing.assert_close(out2.actions, out1.actions, atol=1e-6, rtol=0)
    torch.testing.assert_close(out2.value, out1.value, atol=1e-6, rtol=0)
    for k, v in p1.noise_head.state_dict().items():
        assert torch.equal(p2.noise_head.state_dict()[k], v)
    assert p2.model.arch == p1.model.arch and type(p2.text) is type(p1.text)


def test_openpi_names_agree_with_transformers_own_conversion(tmp_path):
    """transformers' load-time "pi0" renaming reads our openpi-named file into the same weights."""
    from transformers import PI0ForConditionalGeneration

    model = _model(DUMMY)
    src = write_openpi(tmp_path / "o", model)
    ref = PI0ForConditionalGeneration.from_pretrained(str(src), config=DUMMY.hf_config(), local_files_only=True,
                                                      dtype=torch.float32).state_dict()
    ours = load_pretrained(src).model.hf.state_dict()
    assert set(ours) == set(ref)
    assert all(torch.equal(ours[k], ref[k]) for k in ref)


def test_openpi_asset_choice(tmp_path):
    src = write_openpi(tmp_path / "o", _model(DUMMY), assets=("robo/pickcube", "trossen"))
    with pytest.raises(CheckpointError, match=r"several asset ids \(robo/pickcube, trossen\)"):
        load_pretrained(src)
    assert load_pretrained(src, asset_id="trossen").norm["action_std"] == NORM["action_std"]
    with pytest.raises(CheckpointError, match="no norm stats for asset id 'droid'"):
        load_pretrained(src, asset_id="droid")


def test_norm_stats_shorter_than_the_env_are_refused(tmp_path):
    """The openpi stats here are 5-D state / 7-D action: an env with an 8-D action (or a longer state)
    would get un-normalized dims; with the matching 7-D action and 5-D state it builds."""
    from robo_rl.errors import ConfigError

    src = write_openpi(tmp_path / "o", _model(DUMMY))
    rgb = ArraySpec((1, DUMMY.image_size, DUMMY.image_size, 3), "uint8")
    with pytest.raises(ConfigError, match="has 7-D action_mean but the env's action is 8-D"):
        Pi0Policy(Pi0PolicyConfig(checkpoint=str(src)), {"rgb": rgb}, ArraySpec((8,), "float32", -1, 1))
    with pytest.raises(ConfigError, match="has 5-D state_mean but the env's state is 6-D"):
        Pi0Policy(Pi0PolicyConfig(checkpoint=str(src)), {"rgb": rgb, "state": ArraySpec((6,), "float32")},
                  ArraySpec((7,), "float32", -1, 1))
    p = Pi0Policy(Pi0PolicyConfig(checkpoint=str(src)), {"rgb": rgb, "state": ArraySpec((5,), "float32")},
                  ArraySpec((7,), "float32", -1, 1))
    assert p.action_std[:7].tolist() == pytest.approx(NORM["action_std"])
    with pytest.raises(ConfigError, match="noise_level' = 0 with sampler sde"):
        Pi0PolicyConfig(sampler="sde", noise_level=0.0)


def _pi05(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """pi0.5 keys: adaRMS expert norms (dense), time_mlp_* and no state_proj."""
    out = {}
    for k, v in state.items():
        if k.startswith("state_proj."):
            continue
        if k.startswith(EX + "model.") and k.endswith("layernorm.weight"):
            out[k.replace("layernorm.weight", "layernorm.dense.weight")] = torch.zeros(3 * v.shape[0], v.shape[0])
            out[k.replace("layernorm.weight", "layernorm.dense.bias")] = torch.zeros(3 * v.shape[0])
            continue
        out[k.replace("action_time_mlp_", "time_mlp_")] = v
    return out


def _bad(kind: str, tmp_path: Path) -> Path:
    model = _model(DUMMY)
    state = openpi_state(model)
    if kind == "missing key":
        del state[EX + "model.layers.1.mlp.up_proj.weight"]
    elif kind == "extra key":
        state[PG + "model.language_model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)
    elif kind == "shape":
        state["action_out_proj.weight"] = state["action_out_proj.weight"][:7]
    elif kind == "pi0.5":
        state = _pi05(state)
    elif kind == "lerobot pi0.5":
        return write_lerobot(tmp_path / "c", model, kind="pi05")
    elif kind == "lerobot no norm":
        return write_lerobot(tmp_path / "c", model, norm_file=None)
    variants = ("gemma_2b", "dummy") if kind == "variant" else ("dummy", "dummy")
    return write_openpi(tmp_path / "c", model, state=state, variants=variants,
                        assets=() if kind == "openpi no norm" else ("robo/pickcube",))


@pytest.mark.parametrize("kind,match", [
    ("missing key", r"missing \[paligemma_with_expert\.gemma_expert\.model\.layers\.1\.mlp\.up_proj\.weight\] \(1\)"),
    ("extra key", r"unexpected \[paligemma_with_expert\.paligemma\.model\.language_model\.layers\.0\.self_attn\.q_norm"),
    ("shape", r"action_out_proj\.weight has shape \(7, 64\); .* needs \(8, 64\)"),
    ("pi0.5", "pi0.5 is not supported yet"),
    ("lerobot pi0.5", "pi0.5 is not supported yet"),
    ("variant", r"paligemma_variant = 'gemma_2b' \(width 2048, depth 18.*\) does not match .*\(width 64, depth 4"),
    ("openpi no norm", "normalization stats are missing"),
    ("lerobot no norm", r"no norm stats observation\.state\.mean"),
])
def test_bad_checkpoints_fail_with_one_line(kind, match, tmp_path):
    with pytest.raises(CheckpointError, match=match) as err:
        load_pretrained(_bad(kind, tmp_path))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("change,match", [
    ("drop", r"missing \[embed_action_time\.state_proj\.weight\]"), ("extra", r"unexpected \[foo\.bar\]"),
    ("shape", r"action_out_proj\.weight \(7, 32\) vs \(8, 32\)")])
def test_bad_transformers_checkpoints_fail_with_one_line(change, match, tmp_path):
    from safetensors.torch import load_file

    src = write_transformers(tmp_path / "t", _model(TINY))
    state = load_file(str(src / "model.safetensors"))
    if change == "drop":
        del state["state_proj.weight"]  # transformers writes openpi-like names and maps them back on load
    elif change == "extra":
        state["foo.bar"] = torch.zeros(1)
    else:
        state["action_out_proj.weight"] = state["action_out_proj.weight"][:7]
    save_file(state, str(src / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=match) as err:
        load_pretrained(src)
    assert "\n" not in str(err.value)


def test_unknown_directories_fail_with_one_line(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_pretrained(tmp_path / "nowhere")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match=r"not a recognized pi0 checkpoint \(config.json has model_type 'llama'.*"
                                              r"openpi: config.json .*assets/<asset_id>/norm_stats.json") as err:
        load_pretrained(tmp_path / "x")
    assert "\n" not in str(err.value)


def test_save_replaces_only_our_own_directories(tmp_path):
    p = Pi0Policy(Pi0PolicyConfig(exec_steps=3), OBS_SPEC, ACT)
    p.save_pretrained(tmp_path / "ckpt")
    p.save_pretrained(tmp_path / "ckpt")  # replaces the previous one
    assert sorted(f.name for f in tmp_path.iterdir()) == ["ckpt"]  # no temp or old dirs left
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        p.save_pretrained(tmp_path / "mine")
    with pytest.raises(CheckpointError, match=r"value_head does not match .*0\.weight \(256, 64\) vs \(32, 64\)"):
        Pi0Policy(Pi0PolicyConfig(checkpoint=str(tmp_path / "ckpt"), value_hidden=32), OBS_SPEC, ACT)
