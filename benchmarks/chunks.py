"""Action chunks in rgb envs: blind chunk steps (cameras rendered only on the step a chunk ends on)
vs rendering every control step, on the same task, workers, chunks and actions; for LIBERO also one raw
``OffScreenRenderEnv`` stepped in this process (rendering every step, no worker IPC; 1 worker only).
Rounds alternate and the median of each is reported (this machine is shared and noisy).

    robo-rl bench chunks --task PushCube-v1 --workers 4 --chunk 1 4 8 --image-size 128
    robo-rl bench chunks --sim libero --task libero_spatial/0 --workers 1 2 --chunk 1 8

Prints control steps/s and the ratio blind / every-step; with chunk 1 there is nothing to skip (ratio ~1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np

from benchmarks.output import check_min, check_output, write_json


def _envs(sim: str, task: str, workers: int, image_size: int) -> dict[str, Any]:
    """{"blind": VecEnv, "every-step": VecEnv} (+ "raw" for LIBERO with one worker)."""
    if sim == "libero":
        from sims.libero.env import LiberoConfig, LiberoSingleEnv, LiberoVecEnv

        os.environ.setdefault("MUJOCO_GL", "osmesa")
        os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")
        suite, _, idx = task.partition("/")
        envs: dict[str, Any] = {name: LiberoVecEnv(LiberoConfig(suite=suite, task_ids=(int(idx or 0),), num_envs=workers,
                                                                image_size=image_size, blind_chunk_steps=blind))
                                for name, blind in (("blind", True), ("every-step", False))}
        if workers == 1:
            envs["raw"] = LiberoSingleEnv(LiberoConfig(suite=suite, image_size=image_size), int(idx or 0))
        return envs
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    return {name: ManiSkillVecEnv(ManiSkillConfig(task=task, num_envs=workers, obs_mode="rgb", image_size=image_size,
                                                  backend="cpu", blind_chunk_steps=blind))
            for name, blind in (("blind", True), ("every-step", False))}


def _raw_steps(env: Any, chunks: np.ndarray) -> int:
    """Step a raw LIBERO env through (calls, 1, H, A) chunks (resetting at an episode's end)."""
    steps = 0
    for chunk in chunks[:, 0]:
        for a in chunk:
            _, _, terminated, truncated, _ = env.step(a)
            steps += 1
            if terminated or truncated:
                env.reset()
                break
    return steps


def measure(task: str, workers: int, chunk: int, calls: int, rounds: int, image_size: int,
            sim: str = "maniskill") -> dict[str, float]:
    """Median control steps/s (all envs) of ``calls`` chunked steps, blind and rendering every step."""
    envs = _envs(sim, task, workers, image_size)
    try:
        spec = envs["blind"].action_spec
        rng = np.random.default_rng(0)
        acts = rng.uniform(*spec.bounds(), (calls, workers, chunk, *spec.shape)).astype(np.float32)
        out: dict[str, list[float]] = {name: [] for name in envs}
        for env in envs.values():
            env.reset(seed=0)
        for _ in range(rounds):
            for name, env in envs.items():
                t = time.perf_counter()
                if name == "raw":
                    steps = _raw_steps(env, acts)
                else:
                    steps = sum(int(env.step(a).info["chunk_steps"].sum()) for a in acts)
                out[name].append(steps / (time.perf_counter() - t))
        return {name: statistics.median(v) for name, v in out.items()}
    finally:
        for env in envs.values():
            env.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="robo-rl bench chunks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sim", choices=["maniskill", "libero"], default="maniskill")
    p.add_argument("--task", default=None, help="ManiSkill env id (PushCube-v1), or LIBERO suite/task_index "
                   "(libero_spatial/0)")
    p.add_argument("--workers", type=int, nargs="+", default=[4], help="env worker processes (one env each)")
    p.add_argument("--chunk", type=int, nargs="+", default=[1, 4, 8], help="actions per chunk")
    p.add_argument("--calls", type=int, default=10, help="chunked steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    check_min(p, args, 1, "workers", "chunk", "calls", "rounds", "image_size")
    check_output(p, args, "json")
    task = args.task or ("PushCube-v1" if args.sim == "maniskill" else "libero_spatial/0")
    print(f"{args.sim} {task}, rgb {args.image_size} px, {args.calls} calls x {args.rounds} rounds")
    print(f"{'workers':>7} {'chunk':>5} {'blind steps/s':>14} {'every-step steps/s':>19} {'raw env steps/s':>16} "
          f"{'blind/every':>12}")
    rows = []
    for w in args.workers:
        for h in args.chunk:
            r = measure(task, w, h, args.calls, args.rounds, args.image_size, args.sim)
            rows.append({"sim": args.sim, "task": task, "workers": w, "chunk": h, **r,
                         "ratio": r["blind"] / r["every-step"]})
            raw = f"{r['raw']:>16.1f}" if "raw" in r else f"{'-':>16}"
            print(f"{w:>7} {h:>5} {r['blind']:>14.1f} {r['every-step']:>19.1f} {raw} {rows[-1]['ratio']:>12.2f}")
    if args.json:
        write_json(args.json, rows)
    return 0
