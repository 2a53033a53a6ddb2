"""Action chunks in rgb envs: blind chunk steps (cameras rendered only on the step a chunk ends on)
vs rendering every control step, on the same ManiSkill task, workers, chunks and actions. Rounds
alternate between the two and the median of each is reported (this machine is shared and noisy).

    robo-rl bench chunks --task PushCube-v1 --workers 4 --chunk 1 4 8 --image-size 128

Prints control steps/s of both and their ratio; with chunk 1 there is nothing to skip (ratio ~1).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from robo_rl.bench.output import check_min, check_output, write_json


def measure(task: str, workers: int, chunk: int, calls: int, rounds: int, image_size: int) -> dict[str, float]:
    """Median control steps/s (all envs) of ``calls`` chunked steps, blind and rendering every step."""
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    envs = {name: ManiSkillVecEnv(ManiSkillConfig(task=task, num_envs=workers, obs_mode="rgb", image_size=image_size,
                                                  backend="cpu", blind_chunk_steps=blind))
            for name, blind in (("blind", True), ("every-step", False))}
    try:
        spec = envs["blind"].action_spec
        rng = np.random.default_rng(0)
        acts = rng.uniform(*spec.bounds(), (calls, workers, chunk, *spec.shape)).astype(np.float32)
        out: dict[str, list[float]] = {name: [] for name in envs}
        for env in envs.values():
            env.reset(seed=0)
        for _ in range(rounds):
            for name, env in envs.items():
                steps, t = 0, time.perf_counter()
                for a in acts:
                    steps += int(env.step(a).info["chunk_steps"].sum())
                out[name].append(steps / (time.perf_counter() - t))
        return {name: statistics.median(v) for name, v in out.items()}
    finally:
        for env in envs.values():
            env.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="robo-rl bench chunks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="PushCube-v1", help="ManiSkill env id")
    p.add_argument("--workers", type=int, default=4, help="env worker processes (one env each)")
    p.add_argument("--chunk", type=int, nargs="+", default=[1, 4, 8], help="actions per chunk")
    p.add_argument("--calls", type=int, default=10, help="chunked steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    check_min(p, args, 1, "workers", "chunk", "calls", "rounds", "image_size")
    check_output(p, args, "json")
    print(f"ManiSkill {args.task}, rgb {args.image_size} px, {args.workers} workers, {args.calls} calls x {args.rounds} rounds")
    print(f"{'chunk':>5} {'blind steps/s':>14} {'every-step steps/s':>19} {'blind/every':>12}")
    rows = []
    for h in args.chunk:
        r = measure(args.task, args.workers, h, args.calls, args.rounds, args.image_size)
        rows.append({"chunk": h, **r, "ratio": r["blind"] / r["every-step"]})
        print(f"{h:>5} {r['blind']:>14.1f} {r['every-step']:>19.1f} {rows[-1]['ratio']:>12.2f}")
    if args.json:
        write_json(args.json, rows)
    return 0
