"""Reader of the official LIBERO demonstration files (robomimic-style HDF5), from a local path.

Layout read::

    data/                 attrs: problem_info (JSON with language_instruction), env_args, ...
    data/demo_<i>/actions (T, 7)   obs/agentview_rgb (T, H, W, 3), obs/eye_in_hand_rgb (T, H, W, 3),
                          obs/ee_pos (T, 3), obs/ee_ori (T, 3), obs/gripper_states (T, 2),
                          rewards (T,), dones (T,)

LIBERO stores T observations for T actions (no final obs); we repeat the last observation so the
result has the robo-rl shapes (T+1 obs). Images are turned upright, as our LIBERO adapter does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from robo_rl.data.episodes import DatasetError, Episode, _open


def read_libero_demos(path: str | Path) -> Iterator[Episode]:
    """Yield each demo of an official LIBERO hdf5 file as an ``Episode`` (rgb (T+1, 2, H, W, 3),
    state (T+1, 8) = ee_pos, ee_ori (axis-angle), gripper_states)."""
    path = Path(path)
    with _open(path) as f:
        if "data" not in f:
            raise DatasetError(f"'{path}' has no 'data' group; it is not an official LIBERO demonstration file")
        data = f["data"]
        instruction = ""
        if "problem_info" in data.attrs:
            try:
                instruction = json.loads(data.attrs["problem_info"]).get("language_instruction", "")
            except json.JSONDecodeError:
                raise DatasetError(f"'{path}' data.attrs['problem_info'] is not JSON") from None
        demos = sorted((k for k in data if k.startswith("demo_")), key=lambda k: int(re.sub(r"\D", "", k) or 0))
        for name in demos:
            g = data[name]
            where = f"'{path}' data/{name}"
            required = ["actions", "obs/agentview_rgb", "obs/eye_in_hand_rgb", "obs/ee_pos", "obs/ee_ori",
                        "obs/gripper_states"]
            missing = [k for k in required if k not in g]
            if missing:
                raise DatasetError(f"{where} lacks '{missing[0].split('/')[-1]}' ({missing[0]})")
            try:
                actions = np.asarray(g["actions"], np.float32)
                obs = g["obs"]
                rgb = np.stack([np.asarray(obs["agentview_rgb"])[:, ::-1, ::-1],
                                np.asarray(obs["eye_in_hand_rgb"])[:, ::-1, ::-1]], axis=1)
                state = np.concatenate([np.asarray(obs["ee_pos"]), np.asarray(obs["ee_ori"]),
                                        np.asarray(obs["gripper_states"])], axis=1).astype(np.float32)
                rewards = np.asarray(g["rewards"], np.float32) if "rewards" in g else np.zeros(len(actions), np.float32)
                dones = np.asarray(g["dones"], bool) if "dones" in g else np.zeros(len(actions), bool)
            except KeyError as err:
                raise DatasetError(f"{where} lacks {err}") from None
            t = actions.shape[0]
            if actions.ndim != 2 or actions.shape[1] != 7:
                raise DatasetError(f"{where}: actions must be (T, 7), got {actions.shape}")
            if rgb.shape[0] != t or state.shape[0] != t:
                raise DatasetError(f"{where}: {rgb.shape[0]} image / {state.shape[0]} state steps for {t} actions")
            if rewards.shape != (t,) or dones.shape != (t,):
                raise DatasetError(f"{where}: rewards/dones must be ({t},), got {rewards.shape} and {dones.shape}")
            yield Episode({"rgb": np.ascontiguousarray(np.concatenate([rgb, rgb[-1:]])),
                           "state": np.concatenate([state, state[-1:]])},
                          actions, rewards, dones, instruction)
