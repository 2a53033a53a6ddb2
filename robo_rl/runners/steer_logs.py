"""Steering logs (``robo-rl steer collect``'s .npz files): loading, pooling and checking them against the
base policy (one-line errors for anything that would fail deep inside the model)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from robo_rl.errors import ConfigError

LOG_KEYS = frozenset({"rgb", "actions", "rtg", "failed", "episode", "instruction"})
"""Arrays every ``steer collect`` log holds (``state`` too when the env observes it)."""


def check_log_fits(data: dict[str, np.ndarray], policy: Any, obs_spec: dict[str, Any], where: str) -> None:
    """The log's images and actions have the base policy's shapes (``obs_spec``: its checkpoint's; a log of
    another env setup would fail deep inside the model): one-line error naming both."""
    want = tuple(obs_spec["rgb"].shape) if "rgb" in obs_spec else None
    got = tuple(data["rgb"].shape[1:])
    if want is not None and got != want:
        raise ConfigError(f"steering log {where} has images {got} but the base policy takes {want}; collect the log "
                          "with this checkpoint and its env settings")
    dim = int(getattr(policy, "action_dim", data["actions"].shape[-1]))
    if data["actions"].shape[-1] != dim:
        raise ConfigError(f"steering log {where} has {data['actions'].shape[-1]}-D actions but the base policy acts in "
                          f"{dim}-D; collect the log with this checkpoint")


def load_logs(paths: list[str | Path]) -> dict[str, np.ndarray]:
    """One or more ``steer collect`` logs pooled into one (episode ids renumbered to stay distinct)."""
    if not paths:
        raise ConfigError("steer fit --log: give at least one log from 'robo-rl steer collect'")
    parts = []
    for path in paths:
        if not Path(path).is_file():
            raise ConfigError(f"steering log '{path}' does not exist; write one with 'robo-rl steer collect'")
        try:
            npz = np.load(path)
            if not isinstance(npz, np.lib.npyio.NpzFile):
                raise ValueError(f"a single {type(npz).__name__}, not an archive of named arrays")
            with npz:
                part = {k: npz[k] for k in npz.files}
        except (OSError, ValueError, zipfile.BadZipFile) as err:  # npy, truncated zip, not numpy
            raise ConfigError(f"steering log '{path}' is not a readable .npz from 'robo-rl steer collect' "
                              f"({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
        missing = sorted(LOG_KEYS - set(part))
        if missing:
            raise ConfigError(f"steering log '{path}' lacks {', '.join(missing)}; write it with 'robo-rl steer collect'")
        n = len(part["rtg"])
        if n == 0 or any(len(part[k]) != n for k in part) or part["rgb"].ndim != 5 or part["actions"].ndim < 2:
            raise ConfigError(f"steering log '{path}' has inconsistent arrays ({', '.join(f'{k} {part[k].shape}' for k in sorted(part))}); "
                              "expected N rows of rgb (N, V, H, W, 3), actions (N, ..., A) and the rest (N,)")
        parts.append(part)
    if not all("base_id" in part for part in parts):  # older logs name no base: pooled, the id is dropped
        for part in parts:
            part.pop("base_id", None)
    keys = set(parts[0])
    for path, part in zip(paths[1:], parts[1:]):
        if set(part) != keys or part["rgb"].shape[1:] != parts[0]["rgb"].shape[1:]:
            raise ConfigError(f"steering log '{path}' does not match '{paths[0]}' (keys {sorted(part)} vs {sorted(keys)}, "
                              f"rgb {part['rgb'].shape[1:]} vs {parts[0]['rgb'].shape[1:]}): pool logs of one env setup")
    offset = 0
    for part in parts:
        part["episode"] = part["episode"] + offset
        offset = int(part["episode"].max()) + 1
    return {k: np.concatenate([part[k] for part in parts]) for k in keys} if len(parts) > 1 else parts[0]


def base_fingerprint(checkpoint: str | Path) -> str:
    """A short id of the checkpoint a log was collected with: sha256 of its meta.json and its weights'
    size (the weights themselves are not read: 7B checkpoints)."""
    from robo_rl.checkpoint import resolve

    ckpt = resolve(checkpoint)
    h = hashlib.sha256((ckpt / "meta.json").read_bytes())
    for f in sorted(ckpt.glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]


def check_log_base(data: dict[str, np.ndarray], checkpoint: str | Path, where: str) -> None:
    """Logs that name the base they were collected with must name this one (older logs name none)."""
    if "base_id" not in data:
        return
    have = sorted({str(x) for x in np.unique(data["base_id"])})
    want = base_fingerprint(checkpoint)
    if have != [want]:
        raise ConfigError(f"steering log {where} was collected with another base policy (id {', '.join(have)}; "
                          f"'{checkpoint}' is {want}); collect the log with this checkpoint")
