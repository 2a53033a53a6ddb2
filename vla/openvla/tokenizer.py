"""OpenVLA's action tokenizer and action normalizer.

Actions are normalized per dimension with the dataset's 1st/99th percentiles to [-1, 1] (dimensions
whose ``mask`` is False, e.g. the gripper, pass through), clipped, and discretized into ``n_bins``
uniform bins over [-1, 1]. Token ids are the last ``n_bins`` ids of the base vocabulary:
``id = vocab_size - digitize(a, bins)`` (so ids span ``[vocab_size - n_bins, vocab_size)``), and the
inverse maps an id to its bin centre. This is exactly OpenVLA's ``ActionTokenizer``; RL code works on
the *action index* ``k = id - (vocab_size - n_bins)`` in ``[0, n_bins)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from robo_rl.errors import CheckpointError


class ActionTokenizer:
    """Maps normalized actions in [-1, 1] to token ids and back.

    vocab_size: size of the *base* vocabulary the action ids are carved from (OpenVLA: 32000, i.e.
    the LM's vocab without the pad-to-multiple rows).
    """

    def __init__(self, vocab_size: int, n_bins: int = 256) -> None:
        if n_bins < 2 or vocab_size < n_bins:
            raise ValueError(f"n_bins={n_bins} must be >= 2 and <= vocab_size={vocab_size}")
        self.vocab_size = vocab_size
        self.n_bins = n_bins
        self.bins = np.linspace(-1.0, 1.0, n_bins)
        self.bin_centers = (self.bins[:-1] + self.bins[1:]) / 2.0

    @property
    def first_id(self) -> int:
        """Smallest action token id; action index k <-> token id first_id + k."""
        return self.vocab_size - self.n_bins

    @property
    def bin_width(self) -> float:
        return float(self.bins[1] - self.bins[0])

    def encode(self, actions: np.ndarray) -> np.ndarray:
        """(..., A) normalized actions -> (..., A) int64 token ids."""
        a = np.clip(np.asarray(actions, dtype=np.float64), -1.0, 1.0)
        return (self.vocab_size - np.digitize(a, self.bins)).astype(np.int64)

    def decode(self, token_ids: np.ndarray) -> np.ndarray:
        """(..., A) token ids -> (..., A) normalized actions (bin centres), float32."""
        idx = np.clip(self.vocab_size - np.asarray(token_ids, dtype=np.int64) - 1, 0, self.bin_centers.shape[0] - 1)
        return self.bin_centers[idx].astype(np.float32)

    def ids_to_index(self, token_ids: torch.Tensor) -> torch.Tensor:
        return token_ids - self.first_id

    def index_to_ids(self, index: torch.Tensor) -> torch.Tensor:
        return index + self.first_id


@dataclass(frozen=True)
class NormStats:
    """Per-dimension action statistics (OpenVLA ``norm_stats[key]["action"]``), each of length A."""

    q01: tuple[float, ...]
    q99: tuple[float, ...]
    mask: tuple[bool, ...]

    @property
    def action_dim(self) -> int:
        return len(self.q01)

    @classmethod
    def from_norm_stats(cls, norm_stats: dict[str, Any], key: str | None) -> NormStats:
        """Pick ``key`` from an OpenVLA ``norm_stats`` dict (``key`` may be None if there is one)."""
        if not norm_stats:
            raise CheckpointError("checkpoint has no norm_stats; it needs {dataset_key: {'action': {q01, q99, mask}}}")
        if key is None:
            if len(norm_stats) != 1:
                raise CheckpointError(f"checkpoint has norm stats for {sorted(norm_stats)}; choose one with unnorm_key")
            key = next(iter(norm_stats))
        if key not in norm_stats:
            raise CheckpointError(f"norm stats for dataset key {key!r} are missing; the checkpoint has {sorted(norm_stats)}")
        entry = norm_stats[key]
        act = entry.get("action", {}) if isinstance(entry, dict) else None
        if not isinstance(act, dict):
            raise CheckpointError(f"norm_stats[{key!r}] must be {{'action': {{'q01': [...], 'q99': [...], 'mask': [...]}}}}, "
                                  f"got {type(entry).__name__}")
        if "q01" not in act or "q99" not in act:
            raise CheckpointError(f"norm_stats[{key!r}]['action'] needs q01 and q99 (has {sorted(act)})")
        q01, q99 = tuple(float(x) for x in act["q01"]), tuple(float(x) for x in act["q99"])
        mask = tuple(bool(x) for x in act.get("mask", [True] * len(q01)))
        if not len(q01) == len(q99) == len(mask):
            raise CheckpointError(f"norm_stats[{key!r}]['action'] q01/q99/mask lengths differ ({len(q01)}, {len(q99)}, {len(mask)})")
        return cls(q01, q99, mask)

    @classmethod
    def from_actions(cls, actions: np.ndarray, mask: tuple[bool, ...] | None = None) -> NormStats:
        """Statistics of a dataset's (N, A) actions; by default the last dim (gripper) is unmasked."""
        a = np.asarray(actions, dtype=np.float64)
        m = mask if mask is not None else tuple([True] * (a.shape[1] - 1) + [False])
        return cls(tuple(np.quantile(a, 0.01, axis=0).tolist()), tuple(np.quantile(a, 0.99, axis=0).tolist()), m)

    def to_dict(self) -> dict[str, Any]:
        return {"action": {"q01": list(self.q01), "q99": list(self.q99), "mask": list(self.mask)}}

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        """(..., A) env actions -> (..., A) in [-1, 1] (masked-off dims only clipped)."""
        q01, q99, m = np.asarray(self.q01), np.asarray(self.q99), np.asarray(self.mask)
        a = np.asarray(actions, dtype=np.float64)
        scaled = 2.0 * (a - q01) / np.maximum(q99 - q01, 1e-8) - 1.0
        return np.clip(np.where(m, scaled, a), -1.0, 1.0).astype(np.float32)

    def unnormalize(self, normalized: np.ndarray) -> np.ndarray:
        """(..., A) in [-1, 1] -> env units: ``0.5 (a + 1)(q99 - q01) + q01`` where mask, else as is."""
        q01, q99, m = np.asarray(self.q01), np.asarray(self.q99), np.asarray(self.mask)
        a = np.asarray(normalized, dtype=np.float64)
        return np.where(m, 0.5 * (a + 1.0) * (q99 - q01) + q01, a).astype(np.float32)
