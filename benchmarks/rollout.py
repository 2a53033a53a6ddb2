"""Rollout collection with the trainer's ``Collector``: serial (policy for all envs, then step all
envs) vs pipelined (``run.pipeline``: the env workers in two groups, one group steps while the policy
acts for the other), on the same envs and policy,
with the limit B / max(t_env, t_policy) measured in the same run (t_env: the faster of stepping all
workers at once and the two groups in turn), and the two-group bound
B / (sum over the two groups of max(t_env of the group, t_policy on half the batch)), which is what double buffering can
reach when the policy's cost does not halve with the batch (CPU GEMMs at small batch). Rounds alternate between the
modes; medians are reported.

    robo-rl bench rollout                               # PushCube state, 4 envs in 4 workers, a wide MLP
    robo-rl bench rollout --hidden 1024 1024 --num-envs 8
    robo-rl bench rollout --num-envs 32 --envs-per-worker 16 --hidden 1024 1024 1024   # 2 workers
    robo-rl bench rollout --env-cpus 0 --policy-cpus 1 ...   # env workers and policy on cores of their own
    robo-rl bench rollout --backend gpu --scene-workers 2 --num-envs 512   # two physx_cuda scene workers

The policy's width sets t_policy; pipelining can only pay off when t_env and t_policy are comparable
and there are cores for both. Unpinned, the env workers and the policy share every core (on a 2-core
machine both halves of a step compete for the same two); ``--env-cpus`` / ``--policy-cpus`` pin them
apart (``env.worker_cpus`` / ``run.policy_cpus`` in a training config), the CPU analogue of CPU envs
and a GPU policy.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.output import check_min


def collect_rate(col: Any, obs: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(env steps per second, last obs) of one ``Collector.collect()`` (the trainer's own collection:
    policy, env steps, buffer, GAE) starting from ``obs``."""
    col.tobs = obs
    t0 = time.perf_counter()
    _, steps = col.collect()
    return steps / (time.perf_counter() - t0), col.tobs


def per_call(fn: Callable[[], Any], calls: int = 20) -> float:
    """Mean seconds per call of ``fn`` over ``calls`` calls."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="robo-rl bench rollout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="PushCube-v1")
    ap.add_argument("--num-envs", type=int, default=4)
    ap.add_argument("--envs-per-worker", type=int, default=1, help="envs each env worker process steps in turn")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "gpu"], help="ManiSkill physics backend")
    ap.add_argument("--scene-workers", type=int, default=0,
                    help="batched-scene env workers (gpu: physx_cuda scenes of num_envs/N envs; cpu: one env each)")
    ap.add_argument("--hidden", type=int, nargs="+", default=[2048, 2048, 2048], help="policy MLP widths (sets t_policy)")
    ap.add_argument("--steps", type=int, default=100, help="collection steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the policy")
    ap.add_argument("--env-cpus", type=int, nargs="+", default=None, help="CPU ids the env workers are pinned to")
    ap.add_argument("--policy-cpus", type=int, nargs="+", default=None, help="CPU ids this process (policy) is pinned to")
    args = ap.parse_args(argv)
    check_min(ap, args, 1, "num_envs", "envs_per_worker", "hidden", "steps", "rounds", "threads")
    check_min(ap, args, 0, "scene_workers", "env_cpus", "policy_cpus")
    if args.num_envs < 2:
        ap.error(f"--num-envs {args.num_envs} must be >= 2 (the pipeline needs >= 2 env workers)")
    return args


def _measure(env: Any, policy: Any, args: argparse.Namespace) -> dict[str, list[float]]:
    """Per round: per-call times of the env (all workers, each group) and the policy (whole, half batch), and
    the serial and pipelined collection rates."""
    from robo_rl.boundary import obs_to_torch
    from robo_rl.rollout.collector import Collector

    cols = [Collector(env, policy, args.steps, pipeline=p) for p in (False, True)]
    obs, _ = env.reset(seed=0)
    zeros = np.zeros((env.num_envs, *env.action_spec.shape), np.float32)
    n = env.num_workers
    group = list(range(n // 2))  # the pipeline's first group of workers, and its rows
    other = list(range(n // 2, n))
    rows = torch.as_tensor([r for w in group for r in env.worker_rows[w]])

    def step_group(workers: list[int]) -> None:
        env.step_async(zeros, workers)
        env.step_wait()

    t_env, t_pol, t_env_g, t_env_o, t_pol_h, r_serial, r_pipe = [], [], [], [], [], [], []
    for _ in range(args.rounds):
        t_env.append(per_call(lambda: env.step(zeros)))
        obs = env.step(zeros).obs
        t_env_g.append(per_call(lambda: step_group(group)))
        t_env_o.append(per_call(lambda: step_group(other)))
        tobs = obs_to_torch(obs)
        half = {k: v[rows] for k, v in tobs.items() if isinstance(v, torch.Tensor)}
        with torch.no_grad():
            t_pol.append(per_call(lambda o=tobs: policy.act(o)))
            t_pol_h.append(per_call(lambda o=half: policy.act(o)))
        rate, tobs = collect_rate(cols[0], obs_to_torch(obs))
        r_serial.append(rate)
        rate, tobs = collect_rate(cols[1], tobs)
        r_pipe.append(rate)
        obs = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in tobs.items()}
    return {"env": t_env, "policy": t_pol, "env_group": t_env_g, "env_other": t_env_o, "policy_half": t_pol_h,
            "serial": r_serial, "pipelined": r_pipe}


def _report(env: Any, args: argparse.Namespace, t: dict[str, list[float]]) -> None:
    """The timings, the limit and the two-group bound, and the two collection rates against them."""
    t_env, t_pol, t_env_g, t_env_o, t_pol_h = t["env"], t["policy"], t["env_group"], t["env_other"], t["policy_half"]
    r_serial, r_pipe = t["serial"], t["pipelined"]
    t_all, tp = statistics.median(t_env), statistics.median(t_pol)
    tg, to, th = statistics.median(t_env_g), statistics.median(t_env_o), statistics.median(t_pol_h)
    t_turns = tg + to
    # t_env: the fastest the env side steps every env once, all workers at once or the two groups in
    # turn (on fewer cores than workers, workers time-sharing a core can be slower than taking turns)
    te = min(t_all, t_turns)
    limit = env.num_envs / max(te, tp)
    # two groups in turn: a full step of all envs takes at least max(group 0's env step, the policy on
    # half the batch) + the same for group 1; it equals the limit only if both halve with the batch
    bound = env.num_envs / (max(tg, th) + max(to, th))
    s, p = statistics.median(r_serial), statistics.median(r_pipe)
    print(f"{args.task}, {env.num_envs} envs in {env.num_workers} "
          f"{'batched-scene' if env._impl.batched else 'single-env'} workers ({args.backend} physics), policy MLP {args.hidden}, "
          f"torch threads {torch.get_num_threads()}; env workers on CPUs "
          f"{args.env_cpus or 'any'}, policy on CPUs {args.policy_cpus or 'any'}")
    print(f"t_env {te * 1e3:.2f} ms (all workers at once {t_all * 1e3:.2f}, the two groups in turn "
          f"{t_turns * 1e3:.2f}), t_policy {tp * 1e3:.2f} ms per step of all envs (t_env / t_policy "
          f"{te / tp:.2f}); one group's env step "
          f"{tg * 1e3:.2f} ms, policy on half the batch {th * 1e3:.2f} ms ({th / tp:.2f} of the whole)")
    print(f"{'':>16} {'env steps/s':>12} {'/ limit':>8}")
    print(f"{'limit':>16} {limit:12.1f} {1.0:8.2f}")
    print(f"{'two-group bound':>16} {bound:12.1f} {bound / limit:8.2f}")
    print(f"{'serial':>16} {s:12.1f} {s / limit:8.2f}")
    print(f"{'pipelined':>16} {p:12.1f} {p / limit:8.2f}")
    print(f"pipelined / serial = {p / s:.2f}; pipelined / two-group bound = {p / bound:.2f}")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    from policies.mlp import MLPActorCritic, MLPConfig
    from robo_rl.affinity import pin_process
    from robo_rl.errors import RoboRLError
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    if args.policy_cpus is not None:
        pin_process(args.policy_cpus, "--policy-cpus")
    torch.set_num_threads(args.threads)
    scenes = None if not args.scene_workers else (args.scene_workers if args.backend == "gpu" else args.num_envs)
    env = ManiSkillVecEnv(ManiSkillConfig(task=args.task, num_envs=args.num_envs, obs_mode="state", backend=args.backend,
                                          envs_per_worker=args.envs_per_worker, scene_workers=scenes,
                                          worker_cpus=None if args.env_cpus is None else tuple(args.env_cpus)))
    try:
        if env.num_workers < 2:
            raise RoboRLError("bench rollout needs >= 2 env workers (--num-envs >= 2)")
        policy = MLPActorCritic(MLPConfig(hidden=tuple(args.hidden)), env.obs_spec, env.action_spec).eval()
        _report(env, args, _measure(env, policy, args))
    finally:
        env.close()
    return 0
