"""Experts for ManiSkill3 tasks, recorded as robo-rl episodes.

Two kinds (:data:`KINDS`): ``planner``, ManiSkill's own mplib motion-planning solutions, which drive the env
in ``pd_joint_pos`` control (actions are absolute joint targets); and ``scripted``, closed-loop
end-effector experts (:mod:`sims.maniskill.scripted`) in ``pd_ee_delta_pos``. A recording wrapper captures
every observation, action, reward and success flag as they happen, so the dataset holds exactly what the
expert did (``meta.control_mode`` says in which mode).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np

from robo_rl.data.episodes import Episode
from robo_rl.errors import ConfigError
from sims.maniskill.env import _split_obs, _to_numpy
from sims.maniskill.tasks import INSTRUCTIONS

KINDS = {"planner": "pd_joint_pos", "scripted": "pd_ee_delta_pos"}
"""expert kind -> the control mode its actions are in."""


def solutions() -> dict[str, Callable[..., Any]]:
    from mani_skill.examples.motionplanning.panda import solutions as s

    return {"PickCube-v1": s.solvePickCube, "PushCube-v1": s.solvePushCube, "PullCube-v1": s.solvePullCube,
            "StackCube-v1": s.solveStackCube, "LiftPegUpright-v1": s.solveLiftPegUpright,
            "PegInsertionSide-v1": s.solvePegInsertionSide, "PlaceSphere-v1": s.solvePlaceSphere}


class Recorder(gym.Wrapper):
    """Records obs/actions/rewards/success of the current episode of a 1-env CPU ManiSkill env."""

    def __init__(self, env: Any, obs_mode: str) -> None:
        super().__init__(env)
        self.obs_mode = obs_mode
        self.clear()

    def clear(self) -> None:
        self.obs: list[dict[str, np.ndarray]] = []
        self.actions: list[np.ndarray] = []
        self.rewards: list[float] = []
        self.success: list[bool] = []
        self.label: np.ndarray | None = None  # set by an expert that executes a perturbed action (DART)

    def _keep(self, raw: Any) -> None:
        self.obs.append({k: v[0] for k, v in _split_obs(raw, self.obs_mode).items()})

    def reset(self, **kw: Any) -> Any:
        # A fresh scene per episode: PhysX keeps contact state across plain resets, so without this an
        # episode would depend on the ones before it (seed 41 after 40 != seed 41 alone), and parallel
        # workers, which see other seed orders, would record other episodes than one process.
        options = {**(kw.pop("options", None) or {}), "reconfigure": True}
        out = self.env.reset(options=options, **kw)
        self.clear()
        self._keep(out[0])
        return out

    def step(self, action: Any) -> Any:
        out = self.env.step(action)
        raw, rew, _, _, info = out
        self._keep(raw)
        kept = action if self.label is None else self.label
        self.label = None
        self.actions.append(np.asarray(_to_numpy(kept), np.float32).reshape(-1))
        self.rewards.append(float(_to_numpy(rew).reshape(-1)[0]))
        self.success.append(bool(_to_numpy(info.get("success", False)).reshape(-1)[0]))
        return out


def tasks(kind: str) -> list[str]:
    """Tasks with an expert of ``kind``."""
    from sims.maniskill.scripted import SOLVERS

    return sorted(solutions() if kind == "planner" else SOLVERS)


class _Expert:
    """One recording env and its task's expert; ``attempt(seed)`` runs the expert once."""

    def __init__(self, task: str, obs_mode: str, image_size: int, kind: str = "planner", noise: float = 0.0,
                 max_steps: int = 50, robot: str | None = None) -> None:
        from sims.maniskill.env import ManiSkillConfig, _make_gym_env

        cfg = ManiSkillConfig(task=task, num_envs=1, obs_mode=obs_mode, control_mode=KINDS[kind],
                              reward_mode="normalized_dense", backend="cpu", image_size=image_size,
                              extra={"robot_uids": robot} if robot else {})
        self.task, self.kind, self.noise, self.max_steps = task, kind, noise, max_steps
        self.env = Recorder(_make_gym_env(cfg, "physx_cpu", 1, render=False), obs_mode)
        if kind == "planner":
            self.solve = solutions()[task]
        else:
            from sims.maniskill.scripted import SOLVERS

            self.solve = SOLVERS[task]

    def attempt(self, seed: int) -> Episode | None:
        """The expert's episode from ``seed`` (None if the planner produced no action at all)."""
        if self.kind == "scripted":
            self.solve(self.env, seed, rng=np.random.default_rng(seed), noise=self.noise, max_steps=self.max_steps)
        else:
            try:
                self.solve(self.env, seed=seed, debug=False, vis=False)
            except Exception:  # the planner raises when it finds no plan: a failed attempt
                pass
        env = self.env
        if not env.actions:
            return None
        return Episode({k: np.stack([o[k] for o in env.obs]) for k in env.obs[0]}, np.stack(env.actions),
                       np.asarray(env.rewards, np.float32), np.asarray(env.success, bool),
                       INSTRUCTIONS.get(self.task, self.task), seed)

    def close(self) -> None:
        self.env.close()


_WORKER_EXPERT: _Expert | None = None


def _init_worker(task: str, obs_mode: str, image_size: int, kind: str, noise: float, max_steps: int,
                 robot: str | None) -> None:
    import os

    import torch

    global _WORKER_EXPERT
    torch.set_num_threads(1)
    os.environ.setdefault("LP_NUM_THREADS", "1")
    _WORKER_EXPERT = _Expert(task, obs_mode, image_size, kind, noise, max_steps, robot)


def _attempt_in_worker(seed: int) -> Episode | None:
    assert _WORKER_EXPERT is not None
    return _WORKER_EXPERT.attempt(seed)


def generate(task: str, episodes: int, seed: int = 0, obs_mode: str = "state", image_size: int = 128,
             only_success: bool = False, max_attempts: int | None = None,
             on_episode: Callable[[Episode, bool], None] | None = None, workers: int = 1, kind: str = "planner",
             noise: float = 0.0, max_steps: int = 50, robot: str | None = None) -> Iterator[Episode]:
    """Yield expert episodes for ``task`` with seeds seed, seed+1, ...

    ``kind`` picks the expert (:data:`KINDS`); ``noise`` and ``max_steps`` apply to ``scripted`` experts
    (DART noise on the executed arm action, the recorded label stays clean; the step budget). ``robot``
    replaces the task's robot (ManiSkill ``robot_uids``, e.g. ``panda_wristcam``: a Panda with a wrist camera).
    With ``only_success`` failed attempts are dropped (up to ``max_attempts`` seeds in all).
    ``on_episode(ep, kept)`` is called after every attempt (progress reporting). ``workers`` > 1 runs
    the attempts in that many spawn processes (one env each) and yields the same episodes, in seed
    order, as one process would: the planner and the renderer are single-threaded, so this scales
    with cores.
    """
    if kind not in KINDS:
        raise ConfigError(f"unknown expert kind {kind!r}; choose one of {', '.join(KINDS)}")
    if task not in tasks(kind):
        raise ConfigError(f"no {kind} expert for {task!r}; available: {', '.join(tasks(kind))}")
    if noise < 0 or (noise > 0 and kind != "scripted"):
        raise ConfigError(f"--noise {noise} must be >= 0, and only the scripted experts take it")
    if workers < 1:
        raise ConfigError(f"--workers {workers} must be >= 1")
    limit = max_attempts or (episodes * 3 if only_success else episodes)
    seeds = range(seed, seed + limit)
    kept = 0

    def take(ep: Episode | None) -> bool:
        """Handle one attempt; True once enough episodes are kept."""
        nonlocal kept
        if ep is None:
            return False
        keep = ep.succeeded or not only_success
        if on_episode is not None:
            on_episode(ep, keep)
        kept += int(keep)
        return keep

    if workers == 1:
        expert = _Expert(task, obs_mode, image_size, kind, noise, max_steps, robot)
        try:
            for s in seeds:
                ep = expert.attempt(s)
                if take(ep):
                    yield ep  # type: ignore[misc]
                if kept >= episodes:
                    return
        finally:
            expert.close()
        return
    import multiprocessing as mp

    pool = mp.get_context("spawn").Pool(workers, initializer=_init_worker, initargs=(task, obs_mode, image_size, kind, noise, max_steps, robot))
    try:
        for ep in pool.imap(_attempt_in_worker, seeds, chunksize=1):  # in seed order
            if take(ep):
                yield ep  # type: ignore[misc]
            if kept >= episodes:
                return
    finally:
        pool.terminate()
        pool.join()
