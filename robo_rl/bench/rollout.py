"""Rollout collection: serial (policy for all envs, then step all envs) vs pipelined (the env workers
in two groups: one group steps while the policy acts for the other), on the same envs and policy,
with the limit B / max(t_env, t_policy) measured in the same run. Rounds alternate between the
modes; medians are reported.

    robo-rl bench rollout                               # PushCube state, 4 envs in 4 workers, a wide MLP
    robo-rl bench rollout --hidden 1024 1024 --num-envs 8

The policy's width sets t_policy; pipelining can only pay off when t_env and t_policy are comparable
and there are cores for both (on a 2-core machine the env workers and the policy share them).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch


def serial(env: Any, policy: Any, obs: dict[str, Any], steps: int) -> tuple[float, dict[str, Any]]:
    """(env steps per second, last obs) of the plain loop."""
    from robo_rl.rollout.buffer import obs_to_torch
    from robo_rl.runners.build import to_env_actions

    t0 = time.perf_counter()
    for _ in range(steps):
        with torch.no_grad():
            a = to_env_actions(policy.act(obs_to_torch(obs)).actions, env.action_spec)
        obs = env.step(a).obs
    return steps * env.num_envs / (time.perf_counter() - t0), obs


def pipelined(env: Any, policy: Any, obs: dict[str, Any], steps: int) -> tuple[float, dict[str, Any]]:
    """(env steps per second, last obs) with two worker groups stepping in turn while the policy acts
    for the other group."""
    from robo_rl.rollout.buffer import obs_to_torch
    from robo_rl.runners.build import to_env_actions

    groups = [list(range(0, env.num_workers // 2)), list(range(env.num_workers // 2, env.num_workers))]
    rows = [np.array([r for w in g for r in env.worker_rows[w]]) for g in groups]
    full = np.zeros((env.num_envs, *env.action_spec.shape), np.float32)

    def act(g: int, group_obs: dict[str, Any]) -> None:
        """Actions of group g's envs (``group_obs`` holds only their rows) into the full action array."""
        with torch.no_grad():
            full[rows[g]] = to_env_actions(policy.act(obs_to_torch(group_obs)).actions, env.action_spec)

    def subset(o: dict[str, Any], g: int) -> dict[str, Any]:
        return {k: v[rows[g]] if isinstance(v, np.ndarray) else [v[i] for i in rows[g]] for k, v in o.items()}

    act(0, subset(obs, 0))
    env.step_async(full, groups[0])
    act(1, subset(obs, 1))
    t0 = time.perf_counter()
    for i in range(2 * steps):
        g = i % 2
        res = env.step_wait()  # group g has stepped
        env.step_async(full, groups[1 - g])  # the other group steps ...
        act(g, res.obs)  # ... while the policy acts for group g
    env.step_wait()
    return steps * env.num_envs / (time.perf_counter() - t0), obs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="robo-rl bench rollout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="PushCube-v1")
    ap.add_argument("--num-envs", type=int, default=4)
    ap.add_argument("--hidden", type=int, nargs="+", default=[2048, 2048, 2048], help="policy MLP widths (sets t_policy)")
    ap.add_argument("--steps", type=int, default=100, help="collection steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the policy")
    args = ap.parse_args(argv)
    from policies.mlp import MLPActorCritic, MLPConfig
    from robo_rl.errors import RoboRLError
    from robo_rl.rollout.buffer import obs_to_torch
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    torch.set_num_threads(args.threads)
    env = ManiSkillVecEnv(ManiSkillConfig(task=args.task, num_envs=args.num_envs, obs_mode="state", backend="cpu"))
    try:
        if env.num_workers < 2:
            raise RoboRLError("bench rollout needs >= 2 env workers (--num-envs >= 2)")
        policy = MLPActorCritic(MLPConfig(hidden=tuple(args.hidden)), env.obs_spec, env.action_spec).eval()
        obs, _ = env.reset(seed=0)
        zeros = np.zeros((env.num_envs, *env.action_spec.shape), np.float32)
        t_env, t_pol, r_serial, r_pipe = [], [], [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(20):
                obs = env.step(zeros).obs
            t_env.append((time.perf_counter() - t0) / 20)
            t0 = time.perf_counter()
            with torch.no_grad():
                for _ in range(20):
                    policy.act(obs_to_torch(obs))
            t_pol.append((time.perf_counter() - t0) / 20)
            rate, obs = serial(env, policy, obs, args.steps)
            r_serial.append(rate)
            rate, obs = pipelined(env, policy, obs, args.steps)
            r_pipe.append(rate)
        te, tp = statistics.median(t_env), statistics.median(t_pol)
        limit = env.num_envs / max(te, tp)
        s, p = statistics.median(r_serial), statistics.median(r_pipe)
        print(f"{args.task}, {env.num_envs} envs in {env.num_workers} workers, policy MLP {args.hidden}, "
              f"torch threads {torch.get_num_threads()}")
        print(f"t_env {te * 1e3:.2f} ms, t_policy {tp * 1e3:.2f} ms per step of all envs")
        print(f"{'':>10} {'env steps/s':>12} {'/ limit':>8}")
        print(f"{'limit':>10} {limit:12.1f} {1.0:8.2f}")
        print(f"{'serial':>10} {s:12.1f} {s / limit:8.2f}")
        print(f"{'pipelined':>10} {p:12.1f} {p / limit:8.2f}")
        print(f"pipelined / serial = {p / s:.2f}")
    finally:
        env.close()
    return 0
