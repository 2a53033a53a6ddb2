"""VecEnv overhead: our ManiSkill VecEnv vs raw ManiSkill stepping, same task and worker count.

Baselines:
* raw-inproc (1 worker only): one CPU ManiSkill env stepped in this process, no IPC at all;
* raw-async: gymnasium's AsyncVectorEnv (spawn) over ManiSkill's own CPUGymWrapper, the stock way
  to run N CPU ManiSkill envs in parallel.
Rounds alternate (raw, ours, raw, ours, ...) and the median of each is reported, because this
machine is shared and noisy.

    robo-rl bench env --task PushCube-v1 --workers 1 2 4 --steps 600 --rounds 3
    robo-rl bench env --sim libero --task libero_spatial/0 --workers 1 2 4 --steps 20 --rounds 2

For LIBERO the baselines are one raw ``OffScreenRenderEnv`` stepped in this process, with default
and with fast (training) rendering; ours runs 1, 2, 4 spawn workers.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from benchmarks.output import check_min


def _raw_env(task: str, obs_mode: str, control_mode: str) -> Any:
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401
    from mani_skill.utils.wrappers.gymnasium import CPUGymWrapper

    kw: dict[str, Any] = dict(obs_mode=obs_mode, control_mode=control_mode, sim_backend="physx_cpu",
                              reward_mode="normalized_dense")
    if obs_mode == "rgb":
        kw["sensor_configs"] = dict(width=128, height=128)
    return CPUGymWrapper(gym.make(task, **kw))


class _RawFactory:
    def __init__(self, *args: Any) -> None:
        self.args = args

    def __call__(self) -> Any:
        import torch

        torch.set_num_threads(1)
        return _raw_env(*self.args)


def _time_steps(step_fn: Any, actions: np.ndarray) -> float:
    t = time.perf_counter()
    for a in actions:
        step_fn(a)
    return time.perf_counter() - t


def measure(task: str, obs_mode: str, control_mode: str, workers: int, steps: int, rounds: int) -> dict[str, Any]:
    import gymnasium as gym

    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    ours = ManiSkillVecEnv(ManiSkillConfig(task=task, num_envs=workers, obs_mode=obs_mode,
                                           control_mode=control_mode, backend="cpu"))
    raw_async = gym.vector.AsyncVectorEnv([_RawFactory(task, obs_mode, control_mode) for _ in range(workers)],
                                          context="spawn", autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    inproc = _raw_env(task, obs_mode, control_mode) if workers == 1 else None
    rng = np.random.default_rng(0)
    low, high = ours.action_spec.bounds()
    actions = rng.uniform(low, high, size=(steps, workers, *ours.action_spec.shape)).astype(np.float32)
    ours.reset(seed=0)
    raw_async.reset(seed=0)
    results: dict[str, list[float]] = {"ours": [], "raw-async": []}

    def inproc_step(a: np.ndarray) -> None:
        _, _, term, trunc, _ = inproc.step(a[0])
        if term or trunc:
            inproc.reset()

    if inproc is not None:
        inproc.reset(seed=0)
        results["raw-inproc"] = []
    for _ in range(rounds):
        if inproc is not None:
            results["raw-inproc"].append(steps * workers / _time_steps(inproc_step, actions))
        results["raw-async"].append(steps * workers / _time_steps(raw_async.step, actions))
        results["ours"].append(steps * workers / _time_steps(ours.step, actions))
    ours.close()
    raw_async.close()
    if inproc is not None:
        inproc.close()
    return {k: statistics.median(v) for k, v in results.items()}


def measure_libero(task: str, workers: int, steps: int, rounds: int, image_size: int,
                   fast_render: bool) -> dict[str, Any]:
    import os

    from sims.libero.env import LiberoConfig, LiberoSingleEnv, LiberoVecEnv

    os.environ.setdefault("MUJOCO_GL", "osmesa")
    os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")
    suite, _, idx = task.partition("/")
    cfg = LiberoConfig(suite=suite, task_ids=(int(idx or 0),), num_envs=workers, image_size=image_size,
                       fast_render=fast_render, max_episode_steps=10**6)
    ours = LiberoVecEnv(cfg)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, size=(steps, workers, 7)).astype(np.float32)
    ours.reset(seed=0)
    results: dict[str, list[float]] = {"ours": []}
    raw: dict[str, Any] = {}
    if workers == 1:
        for fast in (False, True):
            raw[f"raw-inproc{'-fast' if fast else ''}"] = LiberoSingleEnv(
                LiberoConfig(suite=suite, image_size=image_size, fast_render=fast, max_episode_steps=10**6), int(idx or 0))
        for name, env in raw.items():
            env.reset(seed=0)
            results[name] = []
    for _ in range(rounds):
        for name, env in raw.items():
            results[name].append(steps / _time_steps(lambda a, e=env: e.env.step(a[0].tolist()), actions))
        results["ours"].append(steps * workers / _time_steps(ours.step, actions))
    ours.close()
    for env in raw.values():
        env.close()
    return {k: statistics.median(v) for k, v in results.items()}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="robo-rl bench env", description=__doc__.split("\n\n")[0])
    p.add_argument("--sim", default="maniskill", choices=["maniskill", "libero"])
    p.add_argument("--task", default=None, help="ManiSkill env id, or LIBERO suite/task_index")
    p.add_argument("--image-size", type=int, default=128, help="LIBERO camera size")
    p.add_argument("--fast-render", action="store_true", help="LIBERO: our env with training rendering")
    p.add_argument("--obs-mode", default="state", choices=["state", "rgb"])
    p.add_argument("--control-mode", default="pd_joint_delta_pos")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=600, help="vector steps per round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    check_min(p, args, 1, "workers", "steps", "rounds", "image_size")
    if args.sim == "libero":
        task = args.task or "libero_spatial/0"
        print(f"# LIBERO {task} rgb {args.image_size}px (agentview + wrist), fast_render={args.fast_render}; "
              f"env steps/s, median of {args.rounds} alternating rounds")
        print(f"{'workers':>7} {'raw-inproc':>11} {'raw-inproc-fast':>16} {'ours':>8} {'ours/raw-inproc':>16}")
        for w in args.workers:
            r = measure_libero(task, w, args.steps, args.rounds, args.image_size, args.fast_render)
            base = r.get("raw-inproc-fast" if args.fast_render else "raw-inproc")
            print(f"{w:>7} {r.get('raw-inproc', float('nan')):>11.2f} {r.get('raw-inproc-fast', float('nan')):>16.2f} "
                  f"{r['ours']:>8.2f} {(r['ours'] / base) if base else float('nan'):>16.3f}", flush=True)
        return 0
    args.task = args.task or "PushCube-v1"
    print(f"# {args.task} obs={args.obs_mode} control={args.control_mode}; env steps/s, median of {args.rounds} "
          "alternating rounds")
    print(f"{'workers':>7} {'raw-inproc':>11} {'raw-async':>10} {'ours':>8} {'ours/raw-async':>15} {'ours/raw-inproc':>16}")
    for w in args.workers:
        r = measure(args.task, args.obs_mode, args.control_mode, w, args.steps, args.rounds)
        inproc = r.get("raw-inproc")
        print(f"{w:>7} {inproc or float('nan'):>11.1f} {r['raw-async']:>10.1f} {r['ours']:>8.1f} "
              f"{r['ours'] / r['raw-async']:>15.3f} {(r['ours'] / inproc) if inproc else float('nan'):>16.3f}", flush=True)
    return 0
