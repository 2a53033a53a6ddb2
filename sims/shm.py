"""Shared-memory arrays for the subprocess vector env: one block per array, (B, ...) each.

The parent creates the blocks (it alone unlinks them); workers attach by name and write only their
own row, so per-step messages shrink to a few bytes instead of pickled observations.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from robo_rl.contracts import ArraySpec


@dataclass(frozen=True)
class ArrayLayout:
    """Name, shape and dtype of one shared array (picklable, sent to workers)."""

    block: str
    shape: tuple[int, ...]
    dtype: str


class SharedArrays:
    """A named set of numpy arrays backed by shared memory."""

    def __init__(self, layouts: dict[str, ArrayLayout], blocks: dict[str, shared_memory.SharedMemory], owner: bool) -> None:
        self.layouts = layouts
        self._blocks = blocks
        self._owner = owner
        self.arrays = {k: np.ndarray(lay.shape, dtype=np.dtype(lay.dtype), buffer=blocks[k].buf) for k, lay in layouts.items()}

    @classmethod
    def create(cls, specs: dict[str, tuple[tuple[int, ...], str]]) -> SharedArrays:
        """specs: name -> (shape including the batch dim, dtype)."""
        layouts, blocks = {}, {}
        for name, (shape, dtype) in specs.items():
            nbytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
            blk = shared_memory.SharedMemory(create=True, size=nbytes)
            blocks[name] = blk
            layouts[name] = ArrayLayout(blk.name, tuple(shape), dtype)
        out = cls(layouts, blocks, owner=True)
        for arr in out.arrays.values():
            arr.fill(0)
        return out

    @classmethod
    def attach(cls, layouts: dict[str, ArrayLayout]) -> SharedArrays:
        blocks = {k: shared_memory.SharedMemory(name=lay.block) for k, lay in layouts.items()}
        return cls(layouts, blocks, owner=False)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def close(self) -> None:
        self.arrays = {}
        for blk in self._blocks.values():
            try:
                blk.close()
                if self._owner:
                    blk.unlink()
            except (FileNotFoundError, BufferError):
                pass
        self._blocks = {}


def vec_env_layout(num_envs: int, obs_spec: dict[str, ArraySpec], action_spec: ArraySpec) -> dict[str, Any]:
    """Arrays a vector env shares with its workers: actions, obs/*, final/*, and per-step scalars
    (``stepped``: a worker marks each row whose step finished, so a crash mid-worker keeps its siblings' results)."""
    b = num_envs
    specs: dict[str, tuple[tuple[int, ...], str]] = {"actions": ((b, *action_spec.shape), "float32")}
    for k, s in obs_spec.items():
        specs[f"obs/{k}"] = ((b, *s.shape), s.dtype)
        specs[f"final/{k}"] = ((b, *s.shape), s.dtype)
    for k, dt in (("reward", "float32"), ("terminated", "bool"), ("truncated", "bool"), ("success", "bool"),
                  ("has_final", "bool"), ("stepped", "bool")):
        specs[k] = ((b,), dt)
    return specs
