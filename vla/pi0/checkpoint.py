"""Load pi0 checkpoints from a local directory, and save our own.

The layout is detected from the files (``load_pretrained``; ``LoadedPi0.source`` names it):

1. transformers PI0 (``"transformers"``): ``config.json`` with ``model_type: "pi0"`` +
   ``model.safetensors`` (or shards + index), read by ``PI0ForConditionalGeneration.from_pretrained``
   (strict: missing / unexpected / mis-shaped tensors are errors); norm stats from a ``PI0Processor``'s
   ``processor_config.json`` (``state_mean, state_std, actions_mean, actions_std``) if present, else None.
2. openpi PyTorch (``"openpi"``): ``config.json`` with only ``action_dim, action_horizon,
   paligemma_variant, action_expert_variant, precision``; unprefixed openpi keys in
   ``model.safetensors`` (``vla.pi0.openpi_keys``); ``assets/<asset_id>/norm_stats.json``.
3. LeRobot pi0, the openpi port (``"lerobot"``): ``config.json`` with ``type: "pi0"`` (draccus dump);
   the openpi keys, usually prefixed ``model.``; norm stats in the ``state_file`` that
   ``policy_preprocessor.json`` names for its normalizer step (flat ``observation.state.mean`` ...
   ``action.std``), the postprocessor's unnormalizer file as a fallback.
4. robo-rl (``"robo-rl"``, written by ``save_pretrained``): directory 1 (``hf.save_pretrained``) +
   ``robo_rl_pi0.json`` (format tag, version, norm stats, cameras) + ``heads.safetensors`` (value and
   noise heads) + the prompt tokenizer when it is a HF one; built in a temp dir, then renamed.

For 2 and 3 every size is read off the tensor shapes and checked against the named Gemma variants;
pi0.5 and legacy (pre-port) LeRobot files are refused. Models load in float32. Every failure is a
one-line ``CheckpointError``.

Checked against public code (2026-08): transformers 5.24 as installed: ``conversion_mapping.py``
("pi0" renames; SigLIP's ``vision_model.`` prefix removal), ``models/pi0``; its ``save_pretrained``
writes reverse-mapped, openpi-like names that ``from_pretrained`` maps back, and
``PI0Processor.save_pretrained`` puts the four stat lists at the top of ``processor_config.json``
(both tried here). openpi: ``examples/convert_jax_model_to_pytorch.py`` (keys, config.json, assets
copy), ``models/gemma.py`` (variants), ``models_pytorch/gemma_pytorch.py`` (expert ``embed_tokens =
None``), ``shared/normalize.py`` (``{"norm_stats": {name: {mean, std, q01, q99}}}``); asset ids may
be nested (``org/dataset``, seen in a third-party openpi checkpoint listing), so ``assets/`` is
searched recursively. huggingface/lerobot HEAD 7427f31: ``policies/pi0/{configuration,modeling}_pi0.py``
(fields; ``model.`` prefix added on load; ``time_mlp_*`` -> ``action_time_mlp_*``; paligemma lm_head
copied into embed_tokens), ``processor/pipeline.py`` (``steps[i].state_file`` =
``{name}_step_{i}_{registry_name}.safetensors``), ``processor/normalize_processor.py``
(``normalizer_processor``, flat ``"<feature>.<stat>"`` keys, ``norm_map``), ``tokenizer_processor.py``
(newer saves put the tokenizer in ``tokenizer/``). Unconfirmed: the hub files themselves (whether a
LeRobot save keeps the PaliGemma lm_head, embed_tokens or both; the exact normalizer file name), so
both spellings are accepted and the file name is read from the json. Normalization epsilons differ
slightly (openpi std + 1e-6, LeRobot std + 1e-8, ours std floored at 1e-6).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from robo_rl.errors import CheckpointError
from vla.openvla.checkpoint import read_state_dict
from vla.openvla.text import HFTokenizer, has_hf_tokenizer
from vla.pi0.model import Pi0Arch, Pi0Model
from vla.pi0.openpi_keys import DIT_EMBED, infer_arch, map_openpi_keys, openpi_name, reject_unsupported

log = logging.getLogger(__name__)

OUR_FORMAT = "robo-rl-pi0"
OUR_VERSION = 1
META_FILE = "robo_rl_pi0.json"
HEADS_FILE = "heads.safetensors"
NORM_KEYS = ("state_mean", "state_std", "action_mean", "action_std")
HEAD_MODULES = ("value_head", "noise_head")
PALIGEMMA_VOCAB = 257152
_EXPECTED = ("robo-rl: robo_rl_pi0.json + config.json + model.safetensors; transformers PI0: config.json "
             "(model_type 'pi0') + model.safetensors; openpi: config.json (action_horizon, paligemma_variant, ...) + "
             "model.safetensors + assets/<asset_id>/norm_stats.json; LeRobot: config.json (type 'pi0') + "
             "model.safetensors + policy_preprocessor.json")


@dataclass
class LoadedPi0:
    """What ``load_pretrained`` returns."""

    model: Pi0Model
    text_tokenizer: HFTokenizer | None
    """The checkpoint's HF tokenizer, or None (the policy then uses its byte tokenizer)."""
    norm: dict[str, list[float]] | None
    """state_mean / state_std (max_state_dim or fewer), action_mean / action_std; None: not in the checkpoint."""
    source: str
    """Detected layout: "robo-rl", "transformers", "openpi" or "lerobot"."""
    heads: dict[str, torch.Tensor] | None = None
    """robo-rl only: ``value_head.*`` / ``noise_head.*`` tensors."""
    cameras: tuple[int, ...] | None = None
    """robo-rl only: the policy's camera selection when it was saved."""
    use_state: bool | None = None
    """robo-rl only: whether it was trained with the proprioceptive state (None: other layouts, unknown)."""


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"'{file}' is not readable JSON ({err})") from None


def load_pretrained(path: str | Path, asset_id: str | None = None) -> LoadedPi0:
    """Model, tokenizer and norm stats from a local pi0 checkpoint directory (layout auto-detected).
    ``asset_id``: which ``assets/<asset_id>/norm_stats.json`` of an openpi checkpoint (needed when it
    has several)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"pi0 checkpoint directory '{path}' does not exist")
    if (path / META_FILE).is_file():
        return _load_ours(path)
    cfg = _read_json(path / "config.json") if (path / "config.json").is_file() else None
    if isinstance(cfg, dict):
        if cfg.get("model_type") == "pi0":
            hf = _from_pretrained(path)
            return LoadedPi0(Pi0Model(Pi0Arch.from_hf_config(hf.config), hf).eval(), _tokenizer(path, hf.config),
                             _processor_norm(path), "transformers")
        kind = cfg.get("type")
        if kind in ("pi05", "pi0.5"):
            raise CheckpointError(f"'{path}' is a LeRobot pi0.5 checkpoint; pi0.5 is not supported yet, only pi0")
        if kind == "pi0":
            return _load_lerobot(path, cfg)
        if "action_horizon" in cfg and "paligemma_variant" in cfg:
            return _load_openpi(path, cfg, asset_id)
        found = f"config.json has model_type {cfg.get('model_type')!r}, type {kind!r}"
    else:
        found = "no config.json" if cfg is None else "config.json is not an object"
    raise CheckpointError(f"'{path}' is not a recognized pi0 checkpoint ({found}); expected one of: {_EXPECTED}")


# --- transformers PI0 and our own format ----------------------------------------------------------------

def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:400] + (" ..." if len(text) > 400 else "")


def _names(keys: list[str], n: int = 8) -> str:
    """Up to ``n`` names, then how many more."""
    more = f" ... (+{len(keys) - n} more)" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def _from_pretrained(path: Path) -> Any:
    """``PI0ForConditionalGeneration.from_pretrained`` (float32, local files), strict on key names."""
    if not any((path / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json")):
        raise CheckpointError(f"'{path}' has a PI0 config.json but no model.safetensors (or model.safetensors.index.json)")
    if (path / "model.safetensors.index.json").is_file():
        from robo_rl.checkpoint import shard_files

        shard_files(path, path / "model.safetensors.index.json")  # shards inside the directory, or one line
    from transformers import PI0ForConditionalGeneration

    try:
        hf, info = PI0ForConditionalGeneration.from_pretrained(str(path), local_files_only=True, dtype=torch.float32,
                                                               output_loading_info=True, ignore_mismatched_sizes=True)
    except Exception as err:  # transformers raises many types (size mismatches, bad configs, bad files)
        raise CheckpointError(f"transformers could not load the PI0 checkpoint '{path}': {_one_line(err)}") from None
    # the expert's token embedding is never used by pi0 (actions come in as embeddings): may be absent
    missing = sorted(set(info.get("missing_keys") or ()) - {DIT_EMBED})
    unexpected = sorted(info.get("unexpected_keys") or ())
    # mismatched: (name, checkpoint shape, model shape), reported instead of re-initialized
    mismatched = sorted(f"{m[0]} {tuple(m[1])} vs {tuple(m[2])}" if isinstance(m, tuple) and len(m) == 3 else str(m)
                        for m in info.get("mismatched_keys") or ())
    if missing or unexpected or mismatched:
        raise CheckpointError(f"checkpoint '{path}' does not match its PI0 config: missing [{_names(missing)}], "
                              f"unexpected [{_names(unexpected)}], shapes (checkpoint vs config) [{_names(mismatched, 4)}]")
    if DIT_EMBED in (info.get("missing_keys") or ()):
        with torch.no_grad():
            hf.get_submodule("model.dit.embed_tokens").weight.zero_()
    return hf.eval()


def _processor_norm(path: Path) -> dict[str, list[float]] | None:
    """Stats a ``PI0Processor`` saved in ``processor_config.json`` (None if there are none)."""
    file = path / "processor_config.json"
    cfg = _read_json(file) if file.is_file() else {}
    src = {"state_mean": "state_mean", "state_std": "state_std", "action_mean": "actions_mean", "action_std": "actions_std"}
    if not isinstance(cfg, dict) or not all(cfg.get(v) is not None for v in src.values()):
        return None
    return {k: [float(x) for x in cfg[v]] for k, v in src.items()}


def _tokenizer(path: Path, hf_config: Any, extra: Path | None = None) -> HFTokenizer | None:
    for d in (path, extra):
        if d is not None and d.is_dir() and has_hf_tokenizer(d):
            try:
                return HFTokenizer(d)
            except Exception as err:  # tokenizers/transformers raise many types
                raise CheckpointError(f"the tokenizer in '{d}' does not load: {_one_line(err)}") from None
    if hf_config.vlm_config.text_config.vocab_size == PALIGEMMA_VOCAB:
        log.warning("'%s' has no tokenizer files: prompts will be byte-tokenized, which this pretrained pi0 never "
                    "saw; copy the PaliGemma tokenizer (tokenizer.json or tokenizer.model) into the directory", path)
    return None


def _load_ours(path: Path) -> LoadedPi0:
    meta = _read_json(path / META_FILE)
    if not isinstance(meta, dict) or meta.get("format") != OUR_FORMAT:
        raise CheckpointError(f"'{path / META_FILE}' is not a {OUR_FORMAT!r} file")
    if meta.get("version") != OUR_VERSION:
        raise CheckpointError(f"'{path}' has {OUR_FORMAT} version {meta.get('version')}; this robo-rl reads {OUR_VERSION}")
    hf = _from_pretrained(path)
    cameras = tuple(int(c) for c in meta.get("cameras") or (0,))
    norm = meta.get("norm")
    if norm is not None and (not isinstance(norm, dict) or set(norm) != set(NORM_KEYS)):
        raise CheckpointError(f"'{path / META_FILE}' norm must have exactly {', '.join(NORM_KEYS)}")
    heads = None
    if (path / HEADS_FILE).is_file():
        from safetensors.torch import load_file

        try:
            heads = load_file(str(path / HEADS_FILE))
        except Exception as err:  # safetensors raises its own types
            raise CheckpointError(f"'{path / HEADS_FILE}' is not a readable safetensors file ({_one_line(err)})") from None
    arch = Pi0Arch.from_hf_config(hf.config, cameras=int(meta.get("model_cameras") or len(cameras)))
    model = Pi0Model(arch, hf).eval()
    use_state = meta.get("use_state", True)
    if not isinstance(use_state, bool):
        raise CheckpointError(f"'{path / META_FILE}' use_state must be true or false; got {use_state!r}")
    return LoadedPi0(model, _tokenizer(path, hf.config), norm, "robo-rl", heads, cameras, use_state)


def load_heads(policy: Any, heads: dict[str, torch.Tensor], source: str | Path) -> None:
    """Load ``value_head.*`` / ``noise_head.*`` into the policy's heads; one line on any mismatch."""
    for name in HEAD_MODULES:
        module: torch.nn.Module = getattr(policy, name)
        sub = {k[len(name) + 1:]: v for k, v in heads.items() if k.startswith(name + ".")}
        own = module.state_dict()
        missing, unexpected = sorted(set(own) - set(sub)), sorted(set(sub) - set(own))
        bad = [f"{name}.{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in sub.items()
               if k in own and v.shape != own[k].shape]
        if missing or unexpected or bad:
            raise CheckpointError(f"checkpoint '{source}' {name} does not match the policy (e.g. policy.value_hidden): "
                                  f"missing [{_names(missing)}], unexpected [{_names(unexpected)}], shapes "
                                  f"(checkpoint vs policy) [{_names(bad, 4)}]")
        module.load_state_dict(sub)
    unknown = sorted(k for k in heads if not k.startswith(tuple(n + "." for n in HEAD_MODULES)))
    if unknown:
        raise CheckpointError(f"checkpoint '{source}' {HEADS_FILE} has unknown tensors [{_names(unknown)}]")


def save_pretrained(policy: Any, path: str | Path) -> Path:
    """Write ``policy`` as a robo-rl pi0 directory: built in a temp dir next to ``path``, then renamed
    into place (an existing robo-rl pi0 directory there is replaced; anything else is refused)."""
    from safetensors.torch import save_file

    from robo_rl.files import check_replaceable, replace_dir

    path = Path(path)
    check_replaceable(path, lambda p: (p / META_FILE).is_file(), "robo-rl pi0 checkpoint")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        policy.model.hf.save_pretrained(str(tmp))
        heads = {f"{n}.{k}": v.detach().cpu().contiguous() for n in HEAD_MODULES
                 for k, v in getattr(policy, n).state_dict().items()}
        save_file(heads, str(tmp / HEADS_FILE))
        if isinstance(policy.text, HFTokenizer):
            policy.text.save(tmp)
        meta = {"format": OUR_FORMAT, "version": OUR_VERSION, "cameras": [int(c) for c in policy.cfg.cameras],
                "model_cameras": int(policy.model.arch.cameras), "use_state": bool(policy.cfg.use_state),
                "norm": {k: getattr(policy, k).detach().cpu().tolist() for k in NORM_KEYS}}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))  # last: marks a complete directory
        replace_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


# --- openpi and LeRobot -------------------------------------------------------------------------------

def _build(arch: Pi0Arch, state: dict[str, torch.Tensor], path: Path) -> Pi0Model:
    """A ``Pi0Model`` holding ``state`` (already in transformers names): exact names and shapes, or an error."""
    from transformers import PI0ForConditionalGeneration

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: plain (slower) random init, overwritten below
        from contextlib import nullcontext as no_init_weights
    with no_init_weights():
        hf = PI0ForConditionalGeneration(arch.hf_config())
    own = hf.state_dict()
    if DIT_EMBED not in state:  # the expert's token embedding: unused by pi0, absent in some files
        state = {**state, DIT_EMBED: torch.zeros_like(own[DIT_EMBED])}
    missing = sorted(openpi_name(k) for k in set(own) - set(state))
    unexpected = sorted(openpi_name(k) for k in set(state) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"checkpoint '{path}' does not match pi0: missing [{_names(missing)}] ({len(missing)}), "
                              f"unexpected [{_names(unexpected)}] ({len(unexpected)}) (openpi names)")
    for k, v in state.items():
        if v.shape != own[k].shape:
            raise CheckpointError(f"checkpoint '{path}' tensor {openpi_name(k)} has shape {tuple(v.shape)}; "
                                  f"the architecture read from the other tensors needs {tuple(own[k].shape)}")
    hf.load_state_dict(state, strict=True)  # copies, casting to float32
    return Pi0Model(arch, hf).eval()


def _openpi_norm(path: Path, asset_id: str | None) -> dict[str, list[float]]:
    assets = path / "assets"
    ids = sorted(f.parent.relative_to(assets).as_posix() for f in assets.rglob("norm_stats.json")) if assets.is_dir() else []
    if not ids:
        raise CheckpointError(f"openpi checkpoint '{path}' has no assets/<asset_id>/norm_stats.json; "
                              "its normalization stats are missing")
    if asset_id is None and len(ids) > 1:
        raise CheckpointError(f"openpi checkpoint '{path}' has norm stats for several asset ids ({', '.join(ids)}); "
                              "choose one (asset_id / policy.norm_asset_id)")
    if asset_id is not None and asset_id not in ids:
        raise CheckpointError(f"openpi checkpoint '{path}' has no norm stats for asset id {asset_id!r}; it has {', '.join(ids)}")
    file = assets / (asset_id or ids[0]) / "norm_stats.json"
    stats = _read_json(file)
    try:
        s, a = stats["norm_stats"]["state"], stats["norm_stats"]["actions"]
        return {"state_mean": list(s["mean"]), "state_std": list(s["std"]),
                "action_mean": list(a["mean"]), "action_std": list(a["std"])}
    except (KeyError, TypeError):
        raise CheckpointError(f"'{file}' lacks norm_stats.state / norm_stats.actions with mean and std") from None


def _load_openpi(path: Path, cfg: dict[str, Any], asset_id: str | None) -> LoadedPi0:
    state = read_state_dict(path)
    reject_unsupported(state, path)
    # openpi's sample_actions defaults to 10 Euler steps; pi0 has 3 image slots (base, left and right wrist)
    arch = infer_arch(state, path, cfg.get("paligemma_variant"), cfg.get("action_expert_variant"),
                      chunk=int(cfg["action_horizon"]), num_steps=10, cameras=3)
    if cfg.get("action_dim") is not None and int(cfg["action_dim"]) != arch.max_action_dim:
        raise CheckpointError(f"'{path}/config.json' action_dim = {cfg['action_dim']} but action_in_proj takes "
                              f"{arch.max_action_dim}-D actions")
    model = _build(arch, map_openpi_keys(state), path)
    norm = _openpi_norm(path, asset_id)
    return LoadedPi0(model, _tokenizer(path, model.hf.config), norm, "openpi")


def _step(path: Path, pipeline: str, registry: str) -> dict[str, Any] | None:
    """The ``registry`` step of LeRobot's ``<pipeline>.json`` (None if the file or step is absent)."""
    file = path / f"{pipeline}.json"
    data = _read_json(file) if file.is_file() else {}
    steps = data.get("steps") if isinstance(data, dict) else None
    return next((s for s in steps or [] if isinstance(s, dict) and s.get("registry_name") == registry), None)


def _lerobot_stats(path: Path, pipeline: str, registry: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Flat stats tensors and config of the ``registry`` step of ``<pipeline>.json`` ({} if absent)."""
    from safetensors.torch import load_file

    file = path / f"{pipeline}.json"
    step = _step(path, pipeline, registry)
    name = step.get("state_file") if step else None
    if not name:
        return {}, {}
    if Path(name).is_absolute() or ".." in Path(name).parts or not (path / name).is_file():
        raise CheckpointError(f"'{file}' names the stats file {name!r}, which is not a file in '{path}'")
    try:
        return load_file(str(path / name)), step.get("config") or {}
    except Exception as err:  # safetensors raises its own types
        raise CheckpointError(f"'{path / name}' is not a readable safetensors file ({_one_line(err)})") from None


def _lerobot_norm(path: Path) -> dict[str, list[float]]:
    pre, conf = _lerobot_stats(path, "policy_preprocessor", "normalizer_processor")
    post, post_conf = _lerobot_stats(path, "policy_postprocessor", "unnormalizer_processor")
    modes = {**(post_conf.get("norm_map") or {}), **(conf.get("norm_map") or {})}
    for kind in ("STATE", "ACTION"):
        if modes.get(kind, "MEAN_STD") != "MEAN_STD":
            raise CheckpointError(f"LeRobot checkpoint '{path}' normalizes {kind} with {modes[kind]}; the pi0 policy "
                                  "supports MEAN_STD only")
    feats = {**(post_conf.get("features") or {}), **(conf.get("features") or {})}
    skey = next((k for k, f in feats.items() if isinstance(f, dict) and f.get("type") == "STATE"), "observation.state")
    akey = next((k for k, f in feats.items() if isinstance(f, dict) and f.get("type") == "ACTION"), "action")
    flat = {**post, **pre}
    want = {"state_mean": f"{skey}.mean", "state_std": f"{skey}.std", "action_mean": f"{akey}.mean", "action_std": f"{akey}.std"}
    lost = [v for v in want.values() if v not in flat]
    if lost:
        raise CheckpointError(f"LeRobot checkpoint '{path}' has no norm stats {', '.join(lost)} (expected in the "
                              "normalizer step's state_file named by policy_preprocessor.json)")
    return {k: flat[v].float().flatten().tolist() for k, v in want.items()}


def _load_lerobot(path: Path, cfg: dict[str, Any]) -> LoadedPi0:
    if cfg.get("use_relative_actions"):
        raise CheckpointError(f"LeRobot checkpoint '{path}' uses relative actions (use_relative_actions: true); "
                              "the pi0 policy supports absolute actions only")
    # LeRobot adds "model." (its PI0Pytorch attribute) to every key; files converted from openpi may lack it
    state = {k.removeprefix("model."): v for k, v in read_state_dict(path).items()}
    reject_unsupported(state, path)
    visual = [f for f in (cfg.get("input_features") or {}).values() if isinstance(f, dict) and f.get("type") == "VISUAL"]
    arch = infer_arch(state, path, cfg.get("paligemma_variant", "gemma_2b"), cfg.get("action_expert_variant", "gemma_300m"),
                      chunk=int(cfg.get("chunk_size", 50)), num_steps=int(cfg.get("num_inference_steps", 10)),
                      cameras=max(1, len(visual) + int(cfg.get("empty_cameras", 0) or 0)))
    res = cfg.get("image_resolution")
    checks = {"max_state_dim": arch.max_state_dim, "max_action_dim": arch.max_action_dim}
    for key, have in checks.items():
        if cfg.get(key) is not None and int(cfg[key]) != have:
            raise CheckpointError(f"'{path}/config.json' {key} = {cfg[key]} but the weights take {have}")
    if res is not None and tuple(int(r) for r in res) != (arch.image_size, arch.image_size):
        raise CheckpointError(f"'{path}/config.json' image_resolution = {list(res)} but the SigLIP position table "
                              f"is for {arch.image_size}x{arch.image_size}")
    model = _build(arch, map_openpi_keys(state), path)
    norm = _lerobot_norm(path)
    tok = (_step(path, "policy_preprocessor", "tokenizer_processor") or {}).get("config", {}).get("tokenizer_name")
    extra = path / tok if isinstance(tok, str) and not Path(tok).is_absolute() and ".." not in Path(tok).parts else None
    return LoadedPi0(model, _tokenizer(path, model.hf.config, extra), norm, "lerobot")
