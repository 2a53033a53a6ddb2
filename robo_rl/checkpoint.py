"""Atomic checkpoints: ``<run>/checkpoints/step_<N>/{model.safetensors, trainer.pt, meta.json}``.

Writes go to a temp directory that is fsynced and renamed into place, then the ``latest`` pointer
file is replaced atomically, so a crash at any moment leaves the previous checkpoint intact.
Loading validates the format tag, the policy name and the tensor names/shapes, and fails with one
line naming what does not match.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from robo_rl.errors import CheckpointError

FORMAT = "robo-rl-checkpoint"
VERSION = 1


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """A temp path next to ``path`` (ending in ``suffix``, for writers that pick the format by it) for the
    caller to write one file to; on leaving, the file is fsynced, renamed to ``path`` and the directory
    fsynced; on an error it is removed and ``path`` is untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}{suffix}")
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via temp file + fsync + rename."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def output_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a result file cannot be written at ``path`` (None: it can): ``path`` is a directory, or its
    nearest existing ancestor is not a directory or not writable (so the parent cannot be created)."""
    p = Path(path).expanduser().absolute()
    if p.is_dir():
        return f"{path} is a directory"
    parent = p.parent
    while not parent.exists():
        if parent.is_symlink():  # a dangling link: mkdir would fail on it
            return f"cannot create {p.parent}: {parent} is a broken link"
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot create {p.parent}: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable"
    return None


def check_replaceable(path: Path, is_ours: Any, what: str) -> None:
    """One-line error unless ``path`` may be (re)written as a ``what`` directory: it does not exist, is an
    empty directory, or ``is_ours(path)`` says it is one already. Anything else (a user's directory,
    ``.``) is never deleted."""
    path = Path(path)
    if path.name in ("", ".", "..") or path.resolve() == Path.cwd().resolve():
        raise CheckpointError(f"'{path}' is not a place for a new {what}; pass a new directory name")
    if path.exists() and not (path.is_dir() and (not any(path.iterdir()) or is_ours(path))):
        raise CheckpointError(f"'{path}' exists and is not a {what}; refusing to overwrite it (choose another path)")


def replace_dir(tmp: Path, path: Path) -> None:
    """Move the fully written directory ``tmp`` to ``path`` crash-safely: every file and ``tmp`` fsynced,
    an existing ``path`` moved aside (never deleted before the swap), renamed, the parent fsynced, then
    the old copy removed. ``tmp`` must be on ``path``'s filesystem (a sibling)."""
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(tmp)
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    if path.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)


def save(ckpt_root: Path, step: int, model_state: dict[str, torch.Tensor], trainer_state: dict[str, Any],
         meta: dict[str, Any], keep: int = 3) -> Path:
    """Save a checkpoint for env step ``step`` and point ``latest`` at it; keep it and the ``keep - 1``
    highest steps below it."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    restore_moved_aside(ckpt_root)  # a crash mid re-save earlier (the writer's side: readers never rename)
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
    _fsync_dir(ckpt_root)
    if moved:
        shutil.rmtree(old_copy, ignore_errors=True)
    atomic_write_text(ckpt_root / "latest", final.name + "\n")
    # Prune older steps only: the one just written always stays, and steps above it (left by a run
    # that crashed before moving `latest` and was resumed from an earlier checkpoint) are not counted.
    older = sorted(p for p in ckpt_root.glob("step_*") if p.is_dir() and _step_of(p) is not None and _step_of(p) < step)
    for p in older[:max(len(older) - (keep - 1), 0)] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
    return final


def _write_checkpoint_dir(tmp: Path, model_state: dict[str, torch.Tensor], trainer_state: dict[str, Any],
                          meta: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k, v in model_state.items():  # tied weights (e.g. LM head = embedding) share storage: copy repeats
        t = v.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        tensors[k] = t.clone() if ptr in seen and t.numel() else t
        seen.add(ptr)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": FORMAT})
    torch.save(trainer_state, tmp / "trainer.pt")
    (tmp / "meta.json").write_text(json.dumps({"format": FORMAT, "version": VERSION, **meta}, indent=2))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(tmp)


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
    """A run dir, a checkpoints dir or a checkpoint dir -> the checkpoint dir to load."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint path '{p}' does not exist; pass a run directory or a checkpoints/step_* directory")
    if (p / "meta.json").is_file():
        return p
    root = p / "checkpoints" if (p / "checkpoints").is_dir() else p
    aside = _moved_aside(root) if root.is_dir() else {}
    latest = root / "latest"
    if latest.is_file():
        try:
            name = latest.read_text().strip()
        except (OSError, ValueError):  # unreadable pointer: fall back to the highest step
            name = ""
        if name and (root / name / "meta.json").is_file():
            return root / name
        if name in aside:  # its writer crashed mid re-save: read the old copy where it lies
            return aside[name]
    cands = sorted([c for c in root.glob("step_*") if (c / "meta.json").is_file()] + list(aside.values()),
                   key=lambda c: c.name.lstrip(".").split(".old-")[0])
    if not cands:
        raise CheckpointError(f"no checkpoint found under '{p}' (expected checkpoints/step_*/meta.json)")
    return cands[-1]


def read_meta(ckpt: Path) -> dict[str, Any]:
    try:
        meta = json.loads((ckpt / "meta.json").read_text())
    except (OSError, ValueError) as err:  # ValueError: bad JSON or bytes that are not UTF-8
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
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(ckpt / "model.safetensors"))
    except (SafetensorError, OSError, RuntimeError) as err:
        raise CheckpointError(f"checkpoint weights '{ckpt / 'model.safetensors'}' are corrupt or missing ({str(err).splitlines()[0]})") from None


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    try:
        return torch.load(ckpt / "trainer.pt", map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises many types for a corrupt pickle/zip
        raise CheckpointError(f"checkpoint trainer state '{ckpt / 'trainer.pt'}' is corrupt or missing ({type(err).__name__})") from None


def load_into(module: torch.nn.Module, state: dict[str, torch.Tensor], ckpt: Path) -> None:
    """Strict load with a one-line message on name/shape mismatch."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    bad_shape = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
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
    module.load_state_dict(state)
