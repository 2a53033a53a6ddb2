"""Atomic checkpoints: ``<run>/checkpoints/step_<N>/{model.safetensors, trainer.safetensors, trainer.json,
meta.json}``.

Writes go to a temp directory that is fsynced and renamed into place, then the ``latest`` pointer
file is replaced atomically, so a crash at any moment leaves the previous checkpoint intact; a full disk
is one line naming the file. Nothing is unpickled: weights and trainer tensors are safetensors, the rest
JSON (read with size and nesting limits). Loading validates the format tag, the policy name, the tensor
names/shapes and that every weight is finite, keeps every path inside its run directory, and fails with
one line naming what does not match. ``upgrade`` converts the pickled ``trainer.pt`` of older runs once,
with an unpickler that only builds the types robo-rl wrote.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from robo_rl.errors import CheckpointError, RoboRLError
from robo_rl.files import (
    atomic_path,
    atomic_write_text,
    first_line,
    fsync_dir,
    is_inside,
    member,
    read_json,
)
from robo_rl.runlock import pid_alive
from robo_rl.safe_load import load_legacy_trainer
from robo_rl.state_codec import decode_state, encode_state, is_size

log = logging.getLogger(__name__)

FORMAT = "robo-rl-checkpoint"
VERSION = 1
TRAINER_FORMAT = "robo-rl-trainer-state"
TRAINER_JSON = "trainer.json"
TRAINER_TENSORS = "trainer.safetensors"
LEGACY_TRAINER = "trainer.pt"
MAX_PARAMS = 100_000_000
"""Largest policy (parameters and buffers) built from a received config without ``--allow-large``."""
_limits: dict[str, int | None] = {"max_params": MAX_PARAMS}
_STEP_NAME = re.compile(r"step_\d+")


def _own_file(ckpt: Path, name: str) -> Path:
    """``ckpt / name``, refused when it is a link to a file outside the checkpoint directory."""
    path = ckpt / name
    if path.is_symlink() and not is_inside(path, ckpt):
        raise CheckpointError(f"'{path}' is a link to '{path.resolve()}', outside the checkpoint directory; "
                              "a checkpoint's files must lie inside it")
    return path


def shard_files(path: Path, index: Path) -> list[Path]:
    """The shard files a ``model.safetensors.index.json`` maps tensors to, each confined to ``path``."""
    try:
        weight_map = read_json(index)["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"'{index}' is not a safetensors index ({first_line(err)}); expected a JSON object "
                              "with a 'weight_map' of tensor name -> shard file") from None
    return [member(path, name, f"'{index}'") for name in names]


def save(ckpt_root: Path, step: int, model_state: dict[str, torch.Tensor], trainer_state: dict[str, Any],
         meta: dict[str, Any], keep: int = 3) -> Path:
    """Save a checkpoint for env step ``step`` and point ``latest`` at it; keep it and the ``keep - 1``
    highest steps below it. A full disk is a one-line ``CheckpointError`` naming the file being written;
    the previous checkpoint stays intact and ``latest`` keeps pointing at it."""
    try:
        return _save(ckpt_root, step, model_state, trainer_state, meta, keep)
    except (OSError, RoboRLError) as err:
        full = disk_full_error(err, ckpt_root)
        if full is None:
            raise
        raise full from None


def _save(ckpt_root: Path, step: int, model_state: dict[str, torch.Tensor], trainer_state: dict[str, Any],
          meta: dict[str, Any], keep: int) -> Path:
    ckpt_root.mkdir(parents=True, exist_ok=True)
    restore_moved_aside(ckpt_root)  # a crash mid re-save earlier (the writer's side: readers never rename)
    remove_dead_temps(ckpt_root)
    final = ckpt_root / f"step_{step:010d}"
    tmp = ckpt_root / f".step_{step:010d}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    old_copy = ckpt_root / f".step_{step:010d}.old-{os.getpid()}"
    moved = False
    try:
        _write_checkpoint_dir(tmp, model_state, trainer_state, meta)
        if final.exists():  # same step saved again: move the old copy aside, never delete it before the swap
            if old_copy.exists():
                shutil.rmtree(old_copy)
            os.replace(final, old_copy)
            moved = True
        os.replace(tmp, final)
    except BaseException:  # a failed write leaves no half-written copy behind and the old copy in place
        if moved and not final.exists():
            os.replace(old_copy, final)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(ckpt_root)
    if moved:
        shutil.rmtree(old_copy, ignore_errors=True)
    atomic_write_text(ckpt_root / "latest", final.name + "\n")
    # Prune older steps only: the one just written always stays, and steps above it (left by a run
    # that crashed before moving `latest` and was resumed from an earlier checkpoint) are not counted.
    older = sorted(p for p in ckpt_root.glob("step_*") if p.is_dir() and _step_of(p) is not None and _step_of(p) < step)
    for p in older[:max(len(older) - (keep - 1), 0)] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
    return final


_DISK_FULL_TEXT = re.compile(r"No space left on device|Disk quota exceeded|StorageFull|code: (28|122)\b")


def disk_full_error(err: BaseException, ckpt_root: Path) -> CheckpointError | None:
    """The one-line error for ``err`` when it says the disk (or quota) is full (an ``OSError`` with errno
    ENOSPC/EDQUOT, or a safetensors error carrying that OS error), else None."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        path = err.filename or ckpt_root
    elif isinstance(err, _WriteError) and _DISK_FULL_TEXT.search(str(err.__cause__)):
        path = err.path
    else:
        return None
    try:
        previous = f"the previous checkpoint '{resolve(ckpt_root)}' is intact"
    except CheckpointError:
        previous = "no earlier checkpoint exists"
    run = ckpt_root.parent if ckpt_root.name == "checkpoints" else "RUN"
    return CheckpointError(f"disk full: cannot write checkpoint file '{path}' (no space left on its "
                           f"filesystem); {previous}; free space there, then resume with "
                           f"'robo-rl train --resume {run}'")


class _WriteError(RoboRLError):
    """A safetensors file that could not be written (``__cause__``: the library's error)."""

    def __init__(self, path: Path, err: BaseException) -> None:
        super().__init__(f"cannot write '{path}' ({first_line(err)})")
        self.path = path


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` as contiguous CPU tensors of which no two share storage (safetensors refuses shared
    storage; tied weights such as an LM head that is the embedding share it): repeats are copied."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k, v in state.items():
        t = v.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[k] = t.clone() if ptr in seen and t.numel() else t
        seen.add(ptr)
    return out


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """``safetensors.torch.save_file``; its own error types become ``_WriteError`` naming ``path``
    (``OSError`` passes through)."""
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except OSError:
        raise
    except Exception as err:  # safetensors reports failed writes as SafetensorError
        raise _WriteError(path, err) from err


_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)(\.[A-Za-z0-9]+)?")


def remove_dead_temps(root: Path) -> list[Path]:
    """Remove the temp files/directories (``.step_N.tmp-PID``, ``.latest.tmp-PID``) of writers that died
    mid-write: those whose PID is not a running process other than this one. Returns what was removed."""
    removed = []
    for tmp in root.glob(".*.tmp-*"):
        m = _TEMP_NAME.fullmatch(tmp.name)
        if m is None or int(m["pid"]) == os.getpid() or pid_alive(int(m["pid"])):
            continue
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        removed.append(tmp)
    if removed:
        log.info("removed %d temp file(s) of dead checkpoint writers in %s: %s", len(removed), root,
                 ", ".join(t.name for t in removed))
    return removed


def _write_checkpoint_dir(tmp: Path, model_state: dict[str, torch.Tensor], trainer_state: dict[str, Any],
                          meta: dict[str, Any]) -> None:
    _save_tensors(_unshared(model_state), tmp / "model.safetensors", {"format": FORMAT})
    write_trainer_state(tmp, trainer_state)
    (tmp / "meta.json").write_text(json.dumps({"format": FORMAT, "version": VERSION, **meta}, indent=2))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    fsync_dir(tmp)


# --- trainer state: safetensors tensors + JSON, no pickle --------------------------------------------------

def write_trainer_state(directory: Path, state: dict[str, Any]) -> None:
    """Write ``state`` as ``trainer.safetensors`` (its tensors and arrays) + ``trainer.json`` (the rest)
    into ``directory``, each file atomically, the JSON last."""
    tensors: dict[str, torch.Tensor] = {}
    doc = {"format": TRAINER_FORMAT, "version": VERSION, "state": encode_state(state, tensors)}
    with atomic_path(directory / TRAINER_TENSORS, ".safetensors") as tmp:
        _save_tensors(_unshared(tensors), tmp, {"format": TRAINER_FORMAT})
    atomic_write_text(directory / TRAINER_JSON, json.dumps(doc))


def run_of(ckpt: Path) -> Path:
    """The run directory a checkpoint directory belongs to (itself when it is not under ``checkpoints``)."""
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt


def require_trainer_state(ckpt: Path) -> None:
    """One-line error unless ``ckpt`` has a trainer state robo-rl loads (``trainer.json``); a pickled
    ``trainer.pt`` of an older robo-rl is named with the command that converts it."""
    if (ckpt / TRAINER_JSON).is_file():
        return
    if (ckpt / LEGACY_TRAINER).is_file():
        raise CheckpointError(f"checkpoint '{ckpt}' keeps its trainer state in the pickle file "
                              f"{LEGACY_TRAINER}, which robo-rl no longer loads (a pickle can run code); "
                              f"convert the run once with 'robo-rl checkpoint upgrade {run_of(ckpt)}'")
    raise CheckpointError(f"checkpoint trainer state '{ckpt / TRAINER_JSON}' is corrupt or missing (no "
                          f"{TRAINER_JSON}); resume from another checkpoint (checkpoints/step_N)")


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    """The trainer state :func:`write_trainer_state` wrote: JSON (size/depth-limited) and safetensors."""
    from safetensors.torch import load_file

    require_trainer_state(ckpt)
    file = _own_file(ckpt, TRAINER_JSON)
    try:
        doc = read_json(file)
        if not isinstance(doc, dict) or doc.get("format") != TRAINER_FORMAT or "state" not in doc:
            raise ValueError(f"not a {TRAINER_FORMAT!r} document")
        tensors = load_file(str(_own_file(ckpt, TRAINER_TENSORS))) if isinstance(doc["state"], dict) else {}
        state = decode_state(doc["state"], tensors)
    except Exception as err:  # OSError, ValueError, safetensors' own error types
        raise CheckpointError(f"checkpoint trainer state '{file}' is corrupt or missing "
                              f"({first_line(err)})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint trainer state '{file}' is corrupt (its state is not an object)")
    return state


# --- converting trainer.pt of older runs ---------------------------------------------------------------

def checkpoint_dirs(path: Path) -> list[Path]:
    """The checkpoint directories of a run directory (``checkpoints/step_*`` and moved-aside copies), or
    ``[path]`` for a checkpoint directory itself."""
    if (path / "meta.json").is_file():
        return [path]
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    found = [d for d in sorted(root.glob("step_*")) + sorted(root.glob(".step_*.old-*"))
             if d.is_dir() and (d / "meta.json").is_file()]
    if not found:
        raise CheckpointError(f"no checkpoint found under '{path}' (expected checkpoints/step_*/meta.json); "
                              "pass a run directory made by 'robo-rl train' or one of its checkpoints/step_* "
                              "directories")
    return [_confine(d, root) for d in found]


def upgrade(path: str | Path) -> dict[str, list[str]]:
    """Convert the pickled ``trainer.pt`` of every checkpoint of ``path`` (a run or checkpoint directory)
    to ``trainer.safetensors`` + ``trainer.json`` and remove it. Returns the directories converted and
    those already converted."""
    done: dict[str, list[str]] = {"upgraded": [], "already_upgraded": []}
    for ckpt in checkpoint_dirs(Path(path)):
        legacy = _own_file(ckpt, LEGACY_TRAINER)
        if (ckpt / TRAINER_JSON).is_file() or not legacy.is_file():
            done["already_upgraded"].append(str(ckpt))
            continue
        state = load_legacy_trainer(legacy)
        if not isinstance(state, dict):
            raise CheckpointError(f"'{legacy}' holds a {type(state).__name__}, not the dict robo-rl writes; "
                                  "it was not converted")
        try:
            write_trainer_state(ckpt, state)
        except TypeError as err:
            raise CheckpointError(f"'{legacy}' cannot be converted: {err}") from None
        except (OSError, RoboRLError) as err:
            raise disk_full_error(err, ckpt.parent) or err from None
        legacy.unlink()
        fsync_dir(ckpt)
        done["upgraded"].append(str(ckpt))
    return done


def _step_of(p: Path) -> int | None:
    tail = p.name[len("step_"):]
    return int(tail) if tail.isdigit() else None


def _moved_aside(root: Path) -> dict[str, Path]:
    """``step_N`` name -> its old copy ``.step_N.old-PID`` where ``step_N`` itself is missing (a crash
    while re-saving that step)."""
    out = {}
    for old in sorted(root.glob(".step_*.old-*")):
        name = old.name[1:].rsplit(".old-", 1)[0]
        if old.is_dir() and (old / "meta.json").is_file() and not (root / name).exists():
            out[name] = old
    return out


def restore_moved_aside(root: Path) -> None:
    """Put old copies of :func:`_moved_aside` back at ``step_N`` (the run's writer does this: before a
    save and on resume; readers of a run only read them)."""
    for name, old in _moved_aside(root).items():
        os.replace(old, root / name)


def resolve(path: str | Path) -> Path:
    """A run dir, a checkpoints dir or a checkpoint dir -> the checkpoint dir to load. The ``latest``
    pointer must name a ``step_N`` directory, and the directory chosen must lie (links resolved) inside
    the run directory."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint path '{p}' does not exist; pass a run directory or a checkpoints/step_* directory")
    if (p / "meta.json").is_file():
        return p
    root = p / "checkpoints" if (p / "checkpoints").is_dir() else p
    _confine(root, p)
    aside = _moved_aside(root) if root.is_dir() else {}
    name = _pointer(root)
    if name:
        if not _STEP_NAME.fullmatch(name):
            raise CheckpointError(f"'{root / 'latest'}' names {name[:80]!r}, not a step_N directory of "
                                  f"'{root}'; it must name one of the checkpoints beside it (or be deleted: "
                                  "the highest step is loaded)")
        if (root / name / "meta.json").is_file():
            return _confine(root / name, root)
        if name in aside:  # its writer crashed mid re-save: read the old copy where it lies
            return _confine(aside[name], root)
    cands = sorted([c for c in root.glob("step_*") if (c / "meta.json").is_file()] + list(aside.values()),
                   key=lambda c: c.name.lstrip(".").split(".old-")[0])
    if not cands:
        raise CheckpointError(f"no checkpoint found under '{p}' (expected checkpoints/step_*/meta.json)")
    return _confine(cands[-1], root)


def _pointer(root: Path) -> str:
    """The step name in ``root/latest`` ("" when there is none or it is unreadable: the highest step is
    loaded then)."""
    latest = root / "latest"
    if not latest.is_file():
        return ""
    try:
        with open(latest, "rb") as fh:
            return fh.read(4096).decode().strip()
    except (OSError, ValueError):
        return ""


def _confine(path: Path, root: Path) -> Path:
    """``path``, refused in one line when (links resolved) it lies outside ``root``."""
    if not is_inside(path, root):
        raise CheckpointError(f"'{path}' is a link to '{path.resolve()}', outside '{root}'; a run's "
                              "checkpoints must lie inside its directory (copy them in instead of linking)")
    return path


def read_meta(ckpt: Path) -> dict[str, Any]:
    """meta.json of ``ckpt`` (size- and depth-limited), checked for the format, version and the objects
    every reader needs."""
    try:
        meta = read_json(_own_file(ckpt, "meta.json"))
    except (OSError, ValueError) as err:  # ValueError: bad JSON, over a limit, or bytes that are not UTF-8
        raise CheckpointError(f"checkpoint '{ckpt}' has an unreadable meta.json ({str(err).splitlines()[0]}); it is corrupt") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"'{ckpt}' is not a robo-rl checkpoint (meta.json format is {meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"checkpoint '{ckpt}' has format version {meta.get('version')}, this robo-rl reads version {VERSION}")
    missing = [k for k in ("config", "obs_spec", "action_spec") if not isinstance(meta.get(k), dict)]
    if missing:
        raise CheckpointError(f"checkpoint '{ckpt}' meta.json lacks {', '.join(missing)} (each a JSON object, as robo-rl writes them); it is incomplete")
    return meta


def load_model_state(ckpt: Path) -> dict[str, torch.Tensor]:
    """The weights in ``model.safetensors``; one-line errors for a corrupt file and for NaN/inf values."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = _own_file(ckpt, "model.safetensors")
    try:
        state = load_file(str(file))
    except (SafetensorError, OSError, RuntimeError) as err:
        raise CheckpointError(f"checkpoint weights '{file}' are corrupt or missing ({first_line(err)})") from None
    check_finite(state, file)
    return state


def check_finite(state: dict[str, torch.Tensor], file: Path) -> None:
    """One-line error naming the first floating-point tensor of ``state`` holding NaN or inf."""
    for name, t in state.items():
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            kind = "NaN" if bool(torch.isnan(t).any()) else "inf"
            raise CheckpointError(f"checkpoint weights '{file}' hold {kind} in tensor '{name}'; the run "
                                  "diverged before this save: load an earlier checkpoints/step_N")


# --- the size of the model a checkpoint describes ---------------------------------------------------------

def max_params() -> int | None:
    """The parameter limit of a policy built from a config or checkpoint (None after ``allow_large_models``)."""
    return _limits["max_params"]


def allow_large_models(allow: bool = True) -> None:
    """Lift (or restore) the :data:`MAX_PARAMS` limit of ``robo_rl.build.check_model_size`` (``--allow-large``)."""
    _limits["max_params"] = None if allow else MAX_PARAMS


def specs_from_meta(meta: dict[str, Any], ckpt: Path) -> tuple[dict[str, Any], Any]:
    """(obs spec, action spec) recorded in a checkpoint's meta.json, checked to be lists of sizes."""
    from robo_rl.contracts import ArraySpec

    def shape(value: Any, key: str) -> tuple[int, ...]:
        if not isinstance(value, list) or len(value) > 8 or not all(is_size(n) for n in value):
            raise CheckpointError(f"checkpoint '{ckpt}' meta.json {key} is {str(value)[:60]}; expected a "
                                  "list of at most 8 sizes, as robo-rl writes it")
        return tuple(value)

    obs_spec = {k: ArraySpec(shape(v, f"obs_spec.{k}"), "uint8" if k == "rgb" else "float32")
                for k, v in meta["obs_spec"].items()}
    act = meta["action_spec"]
    act_shape = shape(act.get("shape", []), "action_spec.shape")

    def bound(key: str) -> Any:
        value = act.get(key)
        if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            return value
        if (isinstance(value, list) and act_shape and len(value) == act_shape[-1]
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)):
            return tuple(value)
        raise CheckpointError(f"checkpoint '{ckpt}' meta.json action_spec.{key} is {str(value)[:60]}; expected a "
                              f"number or a list of {act_shape[-1] if act_shape else 'A'} numbers, as robo-rl writes it")

    return obs_spec, ArraySpec(act_shape, "float32", bound("low"), bound("high"))


def load_into(module: torch.nn.Module, state: dict[str, torch.Tensor], ckpt: Path) -> None:
    """Strict load with a one-line message on name/shape mismatch. A module's load pre-hooks may fill
    entries that older checkpoints lack (e.g. a flag whose default they were trained with); what is
    still missing after them is an error (the module is then partly loaded and must not be used)."""
    own = module.state_dict()
    unexpected = sorted(set(state) - set(own))
    bad_shape = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if unexpected or bad_shape:
        missing = sorted(set(own) - set(state))
    else:
        missing = sorted(module.load_state_dict(state, strict=False).missing_keys)
    if missing or unexpected or bad_shape:
        parts = []
        if missing:
            parts.append(f"missing {missing[:3]}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:3]}")
        if bad_shape:
            k = bad_shape[0]
            parts.append(f"shape of '{k}' is {tuple(state[k].shape)} but the model has {tuple(own[k].shape)}")
        raise CheckpointError(f"checkpoint '{ckpt}' does not match this model: {'; '.join(parts)}")
