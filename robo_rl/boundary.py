"""The one conversion at the env <-> policy boundary: numpy observations in, torch actions out.

Simulators and robots speak numpy (``robo_rl.contracts``); policies speak torch. Every loop that
joins the two (the rollout collector, evaluation, steering, the robot node) converts here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from robo_rl.contracts import ArraySpec, Observation


def obs_to_torch(obs: Observation) -> dict[str, Any]:
    """Numpy observation arrays -> tensors (sharing memory); ``instruction`` (list[str]) is passed
    through as is, other non-array entries are dropped. The rollout buffer stores only the tensors
    (policies that need the text, like VLAs, put its token ids into ``extras``)."""
    out: dict[str, Any] = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in obs.items() if isinstance(v, np.ndarray)}
    if "instruction" in obs:
        out["instruction"] = list(obs["instruction"])
    return out


def to_env_actions(actions: torch.Tensor, spec: ArraySpec) -> np.ndarray:
    """Policy actions (B, A) or chunks (B, H, A) -> float32 numpy clipped to the env's per-dimension
    bounds (``ArraySpec.bounds``)."""
    a = actions.detach().cpu().numpy().astype(np.float32)
    bounds = spec.bounds()
    if bounds is not None:
        np.clip(a, *bounds, out=a)
    return a
