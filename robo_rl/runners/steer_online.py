"""`robo-rl steer online`: the steering head fine-tuned in the environment with the VLA frozen and the
gate in the loop.

Each iteration rolls out ``episodes`` whole episodes of the steered policy (Flow-SDE samples of the
composed field, ``online_act``); every call whose gate was open is a training sample with the advantage
(episode success - the iteration's mean success); a clipped policy-gradient update (PPO's surrogate, no
critic) on the head's parameters only follows. Calls with a closed gate run the frozen base and carry no
gradient. The result is a steering directory like ``steer fit``'s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robo_rl.boundary import obs_to_torch, to_env_actions
from robo_rl.build import build_env
from robo_rl.errors import CheckpointError, ConfigError
from robo_rl.files import check_replaceable


def _rollout(model: Any, env: Any, episodes: int, seed: int, noise_level: float) -> tuple[list[dict[str, Any]], list[bool]]:
    """Steered calls (obs, extras, old log-prob, episode index) of ``episodes`` whole episodes (per-env quotas,
    as evaluate_policy), and each episode's success."""
    quota = [episodes // env.num_envs + int(i < episodes % env.num_envs) for i in range(env.num_envs)]
    done_per_env, outcomes = [0] * env.num_envs, []
    open_calls: list[list[dict[str, Any]]] = [[] for _ in range(env.num_envs)]
    calls: list[dict[str, Any]] = []
    obs, _ = env.reset(seed=seed)
    model.reset()
    while len(outcomes) < episodes:
        t_obs = obs_to_torch(obs)
        out = model.online_act(t_obs, noise_level)
        res = env.step(to_env_actions(out.actions, env.action_spec))
        g = out.extras["gate"]
        for i in np.flatnonzero(g.cpu().numpy()):
            row = {k: v[i:i + 1] for k, v in t_obs.items() if isinstance(v, torch.Tensor)}
            row["instruction"] = [t_obs["instruction"][i]] if "instruction" in t_obs else None
            open_calls[i].append({"obs": row, "extras": {k: v[i:i + 1] for k, v in out.extras.items()},
                                  "log_prob": out.log_prob[i:i + 1]})
        done = np.logical_or(res.terminated, res.truncated)
        for i in np.flatnonzero(done):
            if done_per_env[i] < quota[i]:
                done_per_env[i] += 1
                for c in open_calls[i]:
                    c["episode"] = len(outcomes)
                calls.extend(open_calls[i])
                outcomes.append(bool(res.info["success"][i]))
            open_calls[i] = []
        if done.any():
            model.reset(np.flatnonzero(done))
        obs = res.obs
    return calls, outcomes


def _batches(calls: list[dict[str, Any]], size: int = 64) -> list[tuple[dict[str, Any], dict[str, Any], torch.Tensor, list[int]]]:
    """Stored calls stacked into (obs, extras, old log-probs (B,), episode indices) batches of up to ``size``
    rows; calls are grouped by prompt length (prompts are padded per call, so only equal lengths stack)."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for c in calls:
        groups.setdefault(int(c["extras"]["prompt_ids"].shape[1]), []).append(c)
    out = []
    for group in groups.values():
        for s in range(0, len(group), size):
            part = group[s:s + size]
            obs: dict[str, Any] = {k: torch.cat([c["obs"][k] for c in part]) for k, v in part[0]["obs"].items()
                                   if isinstance(v, torch.Tensor)}
            if part[0]["obs"].get("instruction") is not None:
                obs["instruction"] = [t for c in part for t in c["obs"]["instruction"]]
            extras = {k: torch.cat([c["extras"][k] for c in part]) for k in part[0]["extras"]}
            out.append((obs, extras, torch.cat([c["log_prob"] for c in part]), [c["episode"] for c in part]))
    return out


def _update(model: Any, opt: torch.optim.Optimizer, calls: list[dict[str, Any]], adv: np.ndarray, epochs: int,
            clip: float, noise_level: float) -> dict[str, float]:
    """Clipped surrogate over the steered calls, the mean over calls of min(r A, clip(r) A); one Adam step
    per epoch on the head (batched re-scoring, gradients accumulated over the batches)."""
    losses, fracs = [], []
    batches = _batches(calls)
    for _ in range(epochs):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for obs, extras, old, episode in batches:
            new = model.online_log_prob(obs, extras, noise_level)
            ratio = (new - old).exp()
            a = torch.as_tensor(adv[episode], dtype=ratio.dtype)
            loss = -torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a).sum() / len(calls)
            loss.backward()
            total += float(loss.detach())
            fracs.extend(((ratio - 1).abs() > clip).float().tolist())
        torch.nn.utils.clip_grad_norm_(model.head.parameters(), 1.0)
        opt.step()
        losses.append(total)
    return {"loss": float(np.mean(losses)), "clip_frac": float(np.mean(fracs)) if fracs else 0.0}


def train_online(checkpoint: str, steering_dir: str, out: str, iterations: int = 10, episodes: int = 8,
                 num_envs: int | None = None, seed: int = 20_000, lr: float = 1e-4, epochs: int = 2,
                 clip: float = 0.2, noise_level: float = 0.5, overrides: list[str] | None = None,
                 tau: float | None = None, beta: float | None = None) -> dict[str, Any]:
    """Fine-tune the head of ``steering_dir`` online for ``iterations`` x ``episodes`` episodes; save to ``out``
    (``tau``: the tau gate's threshold instead of the fitted one; ``beta``: the steering scale, saved with
    the head)."""
    from robo_rl.runners.steer import _check_counts, _env_cfg, _json_safe, _save_steering, load_steered

    _check_counts("steer online", iterations=iterations, episodes=episodes, seed=seed, epochs=epochs)
    if not (lr > 0 and clip > 0 and noise_level > 0):
        raise ConfigError(f"steer online --lr {lr} --clip {clip} --noise-level {noise_level}: each must be > 0")
    if tau is not None and not 0.0 <= tau <= 1.0:
        raise ConfigError(f"steer online --tau {tau}: a probability in [0, 1]")
    if beta is not None and not (beta > 0 and np.isfinite(beta)):
        raise ConfigError(f"steer online --beta {beta}: the steering scale must be a finite number > 0")
    target = Path(out)
    try:
        check_replaceable(target, lambda p: (p / "steering.json").is_file(), "steering directory")
    except CheckpointError as err:
        raise ConfigError(f"steer online --out: {err}") from None
    model = load_steered(checkpoint, steering_dir, tau, beta)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.head.parameters(), lr=lr)
    env = build_env(_env_cfg(checkpoint, overrides or [], num_envs))
    history = []
    try:
        for it in range(iterations):
            calls, outcomes = _rollout(model, env, episodes, seed + it * episodes, noise_level)
            success = np.asarray(outcomes, np.float32)
            adv = success - success.mean()
            row = {"iteration": it, "success_rate": float(success.mean()), "steered_calls": len(calls)}
            if calls and np.abs(adv).max() > 0:
                model.head.train()
                row.update(_update(model, opt, calls, adv, epochs, clip, noise_level))
                model.head.eval()
            history.append(row)
    finally:
        env.close()
    summary = _json_safe({"base": str(checkpoint), "from": str(steering_dir), "online": history,
                          "config": dataclasses.asdict(model.cfg), "lr": lr, "epochs": epochs, "clip": clip,
                          "noise_level": noise_level, "episodes_per_iteration": episodes})
    if getattr(model, "bands", None) is not None:
        summary["conformal"] = model.bands.to_dict()
    _save_steering(model, summary, target)
    return summary
