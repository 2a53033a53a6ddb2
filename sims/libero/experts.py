"""A scripted pick-and-place expert for LIBERO tasks whose goal is ``In``/``On`` (object, target),
e.g. every libero_object task ("pick up the X and place it in the basket").

It reads privileged object positions from the sim and drives LIBERO's OSC_POSE controller with
proportional end-effector deltas through phases: above the object, down, close, lift, above the
target, lower, open, then waits for LIBERO's success predicate. Orientation is held (zero rotation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from robo_rl.data.episodes import Episode
from robo_rl.errors import ConfigError
from sims.libero.env import LiberoConfig, LiberoSingleEnv

LIFT_Z = 0.25  # metres, world frame, clear of the basket rim


def _target_name(name: str) -> str:
    for suffix in ("_contain_region", "_top_region", "_region"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


class PickPlaceExpert:
    """Phase machine producing (7,) actions for a ``LiberoSingleEnv``."""

    def __init__(self, env: LiberoSingleEnv) -> None:
        goal = env.env.env.parsed_problem["goal_state"]
        if len(goal) != 1 or goal[0][0].lower() not in ("in", "on"):
            raise ConfigError(f"the scripted LIBERO expert handles one In/On goal, task has {goal}")
        self.env = env
        self.obj, self.target = goal[0][1], _target_name(goal[0][2])
        self.phase, self.hold = 0, 0

    def _pos(self, name: str) -> np.ndarray:
        inner = self.env.env.env
        sim = inner.sim
        return sim.data.body_xpos[sim.model.body_name2id(inner.objects_dict[name].root_body)].copy()

    @staticmethod
    def _move(eef: np.ndarray, goal: np.ndarray, grip: float) -> tuple[np.ndarray, bool]:
        err = goal - eef
        a = np.zeros(7, np.float32)
        a[:3] = np.clip(err / 0.05 * 2.0, -1.0, 1.0)
        a[6] = grip
        return a, bool(np.linalg.norm(err) < 0.012)

    def act(self, state: np.ndarray) -> np.ndarray:
        eef = state[:3]
        obj, tgt = self._pos(self.obj), self._pos(self.target)
        phases = [
            (np.r_[obj[:2], obj[2] + 0.10], -1.0),   # 0 above object
            (np.r_[obj[:2], obj[2] + 0.005], -1.0),  # 1 down to grasp height
            (None, 1.0),                             # 2 close gripper
            (np.r_[eef[:2], LIFT_Z], 1.0),           # 3 lift
            (np.r_[tgt[:2], LIFT_Z], 1.0),           # 4 above target
            (np.r_[tgt[:2], tgt[2] + 0.12], 1.0),    # 5 lower
            (None, -1.0),                            # 6 open
            (np.r_[tgt[:2], LIFT_Z], -1.0),          # 7 retreat and wait
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
        if reached and self.phase < len(phases) - 1:
            self.phase += 1
        return a


def generate(suite: str, task_index: int, episodes: int, seed: int = 0, image_size: int = 128,
             only_success: bool = False, max_attempts: int | None = None,
             on_episode: Callable[[Episode, bool], None] | None = None) -> Iterator[Episode]:
    """Yield scripted-expert episodes, init states seed, seed+1, ... (official LIBERO init states).

    With ``only_success`` failed attempts are dropped (up to ``max_attempts`` seeds in all, default
    3 x ``episodes``); ``on_episode(ep, kept)`` is called after every attempt (progress reporting).
    """
    limit = max_attempts or (episodes * 3 if only_success else episodes)
    env = LiberoSingleEnv(LiberoConfig(suite=suite, image_size=image_size), task_index)
    kept = 0
    try:
        for k in range(limit):
            if kept >= episodes:
                return
            obs = env.reset(seed=seed + k)
            expert = PickPlaceExpert(env)
            seq, actions, rewards, success = [obs], [], [], []
            done = False
            while not done:
                a = expert.act(obs["state"])
                obs, r, term, trunc, info = env.step(a)
                seq.append(obs)
                actions.append(a)
                rewards.append(r)
                success.append(info["success"])
                done = term or trunc
            ep = Episode({k2: np.stack([o[k2] for o in seq]) for k2 in ("rgb", "state")}, np.stack(actions),
                         np.asarray(rewards, np.float32), np.asarray(success, bool), env.task.instruction, seed + k)
            keep = ep.succeeded or not only_success
            if on_episode is not None:
                on_episode(ep, keep)
            if keep:
                kept += 1
                yield ep
    finally:
        env.close()
