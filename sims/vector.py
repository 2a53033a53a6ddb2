"""Subprocess vector env shared by every simulator.

Each worker process owns one single env (or one batched scene) built by a picklable factory. Workers
start by ``spawn`` or from a ``forkserver`` that preloaded the simulator (``sims.procs``); never by a
plain fork of the parent, which deadlocks once torch/SAPIEN/GL are loaded there. The parent sends all
actions, then gathers all results, so the workers step in parallel. Auto-reset happens inside the worker, per the VecEnv contract:
a finished env returns the first obs of its next episode and ``final_obs`` carries its last one.

A worker that dies (crash, SIGKILL) or exceeds ``step_timeout`` is replaced; its episode ends as
``truncated`` with ``info["worker_restarted"][i] = True`` and the run goes on.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from robo_rl.affinity import check_cpus
from robo_rl.contracts import ArraySpec, Observation, StepResult
from robo_rl.errors import ConfigError, RoboRLError, SimulatorUnavailable
from sims.procs import launch_env, worker_context
from sims.shm import SharedArrays, vec_env_layout
from sims.worker import (
    EnvFactory,
    _worker,
    is_batch_factory,
)

log = logging.getLogger(__name__)


class _EnvError(RoboRLError):
    """An env raised inside a worker (the worker itself is alive); the message is its one line."""


class _StartLost(SimulatorUnavailable):
    """A worker that hung or died while building its envs (not an error its envs reported)."""


@dataclass
class _Worker:
    process: Any
    conn: Any


class SubprocVecEnv:
    """B envs in W subprocess workers (``envs_per_worker`` each, the last may hold fewer) behind the
    VecEnv contract. Actions and array observations travel through shared memory.

    Args:
        factories: one picklable zero-arg callable per env (B in all); or one ``BatchEnvFactory``
            per worker, each building a batched scene of its ``num_envs`` rows (B = their sum), as
            ManiSkill's GPU backend does: the same contract, restarts and pipelining either way.
        envs_per_worker: envs hosted (and stepped in turn) by one worker process (single-env factories).
        step_timeout: seconds a worker may take for one step before it is declared hung.
        start_timeout: seconds a worker may take to build its envs.
        worker_env: environment variables set in every worker before the envs are built.
        worker_cpus: CPU ids every worker process is pinned to (None: the parent's mask). Giving
            the env workers cores of their own, and the policy the rest (``robo_rl.affinity.pin_process``), is what
            lets pipelined collection overlap env steps with policy compute on a CPU machine.
        start_method: ``spawn`` or ``forkserver`` (workers forked from a server that imported ``preload``
            once; see ``sims.procs``).
    """

    def __init__(self, factories: list[EnvFactory], step_timeout: float = 60.0, start_timeout: float = 180.0,
                 worker_env: dict[str, str] | None = None, start_method: str = "spawn",
                 envs_per_worker: int = 1, worker_cpus: tuple[int, ...] | None = None,
                 preload: tuple[str, ...] = ()) -> None:
        if not factories:
            raise RoboRLError("SubprocVecEnv needs at least one env factory (num_envs >= 1)")
        if envs_per_worker < 1:
            raise RoboRLError(f"envs_per_worker = {envs_per_worker} must be >= 1")
        self._cpus = None if worker_cpus is None else check_cpus(worker_cpus, "env.worker_cpus")
        self._ctx = worker_context(start_method, preload)
        self._worker_env = dict(worker_env or {})
        self.step_timeout = step_timeout
        self.start_timeout = start_timeout
        batched = [is_batch_factory(f) for f in factories]
        if any(batched) and not all(batched):
            raise RoboRLError("SubprocVecEnv factories must all build single envs or all build batched scenes")
        self.batched = all(batched)
        if self.batched:
            sizes = [int(f.num_envs) for f in factories]  # type: ignore[attr-defined]
            if min(sizes) < 1:
                raise RoboRLError(f"every batched worker needs >= 1 env; got sizes {sizes}")
            starts = np.cumsum([0, *sizes])
            self._rows = [list(range(int(a), int(b))) for a, b in zip(starts[:-1], starts[1:])]
            self._worker_factories = [[f] for f in factories]
        else:
            self._rows = [list(range(s, min(s + envs_per_worker, len(factories))))
                          for s in range(0, len(factories), envs_per_worker)]
            self._worker_factories = [[factories[i] for i in rows] for rows in self._rows]
        self.num_envs = sum(len(r) for r in self._rows)
        self.restarts = 0
        self.start_attempts = 2
        """Replacements tried for a failed worker before the error ends the run: one that hangs or dies
        while building its envs (an oversubscribed machine, a stuck renderer) is tried again once."""
        self.max_error_restarts = 3
        """Consecutive times one worker's env may raise inside step() and be replaced before the error
        ends the run (a deterministic bug must not loop forever; a sporadic simulator error is survived)."""
        self._errors = [0] * len(self._rows)
        # seed of each env's current episode (seed + i + k*B), so a replaced worker continues the sequence
        self._episode_seed: list[int | None] = [None] * self.num_envs
        self._workers: list[_Worker | None] = [None] * len(self._rows)
        self._last_rest: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._pending: tuple[list[int], dict[int, bool], bool] | None = None
        self._closed = False
        self._bufs: SharedArrays | None = None
        try:
            pending = [self._spawn(w) for w in range(len(self._rows))]
            specs = [spec for w, proc in enumerate(pending) for spec in self._await_start(w, proc)]
            self.obs_spec, self.action_spec = specs[0]
            for i, (o, a) in enumerate(specs[1:], start=1):
                if o != self.obs_spec or a != self.action_spec:
                    raise RoboRLError(f"env {i} has obs/action specs that differ from env 0")
            self._bufs = SharedArrays.create(vec_env_layout(self.num_envs, self.obs_spec, self.action_spec))
            for w in range(len(self._rows)):
                self._attach(w)
        except BaseException:
            self.close()
            raise

    @property
    def num_workers(self) -> int:
        return len(self._rows)

    # -- worker lifecycle -------------------------------------------------------------------
    def _attach(self, w: int) -> None:
        self._workers[w].conn.send(("attach", self._bufs.layouts))
        self._recv(w, self.start_timeout)

    def _spawn(self, w: int) -> _Worker:
        parent, child = self._ctx.Pipe()
        rows = self._rows[w]
        env, whole_env, cpus = launch_env(self._ctx, self._worker_env, self._cpus)
        proc = self._ctx.Process(target=_worker,
                                 args=(child, self._worker_factories[w], rows, env, cpus, whole_env),
                                 daemon=True, name=f"robo-rl-env-worker-{w}")
        proc.start()
        child.close()
        worker = _Worker(proc, parent)
        self._workers[w] = worker
        return worker

    def _await_start(self, w: int, worker: _Worker) -> list[tuple[dict[str, ArraySpec], ArraySpec]]:
        if not worker.conn.poll(self.start_timeout):
            raise _StartLost(f"env worker {w} did not start within {self.start_timeout:.0f}s")
        try:
            msg = worker.conn.recv()
        except EOFError:
            raise _StartLost(
                f"env worker {w} died while building its env (exit code {worker.process.exitcode})") from None
        if msg[0] == "error":
            log.debug("env worker %d failed:\n%s", w, msg[2])
            raise SimulatorUnavailable(msg[1])
        return msg[1]

    def _kill(self, w: int) -> None:
        """Stop worker w's process now (a hung one must not write rows while they are read)."""
        old = self._workers[w]
        if old is not None and old.process.is_alive():
            old.process.kill()
            old.process.join(timeout=5)

    def _restart(self, w: int, reason: str = "died or hung", next_episode: bool = True) -> list[dict[str, Any]]:
        """Replace worker w and start new episodes in its envs, seeded from each env's sequence: the next
        seed (seed + i + (k+1)*B) after an interrupted episode, or the current one (``next_episode=False``,
        a reset that had not reached the worker); unseeded without a seeded reset. Returns their
        non-array obs entries (arrays land in shm)."""
        old = self._workers[w]
        if old is not None:
            old.conn.close()
        self._kill(w)
        for attempt in range(1, self.start_attempts + 1):
            self.restarts += 1
            log.warning("env worker %d %s; replacing it (restart #%d)", w, reason, self.restarts)
            try:
                self._await_start(w, self._spawn(w))
                break
            except _StartLost as err:  # hung or died while building: once more; an env error is not retried
                self._workers[w].conn.close()
                self._kill(w)
                if attempt == self.start_attempts:
                    raise SimulatorUnavailable(f"{err} ({attempt} replacements tried)") from None
                reason = f"replacement failed ({err})"
        self._attach(w)
        seeds = []
        for i in self._rows[w]:
            if self._episode_seed[i] is not None and next_episode:
                self._episode_seed[i] += self.num_envs  # the interrupted episode is over
            seeds.append(self._episode_seed[i])
        self._workers[w].conn.send(("reset", seeds if all(s is not None for s in seeds) else [None] * len(seeds)))
        return self._recv(w, self.start_timeout)

    def _recv(self, w: int, timeout: float) -> Any:
        conn = self._workers[w].conn
        if not conn.poll(timeout):
            raise TimeoutError(f"env worker {w} took more than {timeout:.0f}s")
        msg = conn.recv()
        if msg[0] == "error":
            log.debug("env worker %d error:\n%s", w, msg[2])
            raise _EnvError(msg[1])
        return msg[1]

    def _end_episodes_by_restart(self, w: int, pos: dict[int, int], rest: list[dict[str, Any]],
                                 final_rest: list[dict[str, Any]], restarted: np.ndarray, reason: str) -> None:
        """Worker w failed mid-step. Rows whose step finished (``stepped``) keep their reward, flags,
        success and final obs; an episode they had not ended is cut there (truncated, final obs = the
        obs they reached). Rows that did not step end with their last good obs (reward 0, truncated).
        Then the worker is replaced and every row starts a new episode."""
        bufs = self._bufs
        self._kill(w)
        for i in self._rows[w]:
            final_rest[pos[i]] = self._last_rest[i]  # the worker's reply (with the real one) is lost
            if bufs["stepped"][i] and bufs["has_final"][i]:
                continue  # the episode ended in this step: its results and final obs are in shm
            for k in self.obs_spec:
                bufs[f"final/{k}"][i] = bufs[f"obs/{k}"][i]
            bufs["truncated"][i] = True
            bufs["has_final"][i] = True
            if not bufs["stepped"][i]:
                bufs["reward"][i] = 0.0
                bufs["terminated"][i] = False
                bufs["success"][i] = False
        for i, r in zip(self._rows[w], self._restart(w, reason)):
            rest[pos[i]] = r or {}
            restarted[pos[i]] = True

    # -- VecEnv contract ----------------------------------------------------------------------
    def _gather_obs(self, prefix: str, rest: list[dict[str, Any]], rows: np.ndarray | None = None) -> Observation:
        """Copy the shared (B, ...) arrays out (the buffers are reused next step) and add the
        per-env non-array entries (e.g. instruction strings) as lists; ``rows`` selects envs
        (``rest`` then holds one entry per selected env)."""
        if rows is None:
            out: Observation = {k: self._bufs[f"{prefix}/{k}"].copy() for k in self.obs_spec}
        else:
            out = {k: self._bufs[f"{prefix}/{k}"][rows] for k in self.obs_spec}
        keys = {k for r in rest if r for k in r}
        for key in sorted(keys):
            out[key] = [r.get(key) if r else None for r in rest]
        return out

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        """Reset every env; env i is seeded ``seed + i``."""
        return self.reset_each([None if seed is None else seed + i for i in range(self.num_envs)])

    def reset_each(self, seeds: list[int | None]) -> tuple[Observation, dict[str, Any]]:
        """Reset every env, env i seeded ``seeds[i]`` (equal seeds: the same initial state, e.g. a group of
        rollouts from one start)."""
        if self._pending is not None:
            raise RoboRLError("reset() while a step_async() is pending; call step_wait() first")
        if len(seeds) != self.num_envs:
            raise RoboRLError(f"reset_each got {len(seeds)} seeds for {self.num_envs} envs")
        self._episode_seed = list(seeds)
        sent = {}
        for w, rows in enumerate(self._rows):
            try:
                self._workers[w].conn.send(("reset", [self._episode_seed[i] for i in rows]))
                sent[w] = True
            except (BrokenPipeError, OSError):
                sent[w] = False
        rest: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for w, rows in enumerate(self._rows):
            try:
                if not sent[w]:
                    raise EOFError
                replies = self._recv(w, self.start_timeout)
            except (EOFError, OSError, TimeoutError):  # a worker that died between episodes: replace it
                replies = self._restart(w, next_episode=False)
            for i, r in zip(rows, replies):
                rest[i] = r
        self._last_rest = rest
        return self._gather_obs("obs", rest), {}

    @property
    def worker_rows(self) -> list[list[int]]:
        """The env rows each worker hosts (groups for pipelined stepping)."""
        return [list(r) for r in self._rows]

    def step(self, actions: np.ndarray) -> StepResult:
        """``actions`` (B, A), or action chunks (B, H, A): each env runs its chunk's steps in turn and
        stops at its episode's end; then ``reward`` is the sum over the executed steps, ``success``
        whether any step succeeded, and ``info["chunk_steps"]`` (B,) how many steps ran."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: np.ndarray, workers: list[int] | None = None) -> None:
        """Start stepping the envs of ``workers`` (default: all) with their rows of ``actions`` (B, ...);
        ``step_wait`` returns their results. Other workers stay idle, so the caller can compute their
        next actions meanwhile (pipelined collection)."""
        if self._pending is not None:
            raise RoboRLError("step_async() called again before step_wait()")
        actions = np.asarray(actions, dtype=np.float32)
        bufs = self._bufs
        want = bufs["actions"].shape
        chunked = actions.ndim == 3
        if (actions.shape[:1] + actions.shape[2:] if chunked else actions.shape) != want or (chunked and not actions.shape[1]):
            raise RoboRLError(f"step() got actions of shape {actions.shape}; expected {want} or chunks "
                              f"({want[0]}, H, {', '.join(map(str, want[1:]))}) with H >= 1")
        ws = list(range(len(self._rows))) if workers is None else sorted(set(workers))
        rows = [i for w in ws for i in self._rows[w]]
        bufs["stepped"][rows] = False
        if not chunked:
            bufs["actions"][rows] = actions[rows]
        sent: dict[int, bool] = {}
        for w in ws:
            try:
                self._workers[w].conn.send(("step", [actions[i] for i in self._rows[w]] if chunked else None))
                sent[w] = True
            except (BrokenPipeError, OSError):
                sent[w] = False
        self._pending = (ws, sent, chunked)

    def step_wait(self) -> StepResult:
        """Results of the pending ``step_async``: all B envs, or (for a subset of workers) their rows in
        order, listed in ``info["rows"]``."""
        if self._pending is None:
            raise RoboRLError("step_wait() without a pending step_async()")
        ws, sent, chunked = self._pending
        self._pending = None
        bufs = self._bufs
        rows = [i for w in ws for i in self._rows[w]]
        pos = {i: j for j, i in enumerate(rows)}
        restarted = np.zeros(len(rows), bool)
        rest: list[dict[str, Any]] = [{} for _ in rows]
        final_rest: list[dict[str, Any]] = [{} for _ in rows]
        extras: dict[str, list[Any]] = {}
        failure: str | None = None
        for w in ws:
            reason = "died or hung"
            try:
                if not sent[w]:
                    raise EOFError
                replies = self._recv(w, self.step_timeout)
                self._errors[w] = 0
            except (EOFError, OSError, TimeoutError, _EnvError) as err:
                if isinstance(err, _EnvError):
                    self._errors[w] += 1
                    reason = f"raised in step ({err})"
                    if self._errors[w] >= self.max_error_restarts:
                        failure = f"env worker {w}: {err} ({self._errors[w]} times in a row; not replaced again)"
                        continue  # read the other workers' replies first, so the VecEnv stays in step
                self._end_episodes_by_restart(w, pos, rest, final_rest, restarted, reason)
                continue
            for i, reply in zip(self._rows[w], replies):
                if reply is not None:
                    r, fr, extra = reply
                    rest[pos[i]], final_rest[pos[i]] = r or {}, fr or {}
                    for k, v in extra.items():
                        extras.setdefault(k, [None] * len(rows))[pos[i]] = v
        for i in rows:
            self._last_rest[i] = rest[pos[i]]
            if bufs["has_final"][i] and not restarted[pos[i]] and self._episode_seed[i] is not None:
                self._episode_seed[i] += self.num_envs  # the env's own reset took the next seed
        if failure is not None:  # after the bookkeeping, so a caller that goes on stays consistent
            raise RoboRLError(failure)
        full = len(rows) == self.num_envs
        idx = None if full else np.array(rows)
        sel = slice(None) if full else idx
        info: dict[str, Any] = {"success": bufs["success"][sel].copy(), "worker_restarted": restarted}
        info.update(extras)
        if chunked:
            info["chunk_steps"] = np.array([n or 0 for n in extras.get("chunk_steps", [0] * len(rows))], np.int64)
        if not full:
            info["rows"] = idx
        if bufs["has_final"][sel].any():
            info["final_obs"] = self._gather_obs("final", final_rest, idx)
        return StepResult(self._gather_obs("obs", rest, idx), bufs["reward"][sel].copy(), bufs["terminated"][sel].copy(),
                          bufs["truncated"][sel].copy(), info)

    def render(self) -> np.ndarray:
        """(B, H, W, 3) frames, one per env."""
        sent, frames, broken = [], {}, []
        env_error: RoboRLError | None = None
        for w in range(len(self._rows)):
            try:
                self._workers[w].conn.send(("render", None))
                sent.append(w)
            except (BrokenPipeError, OSError):
                broken.append(w)
        for w in sent:  # read every reply, so no frame is later taken for a step's reply
            try:
                frames[w] = list(self._recv(w, self.step_timeout))
            except (EOFError, OSError, TimeoutError):
                broken.append(w)
            except _EnvError as err:
                env_error = env_error or err
        for w in broken:  # the next step() sees it gone and replaces it, ending its episodes
            self._kill(w)
        if broken:
            raise RoboRLError(f"env worker(s) {sorted(broken)} died or hung while rendering; the next step() or "
                              "reset() replaces them")
        if env_error is not None:
            raise env_error
        return np.stack([f for w in range(len(self._rows)) for f in frames[w]])

    def worker_pids(self) -> list[int]:
        """PID of the worker hosting each env (length B)."""
        return [self._workers[w].process.pid for w, rows in enumerate(self._rows) for _ in rows]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            if w is None:
                continue
            try:
                if w.process.is_alive():
                    w.conn.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + 10
        for w in self._workers:
            if w is None:
                continue
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout=5)
            w.conn.close()
        if self._bufs is not None:
            self._bufs.close()
            self._bufs = None

    def __enter__(self) -> SubprocVecEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; never raise from a finalizer
        try:
            self.close()
        except Exception:
            pass


def render_threads(num_workers: int, cpus: tuple[int, ...] | None = None) -> str:
    """llvmpipe/lavapipe threads per worker: the cores the workers may use (``cpus``, else all of
    this process's) shared among the workers."""
    n = len(cpus) if cpus is not None else len(os.sched_getaffinity(0))
    return str(max(1, n // max(1, num_workers)))


class VecEnvWrapper:
    """Forwards the VecEnv contract to ``self._impl`` (a SubprocVecEnv or a batched GPU env);
    simulator adapters subclass it and only build ``_impl``, ``obs_spec`` and ``action_spec``."""

    _impl: Any
    num_envs: int

    @property
    def restarts(self) -> int:
        """Env workers replaced so far."""
        return getattr(self._impl, "restarts", 0)

    @property
    def worker_pids(self) -> list[int]:
        return self._impl.worker_pids() if hasattr(self._impl, "worker_pids") else []

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        return self._impl.reset(seed)

    def reset_each(self, seeds: list[int | None]) -> tuple[Observation, dict[str, Any]]:
        """Reset env i with ``seeds[i]`` (``robo_rl.contracts.PerEnvReset``)."""
        if not hasattr(self._impl, "reset_each"):
            raise ConfigError(f"{type(self).__name__} with this backend resets its envs only together "
                              "(seed + i); per-env seeds need the CPU subprocess workers (backend: cpu)")
        return self._impl.reset_each(seeds)

    def step(self, actions: np.ndarray) -> StepResult:
        return self._impl.step(actions)

    def step_async(self, actions: np.ndarray, workers: list[int] | None = None) -> None:
        self._impl.step_async(actions, workers)

    def step_wait(self) -> StepResult:
        return self._impl.step_wait()

    @property
    def worker_rows(self) -> list[list[int]]:
        return self._impl.worker_rows

    @property
    def num_workers(self) -> int:
        return len(self._impl.worker_rows)

    def render(self) -> np.ndarray:
        return self._impl.render()

    def close(self) -> None:
        self._impl.close()
