"""Control-mode conversion of recorded ManiSkill demos.

The motion-planned experts act in ``pd_joint_pos`` (absolute joint targets). Policies learn far more
easily from ``pd_joint_delta_pos`` actions (the target relative to the current joint position), and
the conversion is exact: ManiSkill's delta controller (``use_target=False``) sets the PD target to
``qpos + delta_limit * a``, so ``a = (target - qpos) / delta_limit`` gives the same target whenever it
lies inside ``[-1, 1]``; the gripper action is the same in both modes. A step slightly past the bound
(the planner occasionally asks 0.101 rad) is clipped and counted in ``ep.extra["clipped_steps"]``; the
next delta is taken from the measured qpos, so the error does not accumulate. A step more than
``max_overshoot`` past the bound fails the conversion instead of silently changing the demo.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from robo_rl.data.episodes import DatasetError, Episode

SUPPORTED = {("pd_joint_pos", "pd_joint_delta_pos")}

PANDA_ARM_DOFS = 7
PANDA_DELTA_LIMIT = 0.1
"""Bound (rad) of ManiSkill Panda's ``arm_pd_joint_delta_pos`` controller (its normalized -1..1 range)."""


def joint_pos_to_delta(ep: Episode, arm_dofs: int = PANDA_ARM_DOFS, delta_limit: float = PANDA_DELTA_LIMIT,
                       qpos_key: str = "state", max_overshoot: float = 0.1) -> Episode:
    """Return ``ep`` with its (T, A) absolute joint targets turned into normalized deltas.

    ``ep.obs[qpos_key][:, :arm_dofs]`` must be the arm's joint positions (ManiSkill's flattened
    state starts with ``agent.qpos``). Columns past ``arm_dofs`` (the gripper) are kept.
    """
    if qpos_key not in ep.obs:
        raise DatasetError(f"episode (seed {ep.seed}) has no obs/{qpos_key}; joint positions are needed to convert")
    qpos = np.asarray(ep.obs[qpos_key], np.float32)[:-1, :arm_dofs]
    if ep.actions.shape[1] <= arm_dofs or qpos.shape[1] != arm_dofs:
        raise DatasetError(f"episode (seed {ep.seed}): actions {ep.actions.shape} / obs/{qpos_key} "
                           f"{ep.obs[qpos_key].shape} do not hold {arm_dofs} arm joints plus a gripper")
    delta = (ep.actions[:, :arm_dofs] - qpos) / delta_limit
    worst = float(np.abs(delta).max()) if delta.size else 0.0
    if worst > 1.0 + max_overshoot:
        step = int(np.abs(delta).max(axis=1).argmax())
        raise DatasetError(f"episode (seed {ep.seed}) step {step} moves a joint by {worst * delta_limit:.3f} rad, more "
                           f"than the delta controller's {delta_limit} rad per step; it cannot be converted exactly")
    actions = np.concatenate([np.clip(delta, -1.0, 1.0), ep.actions[:, arm_dofs:]], axis=1).astype(np.float32)
    clipped = int((np.abs(delta) > 1.0).any(axis=1).sum())
    return replace(ep, actions=actions, extra={**ep.extra, "clipped_steps": clipped})


def convert(ep: Episode, src: str, dst: str) -> Episode:
    """Convert one episode's actions from control mode ``src`` to ``dst``."""
    if (src, dst) not in SUPPORTED:
        raise DatasetError(f"cannot convert demos from {src!r} to {dst!r}; supported: "
                           + ", ".join(f"{a} -> {b}" for a, b in sorted(SUPPORTED)))
    return joint_pos_to_delta(ep)
