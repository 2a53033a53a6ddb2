"""Files written and read safely: bounded JSON, paths confined to a directory, atomic writes
(temp + fsync + rename) and crash-safe directory swaps. Used by checkpoints, run directories, results
files and steering directories."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from robo_rl.errors import CheckpointError

MAX_JSON_BYTES = 16 * 2**20
"""Largest JSON file (meta.json, trainer.json, a shard index) read; robo-rl writes a few KB."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of JSON arrays/objects read; robo-rl writes fewer than ten levels."""


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message (its type name when it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# --- bounded JSON ---------------------------------------------------------------------------------------

_STRUCTURE = b'"[]{}'
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(_STRUCTURE)))
_STRING = re.compile(rb'"[^"]*"')


def json_depth(data: bytes, stop_above: int = MAX_JSON_DEPTH) -> int:
    """Deepest nesting of arrays/objects in the JSON text ``data``, brackets inside strings ignored; counting
    stops soon after the depth passes ``stop_above``. Linear time, a few copies of ``data`` in memory."""
    marks = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    brackets = _STRING.sub(b"", marks)
    depth = peak = 0
    chunk = 1 << 20
    for start in range(0, len(brackets), chunk):
        part = np.frombuffer(brackets, np.uint8, count=min(chunk, len(brackets) - start), offset=start)
        run = np.cumsum(np.where((part == ord("[")) | (part == ord("{")), 1, -1)) + depth
        peak, depth = max(peak, int(run.max())), int(run[-1])
        if peak > stop_above:
            break
    return peak


def parse_json(data: bytes, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(data)`` once ``data`` is known to be at most ``max_bytes`` long and ``max_depth`` deep;
    ``ValueError`` naming the limit otherwise."""
    if len(data) > max_bytes:
        raise ValueError(f"more than {max_bytes // 2**20} MiB, the most a robo-rl JSON file may have")
    if json_depth(data, max_depth) > max_depth:
        raise ValueError(f"nested more than {max_depth} levels deep, the most a robo-rl JSON file may have")
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"nested more than {max_depth} levels deep") from None


def read_json(path: str | os.PathLike[str], max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON file ``path`` parsed by :func:`parse_json` (reading at most ``max_bytes`` + 1 bytes);
    ``OSError`` / ``ValueError`` for a file that cannot be read or parsed."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size  # 0 for a pipe or device: read up to the limit
        data = fh.read(min(size, max_bytes) + 1 if size else max_bytes + 1)
    return parse_json(data, max_bytes, max_depth)


# --- paths that must stay inside a directory -----------------------------------------------------------

def is_inside(path: Path, root: Path) -> bool:
    """Whether ``path`` with every link resolved lies in ``root`` (resolved) or is ``root`` itself."""
    return Path(path).resolve().is_relative_to(Path(root).resolve())


def member(base: Path, name: Any, what: str) -> Path:
    """``base / name`` for a relative file name read from a file (a shard of an index): one-line error
    unless it is a plain relative path that, links resolved, stays inside ``base``."""
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts \
            or not is_inside(base / name, base):
        raise CheckpointError(f"{what} names the file {name!r}, which is not inside '{base}'; it must name a "
                              "file in that directory (a relative path without '..' or links out)")
    return base / name


def fsync_dir(path: Path) -> None:
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
    fsync_dir(path.parent)


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
    fsync_dir(tmp)
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    if path.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)
