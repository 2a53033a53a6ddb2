"""On-policy training loop: collect (T, B) rollouts, update, log, evaluate, checkpoint, resume."""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from robo_rl import checkpoint as ckpt_io
from robo_rl.affinity import pin_process, unpin_process
from robo_rl.build import build_algorithm, build_env, build_policy, check_model_size
from robo_rl.capabilities import (
    GroupRollouts,
    ProgressAware,
    ReferencePolicy,
    RolloutMode,
    RunningNormalizer,
    TeacherGuided,
)
from robo_rl.config import from_dict, to_dict
from robo_rl.errors import CheckpointError, RoboRLError, RunDirError
from robo_rl.files import MAX_JSON_BYTES, atomic_write_text
from robo_rl.rollout.collector import Collector
from robo_rl.rollout.device import Greedy, on_device, place, resolve_device, to_device
from robo_rl.run_config import TrainConfig
from robo_rl.runlock import RunLock
from robo_rl.runners.checks import check_inputs, check_local_cpus, check_resume_config, check_resume_specs
from robo_rl.runners.evaluate import evaluate_policy, save_video
from robo_rl.runners.logger import MetricsLogger, Progress
from robo_rl.runners.stop import StopRequest
from robo_rl.runners.weights import checkpoint_meta, cpu_state, load_policy_weights

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Counters that a resumed run continues from."""

    iteration: int = 0
    env_steps: int = 0
    wall_time: float = 0.0
    next_eval: int = 0
    next_ckpt: int = 0
    best_eval: float = -1.0


def make_run_dir(cfg: TrainConfig) -> Path:
    """Create a fresh run directory; one-line errors if it exists or cannot be written."""
    name = cfg.run.name or f"{getattr(cfg.env, 'task', cfg.env.name)}-{cfg.algo.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.run.out_dir) / name
    if run_dir.exists() and any(run_dir.iterdir()):
        raise RunDirError(f"run directory '{run_dir}' already exists; resume it with 'robo-rl train --resume {run_dir}' "
                          "or choose another run.name")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise RunDirError(f"cannot write run directory '{run_dir}' ({err.strerror}); set run.out_dir to a writable path") from None
    return run_dir


def load_run_config(run_dir: Path, overrides: list[str] | None = None) -> TrainConfig:
    """The resolved config a run was started with (plus optional overrides)."""
    from robo_rl.config import apply_overrides, read_yaml

    path = run_dir / "config.yaml"
    if not path.is_file():
        raise CheckpointError(f"'{run_dir}' is not a run directory (no config.yaml); pass the directory 'robo-rl train' created")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise CheckpointError(f"'{path}' is {path.stat().st_size // 2**20} MiB, more than the "
                              f"{MAX_JSON_BYTES // 2**20} MiB a run's config may have; it is not one "
                              "robo-rl wrote")
    return from_dict(TrainConfig, apply_overrides(read_yaml(path), overrides or []))


class Trainer:
    """Runs one training job in ``run_dir``; ``resume=True`` continues from its latest checkpoint."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, resume: bool = False,
                 on_iteration: Callable[[dict[str, Any]], bool] | None = None, write_config: bool = False,
                 stop: StopRequest | None = None) -> None:
        """``on_iteration(row)`` sees each metrics row; returning True stops the run (benchmarks).
        ``stop``: once set, the run ends after its current iteration, saves a checkpoint and skips the
        final evaluation (stop_reason 'interrupted'; ``robo-rl train --resume`` continues it).
        ``write_config`` (a resume with overrides): config.yaml is rewritten only once the checkpoint
        has loaded under the new config, so a failed resume leaves the run directory as it was."""
        self.cfg = cfg
        self.on_iteration = on_iteration
        self.stop = stop
        self.run_dir = run_dir
        self.state = TrainState()
        self._write_config = write_config
        self._saved_step = -1
        self._resume_ckpt: Path | None = None
        self._resume_meta: dict[str, Any] = {}
        if resume:
            if (run_dir / "checkpoints").is_dir():
                ckpt_io.restore_moved_aside(run_dir / "checkpoints")  # this run's own writer: may rename
            self._resume_ckpt = ckpt = ckpt_io.resolve(run_dir)
            self._resume_meta = meta = ckpt_io.read_meta(ckpt)  # validate before building anything heavy
            ckpt_io.require_trainer_state(ckpt)
            check_resume_config(cfg, meta, ckpt)
            check_model_size(cfg.policy, *ckpt_io.specs_from_meta(meta, ckpt), f"checkpoint '{ckpt}'")
        else:
            atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))

    # -- setup ---------------------------------------------------------------------------------
    def _seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def _meta(self) -> dict[str, Any]:
        return checkpoint_meta(self.cfg, self.env, self.state.env_steps, self.state.iteration)

    def save_checkpoint(self) -> Path:
        trainer_state = {"algo": self.algo.state_dict(), "state": vars(self.state).copy(),
                         "reward_scaler": self.reward_scaler.state_dict() if self.reward_scaler else None,
                         "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
                         "generator": self.generator.get_state(),
                         **({"cuda_rng": torch.cuda.get_rng_state(self.device)} if self.device.type == "cuda" else {})}
        path = ckpt_io.save(self.run_dir / "checkpoints", self.state.env_steps, cpu_state(self.policy),
                            trainer_state, self._meta(), keep=self.cfg.run.keep_checkpoints)
        self._saved_step = self.state.env_steps
        return path

    def _restore(self, ckpt: Path) -> None:
        meta = self._resume_meta
        if meta.get("policy") != self.cfg.policy.name:
            raise CheckpointError(f"checkpoint '{ckpt}' holds policy {meta.get('policy')!r}, the config asks for {self.cfg.policy.name!r}")
        check_resume_specs(meta, self._meta(), ckpt)
        ckpt_io.load_into(self.policy, ckpt_io.load_model_state(ckpt), ckpt)
        ts = ckpt_io.load_trainer_state(ckpt)
        try:
            self.algo.load_state_dict(ts["algo"])
            self.state = TrainState(**ts["state"])
            if self.reward_scaler and ts.get("reward_scaler"):
                self.reward_scaler.load_state_dict(ts["reward_scaler"])
            torch.set_rng_state(ts["torch_rng"])
            np.random.set_state(ts["numpy_rng"])
            self.generator.set_state(ts["generator"])
            if self.device.type == "cuda" and ts.get("cuda_rng") is not None:  # (a CPU checkpoint: seeded anew)
                torch.cuda.set_rng_state(ts["cuda_rng"], self.device)
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as err:
            raise CheckpointError(f"checkpoint '{ckpt}' trainer state does not match this run ({type(err).__name__}: {err})") from None
        log.info("resumed from %s at env step %d", ckpt, self.state.env_steps)

    # -- main loop -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to the end (or a stop); with ``run.policy_cpus`` this process is pinned for the run and
        given its CPU mask back after it, however it ends."""
        if self.cfg.run.policy_cpus is None:
            return self._setup_and_run()
        pin_process(self.cfg.run.policy_cpus)
        try:
            return self._setup_and_run()
        finally:
            unpin_process()

    def _setup_and_run(self) -> dict[str, Any]:
        cfg, rc = self.cfg, self.cfg.run
        torch.set_num_threads(rc.torch_threads)
        self.device = resolve_device(rc.device)
        self._seed(rc.seed)
        self.generator = torch.Generator().manual_seed(rc.seed)
        self._ray: Any = None
        if cfg.cluster.address is not None:
            from robo_rl.distributed.rollout import RayRollouts

            self._ray = self.env = RayRollouts(cfg)  # connects and checks resources; workers start in _run
        else:
            self.env = build_env(cfg.env)
        self.eval_env: Any = None
        try:
            return self._run()
        finally:
            if hasattr(getattr(self, "algo", None), "close"):  # learner actors
                self.algo.close()
            self.env.close()
            if self.eval_env is not None:
                self.eval_env.close()

    def _run(self) -> dict[str, Any]:
        source = self._build_learning()
        st = self.state
        metrics = MetricsLogger(self.run_dir, tensorboard=self.cfg.run.tensorboard,
                                keep_until_step=st.env_steps if self._resume_ckpt is not None else None)
        try:
            stop_reason = self._loop(source, metrics)
        finally:
            metrics.close()
        if self._saved_step != st.env_steps:  # else the periodic save just wrote this very state
            self.save_checkpoint()
        return self._finish(stop_reason)

    def _build_learning(self) -> Any:
        """Policy, algorithm (with its teacher), the rollout source, and the state restored or initialized."""
        cfg, rc, env = self.cfg, self.cfg.run, self.env
        gamma = getattr(cfg.algo, "gamma", 0.99)  # the reward scaler's return discount
        if self._ray is not None:  # rollout workers on Ray: each collects its share of the envs
            self._ray.configure()
        self.policy = place(build_policy(cfg.policy, env.obs_spec, env.action_spec), self.device)  # before its optimizer
        actor = on_device(self.policy, self.device)  # what the rollout loops call: CPU tensors in and out
        if self._ray is not None and cfg.cluster.num_learners > 0:  # data-parallel learners (DDP/FSDP) on Ray
            from robo_rl.distributed.learner import RayLearners

            self.algo = RayLearners(cfg, self._ray.ray, self.policy, env.obs_spec, env.action_spec)
        else:
            self.algo = build_algorithm(cfg.algo, self.policy, generator=self.generator)
        if isinstance(self.algo, RolloutMode) and self.algo.greedy_rollouts():  # OPD on the greedy path
            actor = Greedy(actor)
        if isinstance(self.algo, GroupRollouts) and self._ray is not None:  # GRPO on Ray: groups within workers
            self._ray.use_groups(self.algo.rollout_groups())
            source: Any = self._ray
        elif isinstance(self.algo, GroupRollouts):  # GRPO: n episodes per initial state, in this process
            from robo_rl.rollout.groups import GroupCollector

            source = GroupCollector(env, actor, **self.algo.rollout_groups())
        else:
            source = self._ray if self._ray is not None else \
                Collector(env, actor, rc.rollout_steps, rc.reward_norm, gamma, rc.pipeline)
        self.reward_scaler = source.reward_scaler
        if self._resume_ckpt is not None:
            self._restore(self._resume_ckpt)
            self._saved_step = self.state.env_steps
            if self._write_config:
                atomic_write_text(self.run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
        elif rc.init_from:
            load_policy_weights(self.policy, rc.init_from)
        if self._resume_ckpt is None and isinstance(self.algo, ReferencePolicy):
            self.algo.snapshot_reference()  # the KL reference is the policy the run starts from (after init_from)
        # teacher-guided algorithms (RPD, OPD) get their teacher once the student's weights and buffers are
        # in: OPD compares the two token spaces (a pi0's includes its action normalization)
        if isinstance(self.algo, TeacherGuided) and not self.algo.needs_teacher():
            log.info("teacher %s not loaded: %s never asks it as configured", cfg.algo.teacher, cfg.algo.name)
        elif isinstance(self.algo, TeacherGuided):
            from robo_rl.build import policy_from_checkpoint

            teacher, _, teacher_actions = policy_from_checkpoint(cfg.algo.teacher, cfg.algo.teacher_policy)
            self.algo.set_teacher(place(teacher, self.device), env.action_spec.shape, teacher_actions.shape)
            log.info("teacher policy from %s", cfg.algo.teacher)
        return source

    def _loop(self, source: Any, metrics: MetricsLogger) -> str:
        """Collect, update, log, evaluate and checkpoint until a stop condition; returns its name."""
        rc, st = self.cfg.run, self.state
        tobs = source.reset(seed=rc.seed + 1000 * st.iteration)
        track_stats = isinstance(self.policy, RunningNormalizer) and not rc.freeze_obs_stats
        if st.iteration == 0 and track_stats:
            self.policy.update_normalizer(to_device(tobs, self.device))
        source.sync(self.policy)
        t_start = time.monotonic() - st.wall_time
        if st.next_eval == 0:
            st.next_eval = rc.eval_every_steps
        if st.next_ckpt == 0:
            st.next_ckpt = rc.checkpoint_every_steps
        progress = Progress(rc.progress, rc.total_env_steps, st.env_steps)
        try:
            while st.env_steps < rc.total_env_steps:
                if rc.max_minutes is not None and (time.monotonic() - t_start) / 60 >= rc.max_minutes:
                    return "max_minutes"
                if self.stop is not None and self.stop.is_set():
                    return self.stop.reason
                row = self._iteration(source, track_stats, t_start)
                metrics.log(row)
                progress.update(st.env_steps, row)
                if st.env_steps >= st.next_ckpt:
                    st.next_ckpt += rc.checkpoint_every_steps
                    self.save_checkpoint()
                if rc.stop_at_eval_success is not None and row.get("eval/success_rate", -1) >= rc.stop_at_eval_success:
                    return "stop_at_eval_success"
                if self.on_iteration is not None and self.on_iteration(row):
                    return "on_iteration"
        finally:
            progress.close()
        return "total_env_steps"

    def _iteration(self, source: Any, track_stats: bool, t_start: float) -> dict[str, Any]:
        """One collect + update (+ an evaluation when due); returns the metrics row."""
        rc, st, env = self.cfg.run, self.state, self.env
        it_start = time.monotonic()
        steps_before = st.env_steps
        try:
            traj, steps = source.collect()
        except Exception:  # (a simulator that failed for good): the last update is kept before the error
            self._save_before_failure()
            raise
        batch = self.algo.prepare(traj)
        if self.device.type != "cpu":
            batch = batch.to(self.device)
        st.env_steps += steps
        self.policy.train()
        if isinstance(self.algo, ProgressAware):
            self.algo.set_progress(st.env_steps / rc.total_env_steps, st.env_steps)
        losses = self.algo.update(batch)
        if track_stats:
            self.policy.update_normalizer(batch.obs)
        source.sync(self.policy)  # weights (and normalizer statistics) to the rollout workers
        st.iteration += 1
        st.wall_time = time.monotonic() - t_start
        row: dict[str, Any] = {"iteration": st.iteration, "env_steps": st.env_steps,
                               "wall_time": round(st.wall_time, 3),
                               "steps_per_s": (st.env_steps - steps_before) / max(1e-9, time.monotonic() - it_start),
                               "env/worker_restarts": getattr(env, "restarts", 0) + sum(getattr(env, "env_restarts", []))}
        row.update({f"train/{k}": v for k, v in source.stats.summary().items()})
        row.update({f"rollout/{k}": v for k, v in source.report.items()})
        row.update({f"loss/{k}": v for k, v in losses.items()})
        if rc.eval_every_steps > 0 and st.env_steps >= st.next_eval:
            st.next_eval += rc.eval_every_steps
            res_eval = self._evaluate(rc.eval_episodes, record=False)
            lo, hi = res_eval.ci95
            row.update({"eval/success_rate": res_eval.success_rate, "eval/ci_low": lo, "eval/ci_high": hi,
                        "eval/return": res_eval.mean_return})
            st.best_eval = max(st.best_eval, res_eval.success_rate)
            log.info("step %d (%.1f min): eval success %.2f [%.2f, %.2f]", st.env_steps,
                     st.wall_time / 60, res_eval.success_rate, lo, hi)
            st.wall_time = time.monotonic() - t_start
        return row

    def _save_before_failure(self) -> None:
        """Checkpoint the state after the last completed update when collection fails (an env worker
        that cannot be restarted, a Ray node lost), so that ``robo-rl train --resume`` continues from it;
        a failure to save is logged and the original error goes on."""
        st = self.state
        if st.iteration == 0 or self._saved_step == st.env_steps:
            return
        try:
            path = self.save_checkpoint()
        except Exception as err:  # noqa: BLE001 - the collection error is the one to report
            log.error("could not save a checkpoint after the rollout failure (%s: %s)", type(err).__name__, err)
            return
        log.error("rollout failed at env step %d; saved %s first: continue with 'robo-rl train --resume %s'",
                  st.env_steps, path, self.run_dir)

    def _finish(self, stop_reason: str) -> dict[str, Any]:
        """Learning curve, final evaluation (and video); writes and returns summary.json's content."""
        rc, st = self.cfg.run, self.state
        self._plot()
        summary: dict[str, Any] = {"run_dir": str(self.run_dir), "env_steps": st.env_steps, "iterations": st.iteration,
                                   "wall_time_min": round(st.wall_time / 60, 2), "stop_reason": stop_reason,
                                   "worker_restarts": getattr(self.env, "restarts", 0)}
        if hasattr(self.algo, "restarts"):
            summary["learner_restarts"] = self.algo.restarts
        if rc.final_eval_episodes > 0 and not (self.stop is not None and self.stop.is_set()):
            final = self._evaluate(rc.final_eval_episodes, record=rc.video)
            summary["final_eval"] = final.as_dict()
            if rc.video:
                path = save_video(final, self.run_dir / "final_policy.mp4")
                summary["video"] = str(path) if path else None
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        return summary

    def _evaluate(self, episodes: int, record: bool) -> Any:
        if self.eval_env is None:
            self.eval_env = build_env(self.cfg.env, render=self.cfg.run.video, num_envs=self.cfg.run.eval_num_envs)
        self.policy.eval()
        return evaluate_policy(self.eval_env, on_device(self.policy, self.device), episodes, seed=self.cfg.run.seed + 10_000,
                               record_video=record)

    def _plot(self) -> None:
        try:
            from robo_rl.eval.plots import learning_curve

            learning_curve(self.run_dir / "metrics.csv", self.run_dir / "learning_curve.png")
        except (OSError, ValueError, KeyError) as err:  # a plot must never fail a finished run
            log.warning("could not draw the learning curve: %s", err)


def train(cfg: TrainConfig, stop: StopRequest | None = None) -> dict[str, Any]:
    """Start a fresh run (offline algorithms such as bc run the offline loop); ``stop`` ends it early,
    kept (see ``Trainer``)."""
    from robo_rl.registry import ALGORITHMS

    offline = getattr(ALGORITHMS.get(cfg.algo.name), "offline", False)
    if offline:
        from robo_rl.runners.offline import OfflineTrainer, check_offline_config

        check_offline_config(cfg)  # (files it cannot find are left to check_inputs)
    check_inputs(cfg)
    if cfg.cluster.address is not None:
        from robo_rl.distributed.rollout import preflight

        preflight(cfg)  # one-line errors before anything starts
    else:
        check_local_cpus(cfg)
        resolve_device(cfg.run.device)  # a GPU this machine lacks: one line before the run directory exists
    run_dir = make_run_dir(cfg)
    with RunLock(run_dir):
        try:
            return (OfflineTrainer(cfg, run_dir, stop=stop) if offline else Trainer(cfg, run_dir, stop=stop)).run()
        except BaseException:
            _discard_if_unstarted(run_dir)
            raise


def _discard_if_unstarted(run_dir: Path) -> None:
    """A run that failed before logging a metrics row or saving a checkpoint (a bad env setting, a
    teacher that does not fit) leaves nothing worth keeping: remove its directory, so that the
    corrected command can be run again under the same run.name."""
    import shutil

    metrics = run_dir / "metrics.csv"
    logged = metrics.is_file() and len(metrics.read_bytes().splitlines()) > 1  # more than the header
    if not logged and not any((run_dir / "checkpoints").glob("step_*")):
        shutil.rmtree(run_dir, ignore_errors=True)


def resume(run_dir: Path, overrides: list[str] | None = None, stop: StopRequest | None = None) -> dict[str, Any]:
    """Continue a killed run from its latest checkpoint with the config it was started with."""
    if not run_dir.is_dir():
        raise RoboRLError(f"run directory '{run_dir}' does not exist; pass a directory created by 'robo-rl train'")
    if not os.access(run_dir, os.W_OK):
        raise RunDirError(f"run directory '{run_dir}' is not writable")
    with RunLock(run_dir):
        cfg = load_run_config(run_dir, overrides)
        resolve_device(cfg.run.device)
        return Trainer(cfg, run_dir, resume=True, write_config=bool(overrides), stop=stop).run()
