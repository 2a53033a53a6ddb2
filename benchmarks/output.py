"""Argument checks, result files and device timing shared by the ``robo-rl bench`` sub-commands.

Every bench checks its arguments right after parsing (``ap.error``: exit code 2, one usage + error
line) so that a bad count or an output path that cannot be written fails before any model or env is
built, not after the whole measurement. Result files are written atomically (temp file + fsync +
rename), their directory created first.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from robo_rl.files import atomic_write_text, output_problem


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_min(ap: argparse.ArgumentParser, args: argparse.Namespace, minimum: int | float, *names: str) -> None:
    """``ap.error`` unless each of ``args.<name>`` (a number, each number of a list, or None: not given)
    is >= ``minimum``."""
    for name in names:
        value = getattr(args, name)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and v < minimum:
                ap.error(f"{_flag(name)} {v} must be >= {minimum}")


def check_positive(ap: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """``ap.error`` unless each of ``args.<name>`` (a float, or None) is > 0 (and finite)."""
    for name in names:
        v = getattr(args, name)
        if v is not None and not 0 < v < float("inf"):
            ap.error(f"{_flag(name)} {v} must be > 0")


def check_output(ap: argparse.ArgumentParser, args: argparse.Namespace, name: str) -> None:
    """``ap.error`` if ``args.<name>`` (an output file path, or None: no file) cannot be written."""
    path = getattr(args, name)
    if path is not None:
        if not str(path):
            ap.error(f"{_flag(name)} needs a file path")
        problem = output_problem(path)
        if problem:
            ap.error(f"{_flag(name)} {path}: {problem}")


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically, creating its directory first."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, text)
    return p


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically, creating its directory first."""
    return write_text(path, json.dumps(obj, indent=2))


def sync(device: str) -> None:
    """Wait for the queued CUDA work on ``device`` (a no-op on the CPU), so a timer reads finished work."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
