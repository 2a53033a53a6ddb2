"""Our PPO vs stable-baselines3's PPO on the same ManiSkill3 task, envs, hyper-parameters and budget.

Runs in this process, one after the other, each with the whole machine: the same number of spawn
env workers (ours: sims.vector; SB3: its SubprocVecEnv over ManiSkill's CPUGymWrapper), the same
network (3x256 tanh, log-std -0.5, observation normalization) and PPO hyper-parameters. Two SB3
variants: ``sb3`` as it comes (ManiSkill's success-termination is terminal, value 0) and
``sb3-matched`` (given our ``bootstrap_on_terminated`` rule through an env wrapper). The measure is
identical code for all: success rate of the last 40 finished training episodes; wall-clock starts
once the env workers are up. Printed: wall-clock and env steps to reach 0.5 and 0.9 for each, and
the ratios ours/SB3 (< 1 = ours faster).

    robo-rl bench ppo --minutes 15 [--config configs/quickstart.yaml] [--runs ours,sb3-matched,sb3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym

from benchmarks.output import check_output, check_positive, write_json

THRESHOLDS = (0.5, 0.9)
WINDOW = 40


class ThresholdClock:
    """Records the first wall-clock time and env step at which the windowed success crosses each
    threshold (only once the window holds WINDOW episodes)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.hits: dict[float, tuple[float, int]] = {}

    def observe(self, success_rate: float, episodes: int, env_steps: int, elapsed: float | None = None) -> bool:
        """``elapsed``: seconds of training so far (default: since ``t0``)."""
        elapsed = time.monotonic() - self.t0 if elapsed is None else elapsed
        if episodes >= WINDOW:
            for th in THRESHOLDS:
                if th not in self.hits and success_rate >= th:
                    self.hits[th] = (elapsed, env_steps)
        return len(self.hits) == len(THRESHOLDS)


def run_ours(cfg: Any, minutes: float, out_dir: Path) -> dict[str, Any]:
    import dataclasses

    from robo_rl.runners.train import Trainer, make_run_dir

    run_cfg = dataclasses.replace(cfg.run, max_minutes=minutes, eval_every_steps=0, final_eval_episodes=0,
                                  video=False, progress=False, out_dir=str(out_dir), name="ours",
                                  checkpoint_every_steps=10**12, total_env_steps=10**9)
    cfg = dataclasses.replace(cfg, run=run_cfg)
    clock = ThresholdClock()
    last: dict[str, Any] = {}

    def on_iteration(row: dict[str, Any]) -> bool:
        last.update(row)
        # the trainer's wall_time starts after the env workers are built, like SB3's learn()
        return clock.observe(row.get("train/success_rate", 0.0), int(row.get("train/episodes", 0)), row["env_steps"],
                             elapsed=row["wall_time"])

    Trainer(cfg, make_run_dir(cfg), on_iteration=on_iteration).run()
    return {"hits": clock.hits, "env_steps": last.get("env_steps", 0), "wall_s": last.get("wall_time", 0.0)}


class _SB3EnvFactory:
    def __init__(self, env_cfg: Any, seed: int, success_as_truncation: bool) -> None:
        self.env_cfg, self.seed, self.success_as_truncation = env_cfg, seed, success_as_truncation

    def __call__(self) -> Any:
        import mani_skill.envs  # noqa: F401
        import torch
        from mani_skill.utils.wrappers.gymnasium import CPUGymWrapper

        torch.set_num_threads(1)
        c = self.env_cfg
        kw: dict[str, Any] = dict(obs_mode="state", control_mode=c.control_mode, reward_mode=c.reward_mode,
                                  sim_backend="physx_cpu")
        if c.max_episode_steps is not None:
            kw["max_episode_steps"] = c.max_episode_steps
        env = CPUGymWrapper(gym.make(c.task, **kw))
        if self.success_as_truncation:
            env = TerminatedAsTruncated(env)
        env.reset(seed=self.seed)
        return env


class TerminatedAsTruncated(gym.Wrapper):
    """SB3 bootstraps from the terminal observation only on truncation; reporting ManiSkill's
    success-termination as truncation gives SB3 the same ``bootstrap_on_terminated`` rule as ours."""

    def step(self, action: Any) -> Any:
        obs, rew, term, trunc, info = self.env.step(action)
        return obs, rew, False, bool(term or trunc), info


def run_sb3(cfg: Any, minutes: float, matched: bool) -> dict[str, Any]:
    """SB3 PPO with our hyper-parameters. ``matched`` also gives it our ``bootstrap_on_terminated``
    rule (through ``TerminatedAsTruncated``); without it SB3 treats ManiSkill's success as terminal,
    which is what an SB3 user gets out of the box."""
    import torch
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import SubprocVecEnv, VecNormalize

    e, a, r = cfg.env, cfg.algo, cfg.run
    flag = matched and bool(getattr(a, "bootstrap_on_terminated", False))
    venv = SubprocVecEnv([_SB3EnvFactory(e, r.seed + i, flag) for i in range(e.num_envs)], start_method="spawn")
    venv = VecNormalize(venv, norm_obs=True, norm_reward=r.reward_norm, gamma=a.gamma, clip_obs=10.0)
    clock = ThresholdClock()
    deadline = [0.0]

    class Track(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.succ: deque[float] = deque(maxlen=WINDOW)
            self.episodes = 0

        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"]):
                if done:
                    self.succ.append(float(bool(info.get("success", False))))
                    self.episodes += 1
            rate = sum(self.succ) / len(self.succ) if self.succ else 0.0
            finished = clock.observe(rate, self.episodes, self.num_timesteps)
            return not finished and time.monotonic() < deadline[0]

    n_steps = r.rollout_steps
    model = SB3PPO(
        "MlpPolicy", venv, learning_rate=a.lr, n_steps=n_steps, batch_size=max(1, n_steps * e.num_envs // a.minibatches),
        n_epochs=a.epochs, gamma=a.gamma, gae_lambda=a.gae_lambda, clip_range=a.clip_coef, clip_range_vf=a.clip_value,
        ent_coef=a.ent_coef, vf_coef=a.vf_coef, max_grad_norm=a.max_grad_norm, target_kl=a.target_kl,
        policy_kwargs=dict(net_arch=dict(pi=list(cfg.policy.hidden), vf=list(cfg.policy.hidden)),
                           activation_fn=torch.nn.Tanh, log_std_init=cfg.policy.init_log_std),
        seed=r.seed, device="cpu", verbose=0)
    clock.t0 = time.monotonic()
    deadline[0] = clock.t0 + minutes * 60
    model.learn(total_timesteps=10**9, callback=Track())
    out = {"hits": clock.hits, "env_steps": model.num_timesteps, "wall_s": time.monotonic() - clock.t0}
    venv.close()
    return out


def _fmt(hit: tuple[float, int] | None) -> str:
    return f"{hit[0] / 60:6.2f} min @ {hit[1]:>7d} steps" if hit else "   not reached      "


def main(argv: list[str]) -> int:
    import torch

    from robo_rl.config import load
    from robo_rl.run_config import TrainConfig

    p = argparse.ArgumentParser(prog="robo-rl bench ppo", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/quickstart.yaml")
    p.add_argument("--minutes", type=float, default=15.0, help="wall-clock cap per implementation")
    p.add_argument("--out", default="bench_out/ppo_vs_sb3.json")
    p.add_argument("--runs", default="ours,sb3-matched,sb3",
                   help="comma list of: ours, sb3-matched (SB3 + our success-bootstrap rule), sb3 (SB3 as it comes)")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. env.num_envs=4")
    args = p.parse_args(argv)
    check_positive(p, args, "minutes")
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = sorted(set(runs) - {"ours", "sb3-matched", "sb3"})
    if unknown or not runs:
        p.error(f"--runs {args.runs!r}: {f'unknown entries {unknown}' if unknown else 'no entries'}; "
                "choose from ours, sb3-matched, sb3")
    check_output(p, args, "out")
    torch.set_num_threads(1)
    cfg = load(TrainConfig, args.config, args.overrides)
    results: dict[str, Any] = {}
    for name in runs:
        if name == "ours":
            with tempfile.TemporaryDirectory() as tmp:
                results[name] = run_ours(cfg, args.minutes, Path(tmp))
        else:
            results[name] = run_sb3(cfg, args.minutes, matched=name == "sb3-matched")
        print(f"{name} done: {results[name]}", flush=True)
    print(f"\n# PPO on {cfg.env.task}, {cfg.env.num_envs} envs, cap {args.minutes} min each; "
          f"success = last {WINDOW} training episodes")
    for name, res in results.items():
        sps = res["env_steps"] / max(1e-9, res["wall_s"])
        print(f"{name:>11}: " + "  ".join(f"{th}: {_fmt(res['hits'].get(th))}" for th in THRESHOLDS) + f"  ({sps:.0f} env steps/s)")
    for ref in (r for r in results if r != "ours" and "ours" in results):
        for th in THRESHOLDS:
            o, s = results["ours"]["hits"].get(th), results[ref]["hits"].get(th)
            if o and s:
                print(f"ratio ours/{ref} wall-clock to {th}: {o[0] / s[0]:.2f}  (env steps: {o[1] / s[1]:.2f})")
            elif o:
                print(f"ratio ours/{ref} wall-clock to {th}: <= {o[0] / (args.minutes * 60):.2f} ({ref} not reached in the cap)")
            else:
                print(f"ratio ours/{ref} wall-clock to {th}: n/a (ours not reached)")
    write_json(args.out, {k: {**v, "hits": {str(t): h for t, h in v["hits"].items()}} for k, v in results.items()})
    return 0
