"""Evaluate a policy on a VecEnv: success rate with a 95% Wilson interval, returns, a video."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robo_rl.boundary import obs_to_torch, to_env_actions
from robo_rl.eval.metrics import wilson_interval


@dataclass
class EvalResult:
    """Outcome of ``evaluate_policy``; ``frames`` holds (H, W*B, 3) tiles when recorded."""

    episode_success: list[list[bool]]
    """Per env (B lists), the success of its counted episodes in order. Env i's k-th episode starts from
    the same initial state in every evaluation with the same seed and B (the simulators draw initial
    states from their own per-env RNG, not from the actions), so two policies' outcomes pair up."""
    mean_return: float
    frames: list[np.ndarray] = field(default_factory=list)
    first_outcomes: list[tuple[int, bool]] = field(default_factory=list)
    """When recorded: per env, (index in ``frames`` of the last frame of its first episode, success)."""
    episode_offset: list[list[bool]] = field(default_factory=list)
    """On a mixed split (``env.variations.offset_prob`` < 1): per env, whether each counted episode had the
    fixed offsets (as ``episode_success``); empty otherwise."""

    @property
    def episodes(self) -> int:
        return sum(len(env) for env in self.episode_success)

    @property
    def successes(self) -> int:
        return sum(int(x) for env in self.episode_success for x in env)

    @property
    def success_rate(self) -> float:
        return self.successes / max(1, self.episodes)

    @property
    def ci95(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.episodes)

    def as_dict(self) -> dict[str, Any]:
        lo, hi = self.ci95
        return {"episodes": self.episodes, "successes": self.successes, "success_rate": self.success_rate,
                "ci95_low": lo, "ci95_high": hi, "mean_return": self.mean_return,
                "episode_success": [[int(x) for x in env] for env in self.episode_success]} \
            | ({"episode_offset": [[int(x) for x in env] for env in self.episode_offset]} if self.episode_offset else {})


@torch.no_grad()
def evaluate_policy(env: Any, policy: Any, episodes: int, seed: int = 10_000, deterministic: bool = True,
                    record_video: bool = False, max_steps: int = 100_000) -> EvalResult:
    """Run exactly ``episodes`` episodes, split evenly over the B envs (env i runs a fixed quota, so
    short episodes are not over-counted). The first episode of every env is recorded when asked."""
    b = env.num_envs
    quota = np.array([episodes // b + (1 if i < episodes % b else 0) for i in range(b)])
    done_count = np.zeros(b, int)
    returns: list[float] = []
    outcomes: list[list[bool]] = [[] for _ in range(b)]
    shifted: list[list[bool]] = [[] for _ in range(b)]
    ep_ret = np.zeros(b)
    frames: list[np.ndarray] = []
    first_done = np.zeros(b, bool)
    first: dict[int, tuple[int, bool]] = {}
    obs, _ = env.reset(seed=seed)
    policy.reset()
    steps = 0
    while (done_count < quota).any() and steps < max_steps:
        if record_video and not first_done.all():
            frames.append(np.concatenate(list(env.render()), axis=1))
        out = policy.act(obs_to_torch(obs), deterministic=deterministic)
        res = env.step(to_env_actions(out.actions, env.action_spec))
        ep_ret += res.reward
        done = res.terminated | res.truncated
        for i in np.flatnonzero(done):
            if record_video and not first_done[i]:
                first[i] = (len(frames) - 1, bool(res.info["success"][i]))
            if done_count[i] < quota[i]:
                outcomes[i].append(bool(res.info["success"][i]))
                if (tags := res.info.get("offset_applied")) is not None and tags[i] is not None:
                    shifted[i].append(bool(tags[i]))
                returns.append(float(ep_ret[i]))
                done_count[i] += 1
            ep_ret[i] = 0.0
            first_done[i] = True
        if done.any():
            policy.reset(np.flatnonzero(done))
        obs = res.obs
        steps += 1
    tagged = sum(map(len, shifted)) == sum(map(len, outcomes))  # a restarted worker's episode has no tag
    return EvalResult(outcomes, float(np.mean(returns)) if returns else 0.0, frames, [first[i] for i in sorted(first)],
                      shifted if tagged and any(shifted) else [])


def save_video(result: EvalResult, path: Path, fps: int = 20) -> Path | None:
    if not result.frames:
        return None
    from robo_rl.eval.plots import write_video

    write_video(result.frames, path, fps=fps)
    return path
