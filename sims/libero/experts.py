"""A scripted pick-and-place expert for LIBERO tasks whose goal is ``In``/``On`` (object, target),
e.g. every libero_object task ("pick up the X and place it in the basket").

It reads privileged object geometry from the sim and drives LIBERO's OSC_POSE controller with
proportional end-effector deltas through phases: above the grasp point, down, close, lift, above the
target, lower, open, then waits for LIBERO's success predicate. Orientation is held (zero rotation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from robo_rl.data.episodes import Episode
from robo_rl.errors import ConfigError
from sims.libero.env import LiberoConfig, LiberoSingleEnv

LIFT = 0.15  # metres above the grasp height to carry an object at
HOLLOW = ("bowl", "basket", "plate")  # grasped at the rim: nothing to pinch at the centre


def _target_name(name: str) -> str:
    for suffix in ("_contain_region", "_top_region", "_region"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


class PickPlaceExpert:
    """Phase machine producing (7,) actions for a ``LiberoSingleEnv``.

    Grasp and release points come from each object's collision geometry (not its body origin): a solid
    object is pinched near its top (tall bottles at their neck, boxes and cans mid-height), a hollow one
    (a bowl) at its rim on the side the gripper's fingers close across (world y); the carried object is
    released with its centre over the target's centre."""

    def __init__(self, env: LiberoSingleEnv) -> None:
        goal = env.env.env.parsed_problem["goal_state"]
        if len(goal) != 1 or goal[0][0].lower() not in ("in", "on"):
            raise ConfigError(f"the scripted LIBERO expert handles one In/On goal, task has {goal}")
        self.env = env
        self.obj, self.target = goal[0][1], _target_name(goal[0][2])
        self.phase, self.hold = 0, 0
        self.offset = np.zeros(3)  # gripper - object centre, fixed at the grasp
        self.clear = 0.0  # height above the object the gripper approaches at
        self.last_eef, self.stalled = np.zeros(3), 0  # steps the end effector has not moved
        self.narrow = None if any(h in self.obj for h in HOLLOW) else self._narrow_axis(self.obj)

    def _extent(self, name: str) -> tuple[np.ndarray, float, float, float]:
        """(centre xy (2,), bottom z, top z, horizontal radius) of an object's collision geoms (world frame)."""
        inner = self.env.env.env
        sim = inner.sim
        m, d = sim.model._model, sim.data._data
        root = sim.model.body_name2id(inner.objects_dict[name].root_body)
        geoms = []
        for g in range(m.ngeom):
            b = int(m.geom_bodyid[g])
            while b not in (0, root):
                b = int(m.body_parentid[b])
            if b == root and m.geom_contype[g] | m.geom_conaffinity[g]:
                geoms.append(g)
        if not geoms:  # a site-only region: its body origin
            p = d.xpos[root]
            return p[:2].copy(), float(p[2]), float(p[2]), 0.0
        pos = d.geom_xpos[geoms]
        half = np.array([abs(d.geom_xmat[g].reshape(3, 3)[2]) @ _half_size(m, g) for g in geoms])
        centre = d.xpos[root][:2].copy()
        radius = float(np.max(np.linalg.norm(pos[:, :2] - centre, axis=1)))
        return centre, float(np.min(pos[:, 2] - half)), float(np.max(pos[:, 2] + half)), radius

    def _narrow_axis(self, name: str) -> np.ndarray | None:
        """(2,) world xy direction of an object's narrow horizontal side, or None when it is round or square
        (the fingers, closing along it, then pinch its short width)."""
        inner = self.env.env.env
        sim = inner.sim
        m, d = sim.model._model, sim.data._data
        root = sim.model.body_name2id(inner.objects_dict[name].root_body)
        best: tuple[float, int] | None = None
        for g in range(m.ngeom):
            if int(m.geom_bodyid[g]) == root and m.geom_contype[g] | m.geom_conaffinity[g]:
                vol = float(np.prod(_half_size(m, g)))
                best = max(best or (vol, g), (vol, g))
        if best is None:
            return None
        g = best[1]
        rot, half = d.geom_xmat[g].reshape(3, 3), _half_size(m, g)
        horizontal = [j for j in range(3) if abs(rot[2, j]) < 0.5]
        if len(horizontal) != 2:
            return None
        a, b = sorted(horizontal, key=lambda j: half[j])
        if half[b] < 1.3 * half[a]:
            return None
        axis = rot[:2, a]
        return axis / (np.linalg.norm(axis) + 1e-9)

    def _yaw_action(self, state: np.ndarray) -> float:
        """Rotation about world z (OSC_POSE delta, in [-1, 1]) that turns the fingers' closing axis onto the
        object's narrow side; 0 for objects without one."""
        if self.narrow is None:
            return 0.0
        from scipy.spatial.transform import Rotation

        fingers = Rotation.from_rotvec(state[3:6]).apply([0.0, 1.0, 0.0])[:2]
        err = np.arctan2(fingers[0] * self.narrow[1] - fingers[1] * self.narrow[0], fingers @ self.narrow)
        err = (err + np.pi / 2) % np.pi - np.pi / 2  # the two fingers are symmetric: turn at most 90 degrees
        return float(np.clip(err / 0.3, -1.0, 1.0))

    def _grasp_point(self) -> np.ndarray:
        centre, bottom, top, radius = self._extent(self.obj)
        if any(h in self.obj for h in HOLLOW):
            return np.r_[centre[0], centre[1] + max(0.0, radius - 0.004), top - 0.015]
        height = top - bottom
        if height > 0.12:  # tall (bottles): at the neck
            z = top - 0.03
        elif height < 0.06:  # flat (boxes lying down): just below the top, the fingertips clear of the floor
            z = top - 0.012
        else:
            z = bottom + 0.55 * height
        return np.r_[centre, z]

    def act(self, state: np.ndarray) -> np.ndarray:
        eef = state[:3]
        if self.phase <= 1:  # track the object until it is held
            grasp = self._grasp_point()
            obj_centre, _, obj_top, _ = self._extent(self.obj)
            self.offset = grasp - np.r_[obj_centre, grasp[2]]
            self.clear = max(obj_top, grasp[2]) + 0.06
        tgt_centre, _, tgt_top, _ = self._extent(self.target)
        carry = max(self.clear, tgt_top + 0.12) + LIFT * 0.5
        drop = np.r_[tgt_centre + self.offset[:2], tgt_top + 0.06]
        phases = [
            (np.r_[self._grasp_point()[:2], self.clear] if self.phase == 0 else None, -1.0),  # 0 above the grasp
            (self._grasp_point() if self.phase == 1 else None, -1.0),                        # 1 down to it
            (None, 1.0),                                                                     # 2 close gripper
            (np.r_[eef[:2], carry], 1.0),                                                    # 3 lift
            (np.r_[drop[:2], carry], 1.0),                                                   # 4 above target
            (drop, 1.0),                                                                     # 5 lower
            (None, -1.0),                                                                    # 6 open
            (np.r_[drop[:2], carry], -1.0),                                                  # 7 retreat and wait
        ]
        goal, grip = phases[min(self.phase, len(phases) - 1)]
        if goal is None:
            self.hold += 1
            a = np.zeros(7, np.float32)
            a[6] = grip
            if self.hold >= 15:
                self.phase, self.hold = self.phase + 1, 0
            return a
        a, reached = self._move(eef, goal, grip)
        if self.phase <= 1:
            a[5] = self._yaw_action(state)
        # blocked on the way down (fingertips on the floor or the table, an object in the way): as far as it goes
        self.stalled = self.stalled + 1 if np.linalg.norm(eef - self.last_eef) < 0.001 else 0
        self.last_eef = eef.copy()
        if (reached or (self.phase in (1, 5) and self.stalled >= 8)) and self.phase < len(phases) - 1:
            self.phase, self.stalled = self.phase + 1, 0
        return a

    @staticmethod
    def _move(eef: np.ndarray, goal: np.ndarray, grip: float) -> tuple[np.ndarray, bool]:
        err = goal - eef
        a = np.zeros(7, np.float32)
        a[:3] = np.clip(err / 0.05 * 2.0, -1.0, 1.0)
        a[6] = grip
        return a, bool(np.linalg.norm(err) < 0.012)


def _half_size(m: object, g: int) -> np.ndarray:
    """(3,) half extents of geom ``g`` in its own frame (boxes: size; spheres/cylinders/capsules: radius
    and half height; meshes: their bounding box)."""
    import mujoco

    size = np.asarray(m.geom_size[g], float)  # type: ignore[attr-defined]
    kind = int(m.geom_type[g])  # type: ignore[attr-defined]
    if kind == mujoco.mjtGeom.mjGEOM_BOX:
        return size.copy()
    if kind == mujoco.mjtGeom.mjGEOM_SPHERE:
        return np.full(3, size[0])
    if kind in (mujoco.mjtGeom.mjGEOM_CYLINDER, mujoco.mjtGeom.mjGEOM_CAPSULE):
        return np.r_[size[0], size[0], size[1] + (size[0] if kind == mujoco.mjtGeom.mjGEOM_CAPSULE else 0.0)]
    return np.asarray(m.geom_aabb[g][3:], float)  # type: ignore[attr-defined]


def generate(suite: str, task_index: int, episodes: int, seed: int = 0, image_size: int = 128,
             only_success: bool = False, max_attempts: int | None = None, fast_render: bool = False,
             init_states: str = "official", frame_every: int = 1, max_steps: int | None = None,
             on_episode: Callable[[Episode, bool], None] | None = None) -> Iterator[Episode]:
    """Yield scripted-expert episodes, init states seed, seed+1, ... (official LIBERO init states).

    With ``only_success`` failed attempts are dropped (up to ``max_attempts`` seeds in all, default
    3 x ``episodes``); ``on_episode(ep, kept)`` is called after every attempt (progress reporting).
    ``init_states`` official: the evaluation init states; sampled: fresh layouts (demonstrations apart from
    the states a policy is evaluated on). ``fast_render`` records the cheaper images of ``LiberoConfig.fast_render`` (train and evaluate the same way).
    ``frame_every`` k > 1 renders the cameras at steps 0, k, 2k, ... only (``Episode.frame_steps``; the other
    steps run blind, state only: the expert needs no images), the frames equal to rendering every step.
    ``max_steps``: each attempt's time limit (None: the suite's evaluation length).
    """
    if frame_every < 1:
        raise ValueError(f"frame_every must be >= 1; got {frame_every}")
    limit = max_attempts or (episodes * 3 if only_success else episodes)
    env = LiberoSingleEnv(LiberoConfig(suite=suite, image_size=image_size, fast_render=fast_render,
                                       init_states=init_states, max_episode_steps=max_steps), task_index)
    kept = 0
    try:
        for k in range(limit):
            if kept >= episodes:
                return
            obs = env.reset(seed=seed + k)
            expert = PickPlaceExpert(env)
            states, frames, frame_steps = [obs["state"]], [obs["rgb"]], [0]
            actions, rewards, success = [], [], []
            done = False
            while not done:
                a = expert.act(states[-1])
                if (len(actions) + 1) % frame_every == 0:
                    obs, r, term, trunc, info = env.step(a)
                    frames.append(obs["rgb"])
                    frame_steps.append(len(actions) + 1)
                    states.append(obs["state"])
                else:
                    r, term, trunc, info = env.step_blind(a)
                    states.append(env.state_now())
                actions.append(a)
                rewards.append(r)
                success.append(info["success"])
                done = term or trunc
            ep = Episode({"rgb": np.stack(frames), "state": np.stack(states)}, np.stack(actions),
                         np.asarray(rewards, np.float32), np.asarray(success, bool), env.task.instruction, seed + k,
                         frame_steps=None if frame_every == 1 else np.asarray(frame_steps, np.int64))
            keep = ep.succeeded or not only_success
            if on_episode is not None:
                on_episode(ep, keep)
            if keep:
                kept += 1
                yield ep
    finally:
        env.close()
