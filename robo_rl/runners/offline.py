"""Offline training loop (behaviour cloning / SFT): minibatches of demonstration transitions, the
same run directory, metrics, evaluation and checkpoints as on-policy training, so a PPO run can
start from the result with ``run.init_from``."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robo_rl import checkpoint as ckpt_io
from robo_rl.algorithms.optim import TermMeans
from robo_rl.build import build_algorithm, build_env, build_policy
from robo_rl.capabilities import ActionStats, RunningNormalizer, StateStats
from robo_rl.data.augment import random_shift
from robo_rl.errors import ConfigError
from robo_rl.files import atomic_write_text
from robo_rl.rollout.device import on_device, place, resolve_device, to_device
from robo_rl.run_config import TrainConfig
from robo_rl.runners.evaluate import evaluate_policy
from robo_rl.runners.logger import OFFLINE_COLUMNS, MetricsLogger
from robo_rl.runners.stop import StopRequest

log = logging.getLogger(__name__)


@dataclass
class DemoArrays:
    """Flat transitions: obs[k] (N, ...), actions (N, A) or chunks (N, H, A) with ``valid`` (N, H)
    (False past the episode's end), instruction list[str] (N)."""

    obs: dict[str, np.ndarray]
    actions: np.ndarray
    instruction: list[str]
    valid: np.ndarray | None = None

    def batch(self, idx: np.ndarray) -> tuple[Any, ...]:
        obs: dict[str, Any] = {k: torch.from_numpy(v[idx]) for k, v in self.obs.items()}
        obs["instruction"] = [self.instruction[i] for i in idx]
        if self.valid is None:
            return obs, torch.from_numpy(self.actions[idx])
        return obs, torch.from_numpy(self.actions[idx]), torch.from_numpy(self.valid[idx])

    @property
    def step_actions(self) -> np.ndarray:
        """(M, A) every demonstrated action once (for statistics)."""
        return self.actions if self.valid is None else self.actions[:, 0]


def load_demos(path: str | list[str], obs_keys: list[str], only_success: bool,
               max_episodes: int | None) -> tuple[list[Any], dict[str, Any]]:
    """The episodes of one demonstrations file, or of several pooled (same env, task, control and obs
    mode; disjoint episode seeds, so no episode is counted twice); returns (episodes, the first file's meta)."""
    from robo_rl.data.episodes import load_episodes, read_meta

    paths = [path] if isinstance(path, str) else list(path)
    if not paths:
        raise ConfigError("config key 'algo.dataset' is an empty list; give one or more demonstrations files")
    metas = [read_meta(p) for p in paths]
    _check_pooled(paths, metas)
    eps = [ep for p in paths for ep in load_episodes(p) if ep.succeeded or not only_success]
    if max_episodes is not None:
        eps = eps[:max_episodes]
    where = paths[0] if len(paths) == 1 else ", ".join(paths)
    if not eps:
        raise ConfigError(f"'{where}' has no {'successful ' if only_success else ''}episodes to train on")
    for k in obs_keys:
        if k not in eps[0].obs:
            raise ConfigError(f"the policy needs obs '{k}' but '{where}' holds {sorted(eps[0].obs)} "
                              "(record the demos with the matching --obs-mode)")
    return eps, metas[0]


def _check_pooled(paths: list[str], metas: list[dict[str, Any]]) -> None:
    """Files pooled into one dataset must describe the same setup and different episodes (LIBERO files may
    hold different tasks of one suite: multi-task data, told apart by their instructions)."""
    multitask = {str(m.get("env")) for m in metas} == {"libero"}
    for key in ("env", "task", "control_mode", "obs_mode", "robot_uids"):
        if key == "task" and multitask:
            suites = {str(m.get("task", "")).partition("/")[0] for m in metas}
            if len(suites) > 1:
                raise ConfigError("algo.dataset pools LIBERO files of different suites: " + ", ".join(
                    f"'{p}' {m.get('task')!r}" for p, m in zip(paths, metas)) + "; pool tasks of one suite")
            continue
        values = {str(m.get(key)) for m in metas}
        if len(values) > 1:
            raise ConfigError(f"algo.dataset pools files with different {key}: "
                              + ", ".join(f"'{p}' {m.get(key)!r}" for p, m in zip(paths, metas)) + "; pool one setup")
    spans = [(int(m["seed"]), int(m["seed"]) + int(m.get("attempts", m.get("num_episodes", 0))), p, str(m.get("task")))
             for p, m in zip(paths, metas) if isinstance(m.get("seed"), int)]
    for i, (lo, hi, p, task) in enumerate(spans):
        for lo2, hi2, p2, task2 in spans[i + 1:]:
            if task == task2 and lo < hi2 and lo2 < hi:
                raise ConfigError(f"algo.dataset pools '{p}' (seeds {lo}..{hi - 1}) and '{p2}' (seeds {lo2}..{hi2 - 1}): "
                                  "the same episodes twice; generate the second with a disjoint --seed")


def flatten(eps: list[Any], obs_keys: list[str], horizon: int = 1) -> DemoArrays:
    """One row per demonstrated step that has every observation (all steps, or the recorded frames of an
    episode with ``frame_steps``); with ``horizon`` H > 1 the row's target is the chunk of the next H actions
    (zero-padded past the episode's end, where ``valid`` is False)."""
    rows = [ep.image_rows() if "rgb" in obs_keys else np.arange(ep.length) for ep in eps]
    obs = {k: np.concatenate([ep.obs_at(k, r) for ep, r in zip(eps, rows)]) for k in obs_keys}
    instruction = [ep.instruction for ep, r in zip(eps, rows) for _ in range(len(r))]
    if horizon <= 1:
        return DemoArrays(obs, np.concatenate([ep.actions[r] for ep, r in zip(eps, rows)]).astype(np.float32), instruction)
    chunks, valid = [], []
    for ep, r in zip(eps, rows):
        t, a = ep.length, ep.actions.astype(np.float32)
        padded = np.concatenate([a, np.zeros((horizon, a.shape[1]), np.float32)])
        idx = r[:, None] + np.arange(horizon)[None]
        chunks.append(padded[idx])
        valid.append(idx < t)
    return DemoArrays(obs, np.concatenate(chunks), instruction, np.concatenate(valid))


def _check_libero_demos(cfg: TrainConfig) -> None:
    """LIBERO demonstrations must come from the env's suite and tasks, at its image size."""
    env, dataset = cfg.env, getattr(cfg.algo, "dataset", "")
    if getattr(env, "name", None) != "libero" or not dataset:
        return
    from robo_rl.data.episodes import read_meta
    from robo_rl.registry import SIMULATORS

    ids = env.task_ids or tuple(range(SIMULATORS.get("libero").suite_size(env.suite)))
    for path in [dataset] if isinstance(dataset, str) else dataset:
        if not Path(path).is_file():  # a missing file is reported as such (check_inputs, dry-run listing)
            continue
        m = read_meta(path)
        if m.get("env") != "libero":
            raise ConfigError(f"algo.dataset '{path}' holds {m.get('env')!r} demonstrations; env.name is libero: "
                              "record LIBERO demos with `robo-rl demos generate --sim libero`")
        suite, _, idx = str(m.get("task", "")).partition("/")
        if suite != env.suite or not idx.isdigit() or int(idx) not in ids:
            raise ConfigError(f"algo.dataset '{path}' holds demos of {m.get('task')!r}, outside env.suite="
                              f"{env.suite!r} task_ids={list(ids)}; train on the demos' tasks or record demos of these")
        if m.get("image_size") not in (None, env.image_size):
            raise ConfigError(f"algo.dataset '{path}' was recorded at {m['image_size']} px but env.image_size is "
                              f"{env.image_size}; set env.image_size: {m['image_size']}")
        if bool(m.get("fast_render", False)) != env.fast_render:
            have = bool(m.get("fast_render", False))
            raise ConfigError(f"algo.dataset '{path}' was recorded with fast_render {str(have).lower()} but "
                              f"env.fast_render is {str(env.fast_render).lower()} (the images differ: shadows, "
                              f"reflections); set env.fast_render: {str(have).lower()}")


def check_offline_config(cfg: TrainConfig) -> None:
    """One-line errors an offline run can know from its config alone, before a run directory exists."""
    unused = [key for key, off in (("cluster.address", cfg.cluster.address is None), ("run.pipeline", not cfg.run.pipeline),
                                   ("run.policy_cpus", cfg.run.policy_cpus is None)) if not off]
    if unused:
        raise ConfigError(f"config key {', '.join(repr(k) for k in unused)} does not apply to offline algorithm "
                          f"{cfg.algo.name!r} (one process, no rollouts); remove it")
    _check_libero_demos(cfg)
    shift = getattr(cfg.algo, "image_shift", 0)
    if shift and getattr(cfg.env, "obs_mode", "rgb") != "rgb":
        raise ConfigError(f"config key 'algo.image_shift' = {shift} augments images, but env.obs_mode is "
                          f"{cfg.env.obs_mode!r}; set env.obs_mode: rgb or algo.image_shift: 0")


class OfflineTrainer:
    """Runs ``algo`` (an offline algorithm such as ``bc``) in ``run_dir``."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, stop: StopRequest | None = None) -> None:
        """``stop``: once set, training ends after the current gradient step and saves its checkpoint (the
        best-validation weights when kept), without the final evaluation."""
        self.cfg = cfg
        self.run_dir = run_dir
        self.stop = stop
        import yaml

        from robo_rl.config import to_dict

        atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))

    def run(self) -> dict[str, Any]:
        cfg, rc = self.cfg, self.cfg.run
        torch.set_num_threads(rc.torch_threads)
        torch.manual_seed(rc.seed)
        rng = np.random.default_rng(rc.seed)
        self.env = build_env(cfg.env, render=rc.video, num_envs=rc.eval_num_envs)
        try:
            return self._run(rng)
        finally:
            self.env.close()

    def _check_control(self, meta: dict[str, Any]) -> None:
        want = getattr(self.cfg.env, "control_mode", None)
        have = meta.get("control_mode")
        if want is not None and have is not None and meta.get("env") == getattr(self.cfg.env, "name", None) and want != have:
            raise ConfigError(f"the demonstrations' actions are {have!r} but env.control_mode is {want!r}; "
                              f"set env.control_mode: {have}")
        extra = getattr(self.cfg.env, "extra", None)
        robot = extra.get("robot_uids") if isinstance(extra, dict) else None
        if meta.get("env") == "maniskill" and str(meta.get("robot_uids")) != str(robot):
            raise ConfigError(f"the demonstrations were recorded with robot {meta.get('robot_uids') or 'the task default'} "
                              f"but env.extra.robot_uids is {robot or 'unset (the task default)'}; "
                              + (f"set env.extra.robot_uids: {meta['robot_uids']}" if meta.get("robot_uids")
                                 else "remove env.extra.robot_uids"))

    def _data_and_policy(self, rng: np.random.Generator) -> tuple[Any, DemoArrays, DemoArrays | None]:
        """(policy with its statistics fitted to the demonstrations or its init weights, train rows,
        held-out rows or None), the episodes split by ``algo.val_fraction``."""
        cfg, rc, ac, env = self.cfg, self.cfg.run, self.cfg.algo, self.env
        keys = [k for k in env.obs_spec if k in ("rgb", "state")]
        eps, meta = load_demos(ac.dataset, keys, ac.only_success, ac.max_episodes)
        self._check_control(meta)
        for k in keys:
            if tuple(eps[0].obs[k].shape[1:]) != tuple(env.obs_spec[k].shape):
                raise ConfigError(f"demo obs '{k}' has shape {eps[0].obs[k].shape[1:]} but the env gives "
                                  f"{env.obs_spec[k].shape} (match env.image_size to the demos)")
        order = rng.permutation(len(eps))
        n_val = int(round(len(eps) * ac.val_fraction)) if len(eps) > 1 else 0
        if n_val >= len(eps):
            raise ConfigError(f"algo.val_fraction={ac.val_fraction} leaves no training episode of the {len(eps)} in "
                              f"{ac.dataset}; use a val_fraction below {(len(eps) - 0.5) / len(eps):.2f} or more demos")
        policy = build_policy(cfg.policy, env.obs_spec, env.action_spec)
        horizon = int(getattr(policy, "action_horizon", 1))  # chunk policies learn whole chunks
        val = flatten([eps[i] for i in order[:n_val]], keys, horizon) if n_val else None
        train = flatten([eps[i] for i in order[n_val:]], keys, horizon)
        del eps
        if rc.init_from:
            from robo_rl.runners.weights import load_policy_weights

            load_policy_weights(policy, rc.init_from)
        else:
            states = {k: torch.from_numpy(v) for k, v in train.obs.items() if k == "state"}
            if isinstance(policy, StateStats) and states:  # fixed input statistics of the demonstrations
                policy.fit_state_stats(states["state"])
            elif isinstance(policy, RunningNormalizer):  # running input statistics, seeded by the demonstrations
                policy.update_normalizer(states)
            if isinstance(policy, ActionStats):  # output statistics (token bins, flow normalization)
                policy.fit_action_stats(train.step_actions, keep_last=ac.norm_mask == "all_but_last")
        return place(policy, self.device), train, val  # statistics fitted on the CPU, learning on run.device

    def _run(self, rng: np.random.Generator) -> dict[str, Any]:
        cfg, rc, ac = self.cfg, self.cfg.run, self.cfg.algo
        env = self.env
        self.device = resolve_device(rc.device)
        policy, train, val = self._data_and_policy(rng)
        algo = build_algorithm(ac, policy)
        n = train.actions.shape[0]
        total = max(1, int(ac.epochs * n / ac.batch_size))
        log.info("bc: %d train transitions (%d val), %d gradient steps", n, 0 if val is None else val.actions.shape[0], total)
        metrics = MetricsLogger(self.run_dir, tensorboard=rc.tensorboard, columns=OFFLINE_COLUMNS)
        t0 = time.monotonic()
        window = TermMeans()  # the update terms since the last logged row
        best_eval = -1.0
        best_val: tuple[float, int, dict[str, torch.Tensor]] | None = None  # (val NLL, step, weights) when keep_best_val
        shift_gen = torch.Generator().manual_seed(rc.seed)
        perm = rng.permutation(n)
        pos = 0
        step = 0
        try:
            for step in range(1, total + 1):
                if rc.max_minutes is not None and (time.monotonic() - t0) / 60 >= rc.max_minutes:
                    break
                if self.stop is not None and self.stop.is_set():
                    step -= 1  # this step was not taken
                    break
                if pos + ac.batch_size > n:
                    perm, pos = rng.permutation(n), 0
                idx = perm[pos:pos + ac.batch_size]
                pos += ac.batch_size
                policy.train()
                batch = train.batch(idx)
                if ac.image_shift:
                    batch[0]["rgb"] = random_shift(batch[0]["rgb"], ac.image_shift, shift_gen)
                batch = to_device(batch, self.device)
                window.add(algo.update(batch))
                evaluate_now = bool(ac.eval_every) and step % ac.eval_every == 0
                if step % ac.log_every == 0 or step == total or evaluate_now:
                    row: dict[str, Any] = {"iteration": step, "env_steps": 0, "wall_time": round(time.monotonic() - t0, 3),
                                           "epoch": step * ac.batch_size / n}
                    row.update({f"loss/{k}": v for k, v in window.means().items()})
                    window = TermMeans()
                    if val is not None:
                        row["loss/val_nll"] = self._val_loss(algo, policy, val, ac.batch_size)
                        if ac.keep_best_val and (best_val is None or row["loss/val_nll"] < best_val[0]):
                            best_val = (row["loss/val_nll"], step,
                                        {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()})
                    if evaluate_now:
                        res = self._evaluate(policy, rc.eval_episodes, record=False)
                        row.update({"eval/success_rate": res.success_rate, "eval/ci_low": res.ci95[0],
                                    "eval/ci_high": res.ci95[1]})
                        best_eval = max(best_eval, res.success_rate)
                    metrics.log(row)
                    log.info("bc step %d/%d: %s", step, total, {k: round(v, 4) for k, v in row.items() if "/" in k})
        finally:
            metrics.close()
        from robo_rl.runners.weights import checkpoint_meta, cpu_state

        last_step = step
        if best_val is not None:  # early stopping: keep the weights with the lowest validation NLL
            policy.load_state_dict(best_val[2])
            step = best_val[1]
            log.info("bc: keeping step %d (validation NLL %.4g, the lowest)", step, best_val[0])
        meta_out = checkpoint_meta(cfg, env, 0, step)
        ckpt = ckpt_io.save(self.run_dir / "checkpoints", step, cpu_state(policy),
                            {"algo": algo.state_dict(), "state": {"iteration": step}}, meta_out, keep=rc.keep_checkpoints)
        summary: dict[str, Any] = {"run_dir": str(self.run_dir), "gradient_steps": last_step, "checkpoint": str(ckpt),
                                   "wall_time_min": round((time.monotonic() - t0) / 60, 2), "train_transitions": n}
        if best_val is not None:
            summary["best_val"] = {"step": best_val[1], "val_nll": best_val[0]}
        stopped = self.stop is not None and self.stop.is_set()
        if stopped:
            summary["stop_reason"] = self.stop.reason
        if rc.final_eval_episodes > 0 and not stopped:
            summary["final_eval"] = self._evaluate(policy, rc.final_eval_episodes, record=False).as_dict()
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        return summary

    @torch.no_grad()
    def _val_loss(self, algo: Any, policy: Any, val: DemoArrays, batch: int) -> float:
        policy.eval()
        n = val.actions.shape[0]
        total = 0.0
        for s in range(0, n, batch):
            idx = np.arange(s, min(n, s + batch))
            nll, _ = algo.loss(*to_device(val.batch(idx), self.device))
            total += float(nll) * len(idx)
        return total / n

    def _evaluate(self, policy: Any, episodes: int, record: bool) -> Any:
        policy.eval()
        with torch.no_grad():
            return evaluate_policy(self.env, on_device(policy, self.device), episodes, seed=self.cfg.run.seed + 10_000, record_video=record)

