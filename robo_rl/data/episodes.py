"""robo-rl episode datasets: one HDF5 file, written atomically.

Layout (format ``robo-rl-episodes`` version 1)::

    /                       attrs: format, version, meta (JSON: env, task, control_mode, source, ...)
    /episode_000000/        attrs: instruction (str), seed (int, -1 if none), success (bool, at the end)
        obs/state           (T+1, D) float32   observation before each action, plus the final one
        obs/rgb             (T+1, V, H, W, 3) uint8 (optional; gzip-compressed), or (F, V, H, W, 3) with frame_steps
        frame_steps         (F,) int64 (optional) the steps 0..T, ascending, whose images obs/rgb holds; without
                            it every step has its image. Images cost most of a rendered episode's time and a
                            chunked policy looks at one frame per chunk, so recording every k-th frame buys
                            k times fewer renders per step (``robo-rl demos generate --frame-every``).
        actions             (T, A) float32     in the env's control mode (meta.control_mode)
        rewards             (T,) float32
        success             (T,) bool          the env's success flag after each action

Loading checks the format tag, the version and every shape, and fails with one line naming the
episode and field that is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robo_rl.errors import RoboRLError

FORMAT = "robo-rl-episodes"
VERSION = 1


class DatasetError(RoboRLError):
    """A demonstration file is missing, malformed or of another format."""


@dataclass
class Episode:
    """One demonstration. T = number of actions."""

    obs: dict[str, np.ndarray]
    """Each (T+1, ...): the observation before every action and the final one."""
    actions: np.ndarray
    """(T, A) float32."""
    rewards: np.ndarray
    """(T,) float32."""
    success: np.ndarray
    """(T,) bool, after each action."""
    instruction: str = ""
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    frame_steps: np.ndarray | None = None
    """(F,) int64 steps (ascending, within 0..T) whose images ``obs['rgb']`` holds (F rows); None: every step."""

    def image_rows(self) -> np.ndarray:
        """(R,) the steps 0..T-1 that have every observation (a training row each: an action follows)."""
        if self.frame_steps is None or "rgb" not in self.obs:
            return np.arange(self.length)
        return self.frame_steps[self.frame_steps < self.length]

    def obs_at(self, key: str, steps: np.ndarray) -> np.ndarray:
        """``obs[key]`` at ``steps`` (R,), which must be in ``image_rows()`` for the images."""
        if key == "rgb" and self.frame_steps is not None:
            return self.obs[key][np.searchsorted(self.frame_steps, steps)]
        return self.obs[key][steps]

    @property
    def length(self) -> int:
        return int(self.actions.shape[0])

    @property
    def succeeded(self) -> bool:
        return bool(self.success[-1]) if self.length else False


def write_episodes(path: str | Path, episodes: list[Episode], meta: dict[str, Any]) -> Path:
    """Write ``episodes`` to ``path`` (temp file + fsync + rename). Every episode is checked as loading
    checks it first, so a file is written only if it can be read back; a failed write leaves no temp file."""
    import h5py

    from robo_rl.files import atomic_path

    path = Path(path)
    shapes: dict[str, tuple[int, ...]] = {}
    for n, ep in enumerate(episodes):
        _check_episode(ep.obs, ep.actions, ep.rewards, ep.success, f"episode {n} for '{path}'", shapes, ep.frame_steps)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        f.attrs["format"] = FORMAT
        f.attrs["version"] = VERSION
        f.attrs["meta"] = json.dumps({**meta, "num_episodes": len(episodes)})
        for n, ep in enumerate(episodes):
            g = f.create_group(f"episode_{n:06d}")
            g.attrs["instruction"] = ep.instruction
            g.attrs["seed"] = -1 if ep.seed is None else int(ep.seed)
            g.attrs["success"] = ep.succeeded
            for k, v in ep.obs.items():
                big = v.dtype == np.uint8 and v.ndim >= 3
                g.create_dataset(f"obs/{k}", data=v, compression="gzip" if big else None)
            g.create_dataset("actions", data=ep.actions.astype(np.float32))
            g.create_dataset("rewards", data=ep.rewards.astype(np.float32))
            g.create_dataset("success", data=ep.success.astype(bool))
            if ep.frame_steps is not None:
                g.create_dataset("frame_steps", data=np.asarray(ep.frame_steps, np.int64))
    return path


def _check_episode(obs: dict[str, np.ndarray], actions: np.ndarray, rewards: np.ndarray, success: np.ndarray,
                   where: str, shapes: dict[str, tuple[int, ...]], frame_steps: np.ndarray | None = None) -> None:
    """One episode's shapes: actions (T, A), obs/state (T+1, D), obs/rgb (T+1, V, H, W, 3) (or one row per
    ``frame_steps`` entry: ascending steps within 0..T), every other obs entry T+1 steps, rewards/success
    (T,); A and the obs shapes past the time axis equal those in ``shapes`` (filled from the first episode
    checked)."""
    if actions.ndim != 2:
        raise DatasetError(f"{where}: actions must be (T, A), got shape {actions.shape}")
    t = actions.shape[0]
    if not obs:
        raise DatasetError(f"{where}: obs has no entries; expected obs/state and/or obs/rgb")
    ranks = {"state": 2, "rgb": 5}
    if frame_steps is not None:
        f = np.asarray(frame_steps)
        if "rgb" not in obs:
            raise DatasetError(f"{where}: frame_steps names the steps of obs/rgb, but the episode has no obs/rgb")
        if f.ndim != 1 or not np.issubdtype(f.dtype, np.integer) or (f.size and (f[0] < 0 or f[-1] > t)) \
                or np.any(np.diff(f) <= 0):
            raise DatasetError(f"{where}: frame_steps must be ascending integer steps within 0..{t}, got {f.tolist()[:8]}")
    for k, v in obs.items():
        if v.ndim < 1 or (k in ranks and v.ndim != ranks[k]):
            want = "(T+1, D)" if k == "state" else "(T+1, V, H, W, 3)" if k == "rgb" else "(T+1, ...)"
            raise DatasetError(f"{where}: obs/{k} must be {want}, got shape {v.shape}")
        steps = t + 1 if k != "rgb" or frame_steps is None else len(frame_steps)
        if v.shape[0] != steps:
            want = f"T+1 = {t + 1}" if steps == t + 1 else f"one per frame_steps entry = {steps}"
            raise DatasetError(f"{where}: obs/{k} has {v.shape[0]} steps, expected {want}")
    if rewards.shape != (t,) or success.shape != (t,):
        raise DatasetError(f"{where}: rewards/success must be ({t},), got {rewards.shape} and {success.shape}")
    mine = {"actions": actions.shape[1:], **{f"obs/{k}": v.shape[1:] for k, v in obs.items()}}
    if not shapes:
        shapes.update(mine)
    elif mine != shapes:
        bad = next(k for k in sorted(set(mine) | set(shapes)) if mine.get(k) != shapes.get(k))
        raise DatasetError(f"{where}: {bad} is {mine.get(bad)} per step but the first episode's is {shapes.get(bad)}; "
                           "one file holds one task's episodes with the same spaces")


def _open(path: Path) -> Any:
    import h5py

    if not path.is_file():
        raise DatasetError(f"demonstration file '{path}' does not exist")
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise DatasetError(f"'{path}' is not a readable HDF5 file ({err}); expected a robo-rl episodes file") from None


def read_meta(path: str | Path) -> dict[str, Any]:
    with _open(Path(path)) as f:
        return _check_header(f, Path(path))


def _check_header(f: Any, path: Path) -> dict[str, Any]:
    fmt = f.attrs.get("format")
    if isinstance(fmt, bytes | np.bytes_):
        fmt = fmt.decode(errors="replace")
    if fmt != FORMAT:
        hint = " (official LIBERO demos: use robo_rl.data.libero_hdf5.read_libero_demos)" if "data" in f else ""
        raise DatasetError(f"'{path}' has format {fmt!r}, expected {FORMAT!r}{hint}")
    if f.attrs.get("version") != VERSION:
        raise DatasetError(f"'{path}' is version {f.attrs.get('version')}, this robo-rl reads version {VERSION}")
    try:
        meta = json.loads(f.attrs["meta"])
    except (KeyError, TypeError, ValueError):  # ValueError: bad JSON or bytes that are not UTF-8
        meta = None
    if not isinstance(meta, dict):
        raise DatasetError(f"'{path}' has no readable 'meta' attribute (expected a JSON object)")
    return meta


def _episode(g: Any, name: str, path: Path, shapes: dict[str, tuple[int, ...]]) -> Episode:
    import h5py

    where = f"'{path}' {name}"
    for key in ("obs", "actions", "rewards", "success"):
        if key not in g:
            raise DatasetError(f"{where} lacks '{key}'")
    if not isinstance(g["obs"], h5py.Group) or not all(isinstance(v, h5py.Dataset) for v in g["obs"].values()):
        raise DatasetError(f"{where}: obs must be a group of datasets (obs/state, obs/rgb)")
    actions = np.asarray(g["actions"], np.float32)
    obs = {k: np.asarray(v) for k, v in g["obs"].items()}
    rewards, success = np.asarray(g["rewards"], np.float32), np.asarray(g["success"], bool)
    frames = np.asarray(g["frame_steps"]) if "frame_steps" in g else None
    _check_episode(obs, actions, rewards, success, where, shapes, frames)
    seed = int(g.attrs.get("seed", -1))
    return Episode(obs, actions, rewards, success, str(g.attrs.get("instruction", "")), None if seed < 0 else seed,
                   frame_steps=None if frames is None else frames.astype(np.int64))


def load_episodes(path: str | Path) -> Iterator[Episode]:
    """Yield the episodes of a robo-rl episodes file, validated."""
    path = Path(path)
    shapes: dict[str, tuple[int, ...]] = {}
    with _open(path) as f:
        _check_header(f, path)
        for name in sorted(k for k in f if k.startswith("episode_")):
            yield _episode(f[name], name, path, shapes)
