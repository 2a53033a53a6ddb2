"""Scripted closed-loop experts for ManiSkill3 tasks in end-effector delta control (``pd_ee_delta_pos``).

OpenVLA-style policies act in end-effector deltas (OpenVLA's 7 tokens are xyz, rpy, gripper), and an
end-effector action is a far simpler function of what the camera shows than a joint-space one: near a
target it is proportional to (target - gripper). ManiSkill's motion planners act in ``pd_joint_pos``, and
re-expressing their plans as end-effector deltas would need a closed-loop replay; so for these tasks the
expert is written in the target control mode directly, reading privileged object poses (the demos record
only what the policy will see).

Each expert runs one episode on a 1-env CPU ManiSkill gym env wrapped by
:class:`sims.maniskill.experts.Recorder`: ``solve(env, seed, rng, noise)`` resets with ``seed``, then steps
until the task reports success or ``max_steps`` pass. With ``noise`` > 0 (DART-style) the executed arm
action carries Gaussian noise of that standard deviation (normalized action units) while the recorder keeps
the expert's clean action as the label, so the demos show how to recover from small errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

CONTROL_MODE = "pd_ee_delta_pos"
EE_DELTA_LIMIT = 0.1
"""Bound (m) of ManiSkill Panda's ``arm_pd_ee_delta_pos`` controller (its normalized -1..1 range)."""
GRIPPER_OPEN, GRIPPER_CLOSED = 1.0, -1.0


def _p(actor: Any) -> np.ndarray:
    """(3,) world position of a 1-env ManiSkill actor or link."""
    return actor.pose.p[0].cpu().numpy().astype(np.float64)


def arm_action(target: np.ndarray, tcp: np.ndarray, gain: float = 1.0, max_step: float = 0.05) -> np.ndarray:
    """(3,) normalized ``pd_ee_delta_pos`` action moving the gripper towards ``target``.

    The step is ``gain * (target - tcp)``, shortened to at most ``max_step`` metres, in units of the
    controller's 0.1 m bound.
    """
    d = gain * (np.asarray(target, np.float64) - tcp)
    n = float(np.linalg.norm(d))
    if n > max_step:
        d *= max_step / n
    return np.clip(d / EE_DELTA_LIMIT, -1.0, 1.0)


def _step(env: Any, arm: np.ndarray, grip: float, rng: np.random.Generator, noise: float) -> Any:
    import torch

    clean = np.concatenate([arm, [grip]]).astype(np.float32)
    executed = clean.copy()
    if noise > 0:
        executed[:3] = np.clip(executed[:3] + rng.normal(0.0, noise, 3), -1.0, 1.0)
    env.label = clean  # the recorder keeps the expert's action, not the perturbed one it executes
    return env.step(torch.from_numpy(executed)[None])


def solve_pick_cube(env: Any, seed: int, rng: np.random.Generator | None = None, noise: float = 0.0,
                    max_steps: int = 50) -> bool:
    """PickCube-v1: above the cube, down, close, carry to the goal. True on success (50/50 seeds clean)."""
    rng = rng or np.random.default_rng(seed)
    env.reset(seed=seed)
    u = env.unwrapped
    phase, hold = "above", 0
    for _ in range(max_steps):
        cube, tcp, goal = _p(u.cube), _p(u.agent.tcp), _p(u.goal_site)
        grasped = bool(u.agent.is_grasping(u.cube)[0])
        grip = GRIPPER_OPEN
        if phase == "above":
            target = cube + [0.0, 0.0, 0.05]
            if np.linalg.norm(target - tcp) < 0.01:
                phase = "down"
        if phase == "down":
            target = cube
            if np.linalg.norm(target - tcp) < 0.006:
                phase = "close"
        if phase == "close":
            target, grip, hold = cube, GRIPPER_CLOSED, hold + 1
            if hold >= 3 and grasped:
                phase = "carry"
            elif hold >= 8:  # the grasp missed: open and start over
                phase, hold = "above", 0
        if phase == "carry":
            target, grip = goal, GRIPPER_CLOSED
            if not grasped:
                phase, hold = "above", 0
        _, _, _, _, info = _step(env, arm_action(target, tcp), grip, rng, noise)
        if bool(info["success"].reshape(-1)[0]):
            return True
    return False


def solve_push_cube(env: Any, seed: int, rng: np.random.Generator | None = None, noise: float = 0.0,
                    max_steps: int = 50) -> bool:
    """PushCube-v1: gripper closed, behind the cube (on the far side from the goal), push it to the goal."""
    rng = rng or np.random.default_rng(seed)
    env.reset(seed=seed)
    u = env.unwrapped
    half = float(u.cube_half_size) if np.isscalar(getattr(u, "cube_half_size", None)) else 0.02
    phase = "behind"
    for _ in range(max_steps):
        cube, tcp, goal = _p(u.obj), _p(u.agent.tcp), _p(u.goal_region)
        push = goal[:2] - cube[:2]
        push /= max(float(np.linalg.norm(push)), 1e-6)
        start = np.concatenate([cube[:2] - push * (half + 0.03), [0.02]])
        if phase == "behind":
            # over the start point first (clear of the cube), then down to it
            high = start + [0.0, 0.0, 0.05]
            target = high if np.linalg.norm((high - tcp)[:2]) > 0.01 and tcp[2] > 0.04 else start
            if np.linalg.norm(start - tcp) < 0.008:
                phase = "push"
        if phase == "push":
            target = np.concatenate([goal[:2] - push * (half + 0.005), [0.02]])
        _, _, _, _, info = _step(env, arm_action(target, tcp, max_step=0.03), GRIPPER_CLOSED, rng, noise)
        if bool(info["success"].reshape(-1)[0]):
            return True
    return False


SOLVERS: dict[str, Callable[..., bool]] = {"PickCube-v1": solve_pick_cube, "PushCube-v1": solve_push_cube}
"""task -> scripted end-effector expert (``control_mode`` :data:`CONTROL_MODE`)."""
