"""Subprocess vector env shared by every simulator.

Each worker process (``spawn`` start method: fork deadlocks once torch/SAPIEN/GL are loaded) owns
one single env built by a picklable factory. The parent sends all actions, then gathers all results,
so the workers step in parallel. Auto-reset happens inside the worker, per the VecEnv contract:
a finished env returns the first obs of its next episode and ``final_obs`` carries its last one.

A worker that dies (crash, SIGKILL) or exceeds ``step_timeout`` is replaced; its episode ends as
``truncated`` with ``info["worker_restarted"][i] = True`` and the run goes on.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from robo_rl.affinity import check_cpus
from robo_rl.contracts import ArraySpec, Observation, StepResult
from robo_rl.errors import RoboRLError, SimulatorUnavailable
from sims.shm import SharedArrays, vec_env_layout

log = logging.getLogger(__name__)


class SingleEnv(Protocol):
    """One unbatched env as a worker sees it. Observations are dicts of numpy arrays without a
    batch dim (``state`` (D,), ``rgb`` (V, H, W, 3)), plus optional ``instruction`` str."""

    obs_spec: dict[str, ArraySpec]
    action_spec: ArraySpec

    def reset(self, seed: int | None = None) -> dict[str, Any]: ...

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Return (obs, reward, terminated, truncated, info with 'success': bool)."""
        ...

    def render(self) -> np.ndarray: ...

    def close(self) -> None: ...


EnvFactory = Callable[[], SingleEnv]


@runtime_checkable
class BlindStepEnv(Protocol):
    """Optional capability of a SingleEnv: a step that skips producing the observation (no camera
    render). Inside an action chunk only the last step's observation reaches the policy, so a worker
    steps the others blind and asks for the observation once (``observe``). Physics, rewards,
    termination and the observation at the chunk's end must equal those of plain ``step`` calls."""

    def step_blind(self, action: np.ndarray) -> tuple[float, bool, bool, dict[str, Any]]:
        """``step`` without its observation: (reward, terminated, truncated, info with 'success')."""
        ...

    def observe(self) -> dict[str, Any]:
        """The observation of the current state, as ``step`` would have returned it."""
        ...


class BatchEnv(Protocol):
    """``num_envs`` envs in one batched scene (e.g. a ManiSkill ``physx_cuda`` scene) as one worker
    hosts it. Arrays carry a leading (n,) dim; non-array entries (``instruction``) are lists of n.
    No auto-reset: the worker resets finished rows with ``reset_rows`` (at a chunk's end)."""

    num_envs: int
    obs_spec: dict[str, ArraySpec]
    """Per-row specs (no batch dim), as a SingleEnv's."""
    action_spec: ArraySpec

    def reset(self, seeds: list[int | None]) -> dict[str, Any]:
        """Reset all n rows, row j with ``seeds[j]``; returns the (n, ...) observation."""
        ...

    def reset_rows(self, rows: np.ndarray) -> dict[str, Any]:
        """Reset only ``rows`` (indices into 0..n-1); returns the observation of all n rows."""
        ...

    def step(self, actions: np.ndarray) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """``actions`` (n, A) -> (obs, reward (n,), terminated (n,), truncated (n,), info with 'success' (n,))."""
        ...

    def render(self) -> np.ndarray:
        """(n, H, W, 3) frames."""
        ...

    def close(self) -> None: ...


class BatchEnvFactory(Protocol):
    """Picklable zero-arg callable building a BatchEnv of ``num_envs`` rows (one worker's worth)."""

    num_envs: int

    def __call__(self) -> BatchEnv: ...


def is_batch_factory(f: Any) -> bool:
    """Whether ``f`` builds a BatchEnv (it says how many rows) rather than one SingleEnv."""
    return isinstance(getattr(f, "num_envs", None), int)


def _write_obs(bufs: SharedArrays, prefix: str, i: int, obs: dict[str, Any]) -> dict[str, Any]:
    """Write array entries of ``obs`` into row i of the shared buffers; return the other entries."""
    rest = {}
    for k, v in obs.items():
        arr = bufs.arrays.get(f"{prefix}/{k}")
        if arr is None:
            rest[k] = v
        else:
            arr[i] = v
    return rest


def _step_one(env: SingleEnv, bufs: SharedArrays, i: int, chunk: np.ndarray | None = None) -> tuple | None:
    """Step env row i (auto-reset on episode end); arrays go to shm, the rest is returned.

    ``chunk`` (H, A): run up to H actions in turn, stopping at the episode's end (the rest of the
    chunk is dropped); the reward is the sum over the executed steps, success is true if any step
    succeeded, and ``chunk_steps`` (the number executed) is returned with the info. An env that can
    step blind (``BlindStepEnv``) renders only the observation the chunk ends on."""
    if chunk is None:
        obs, reward, terminated, truncated, info = env.step(bufs["actions"][i].copy())
    else:
        reward, succeeded, n = 0.0, False, 0
        blind = env.step_blind if isinstance(env, BlindStepEnv) else None
        for a in chunk:
            if blind is not None and n < len(chunk) - 1:
                obs = None
                r, terminated, truncated, info = blind(np.array(a, np.float32))
            else:
                obs, r, terminated, truncated, info = env.step(np.array(a, np.float32))
            reward, n = reward + float(r), n + 1
            succeeded = succeeded or bool(info.get("success", False))
            if terminated or truncated:
                break
        if obs is None:  # the episode ended on a blind step
            obs = env.observe()
        info = {**info, "success": succeeded, "chunk_steps": n}
    final_rest = None
    done = bool(terminated or truncated)
    if done:
        final_rest = _write_obs(bufs, "final", i, obs)
    bufs["reward"][i] = reward
    bufs["terminated"][i] = terminated
    bufs["truncated"][i] = truncated
    bufs["success"][i] = bool(info.get("success", False))
    bufs["has_final"][i] = done
    bufs["stepped"][i] = True  # the step's results are in (an auto-reset that raises below keeps them)
    if done:
        obs = env.reset()
    rest = _write_obs(bufs, "obs", i, obs)
    extra = {k: v for k, v in info.items() if k != "success"}
    return (rest, final_rest, extra) if (rest or final_rest or extra) else None


def _rows_rest(obs: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The non-array entries of a batched obs (lists of n) as one dict per row."""
    keys = [k for k, v in obs.items() if not isinstance(v, np.ndarray)]
    return [{k: obs[k][j] for k in keys} for j in range(n)]


def _write_rows(bufs: SharedArrays, prefix: str, rows: list[int], obs: dict[str, Any],
                sel: np.ndarray | None = None) -> list[dict[str, Any]]:
    """Write a batched obs into the shm rows ``rows`` (only the rows where ``sel``); returns per-row rests."""
    idx = np.arange(len(rows)) if sel is None else np.flatnonzero(sel)
    target = np.asarray(rows)[idx]
    for k, v in obs.items():
        arr = bufs.arrays.get(f"{prefix}/{k}")
        if arr is not None:
            arr[target] = np.asarray(v)[idx]
    return _rows_rest({k: v for k, v in obs.items() if f"{prefix}/{k}" not in bufs.arrays}, len(rows))


def _step_batch(env: BatchEnv, bufs: SharedArrays, rows: list[int], chunks: list[np.ndarray] | None) -> list:
    """Step a batched worker's n rows, with the per-row semantics of ``_step_one``: with chunks
    (n, H, A) every row runs its actions in turn, and a row whose episode ends stops counting there
    (reward, success, ``chunk_steps``, its final obs); the scene still steps it to the chunk's end,
    then the finished rows are reset together."""
    n = len(rows)
    acts = bufs["actions"][rows][:, None] if chunks is None else np.stack(chunks).astype(np.float32)
    reward, steps = np.zeros(n, np.float64), np.zeros(n, np.int64)
    term, trunc, success, done = (np.zeros(n, bool) for _ in range(4))
    finals: list[dict[str, Any]] = [{} for _ in range(n)]
    extra_rows: list[dict[str, Any]] = [{} for _ in range(n)]
    for h in range(acts.shape[1]):
        obs, r, te, tr, info = env.step(acts[:, h])
        live = ~done
        reward[live] += np.asarray(r, np.float64)[live]
        steps[live] += 1
        success[live] |= np.asarray(info["success"], bool)[live]
        ended = live & (np.asarray(te, bool) | np.asarray(tr, bool))
        term[ended], trunc[ended] = np.asarray(te, bool)[ended], np.asarray(tr, bool)[ended]
        if ended.any():
            rests = _write_rows(bufs, "final", rows, obs, ended)
            for j in np.flatnonzero(ended):
                finals[j] = rests[j]
            for k, v in info.items():
                if k != "success" and isinstance(v, (list, np.ndarray)) and np.ndim(v) > 0 and len(v) == n:
                    for j in np.flatnonzero(ended):
                        extra_rows[j][k] = v[j]
        done |= ended
        if done.all():
            break
    if done.any():
        obs = env.reset_rows(np.flatnonzero(done))
    rest = _write_rows(bufs, "obs", rows, obs)
    bufs["reward"][rows] = reward
    bufs["terminated"][rows] = term
    bufs["truncated"][rows] = trunc
    bufs["success"][rows] = success
    bufs["has_final"][rows] = done
    bufs["stepped"][rows] = True
    out = []
    for j in range(n):
        extra = {**extra_rows[j], **({"chunk_steps": int(steps[j])} if chunks is not None else {})}
        out.append((rest[j], finals[j] if done[j] else None, extra) if (rest[j] or done[j] or extra) else None)
    return out


def _reply(conn: Any, msg: tuple) -> bool:
    """Send one reply; False when the parent has gone (closed pipe), so the worker exits quietly instead of
    printing a BrokenPipeError traceback for a parent that stopped or killed it mid-start."""
    try:
        conn.send(msg)
        return True
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return False


def _worker(conn: Any, factories: list[EnvFactory], rows: list[int], worker_env: dict[str, str],
            cpus: tuple[int, ...] | None = None) -> None:
    """Worker loop hosting ``len(rows)`` envs (env j writes shm row ``rows[j]``), stepped in turn.
    ``cpus``: pin this process to these CPU ids first, so every thread the simulator starts later
    (physics, llvmpipe) inherits the mask. Messages: ("attach", layouts) once, then
    ("step"|"reset"|"render"|"close", data). Replies are ("ok", small payload per env) or
    ("error", one line, traceback)."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    os.environ.update(worker_env)
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover - torch is a core dependency
        pass
    try:
        envs = [f() for f in factories]
    except BaseException as err:  # report any failure to the parent as one line
        msg = str(err) if isinstance(err, RoboRLError) else f"{type(err).__name__}: {err}"
        _reply(conn, ("error", msg.splitlines()[0] if msg else type(err).__name__, traceback.format_exc()))
        conn.close()
        return
    bufs: SharedArrays | None = None
    batch = envs[0] if len(envs) == 1 and is_batch_factory(factories[0]) else None
    alive = _reply(conn, ("ok", [(e.obs_spec, e.action_spec) for e in envs] * (len(rows) if batch else 1)))
    while alive:
        try:
            cmd, data = conn.recv()
        except (EOFError, ConnectionResetError, KeyboardInterrupt):
            break
        reply: tuple
        try:
            if batch is not None and cmd in ("step", "reset", "render"):
                if cmd == "step":
                    reply = ("ok", _step_batch(batch, bufs, rows, data))
                elif cmd == "reset":
                    reply = ("ok", _write_rows(bufs, "obs", rows, batch.reset(list(data))))
                else:
                    reply = ("ok", list(batch.render()))
            elif cmd == "step":
                chunks = [None] * len(envs) if data is None else data
                reply = ("ok", [_step_one(e, bufs, i, c) for e, i, c in zip(envs, rows, chunks)])
            elif cmd == "reset":
                reply = ("ok", [_write_obs(bufs, "obs", i, e.reset(seed=sd)) for e, i, sd in zip(envs, rows, data)])
            elif cmd == "attach":
                bufs = SharedArrays.attach(data)
                reply = ("ok", None)
            elif cmd == "render":
                reply = ("ok", [e.render() for e in envs])
            elif cmd == "close":
                for e in envs:
                    e.close()
                _reply(conn, ("ok", None))
                break
            else:
                reply = ("error", f"unknown worker command {cmd!r}", "")
        except BaseException as err:
            reply = ("error", f"{type(err).__name__}: {err}", traceback.format_exc())
        alive = _reply(conn, reply)
    if bufs is not None:
        bufs.close()
    conn.close()


class _EnvError(RoboRLError):
    """An env raised inside a worker (the worker itself is alive); the message is its one line."""


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
    """

    def __init__(self, factories: list[EnvFactory], step_timeout: float = 60.0, start_timeout: float = 180.0,
                 worker_env: dict[str, str] | None = None, start_method: str = "spawn",
                 envs_per_worker: int = 1, worker_cpus: tuple[int, ...] | None = None) -> None:
        if not factories:
            raise RoboRLError("SubprocVecEnv needs at least one env factory (num_envs >= 1)")
        if envs_per_worker < 1:
            raise RoboRLError(f"envs_per_worker = {envs_per_worker} must be >= 1")
        self._cpus = None if worker_cpus is None else check_cpus(worker_cpus, "env.worker_cpus")
        self._ctx = mp.get_context(start_method)
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
        proc = self._ctx.Process(target=_worker,
                                 args=(child, self._worker_factories[w], rows, self._worker_env, self._cpus),
                                 daemon=True, name=f"robo-rl-env-worker-{w}")
        proc.start()
        child.close()
        worker = _Worker(proc, parent)
        self._workers[w] = worker
        return worker

    def _await_start(self, w: int, worker: _Worker) -> list[tuple[dict[str, ArraySpec], ArraySpec]]:
        if not worker.conn.poll(self.start_timeout):
            raise SimulatorUnavailable(f"env worker {w} did not start within {self.start_timeout:.0f}s")
        try:
            msg = worker.conn.recv()
        except EOFError:
            raise SimulatorUnavailable(
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
        self.restarts += 1
        log.warning("env worker %d %s; replaced it (restart #%d)", w, reason, self.restarts)
        self._await_start(w, self._spawn(w))
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
        if self._pending is not None:
            raise RoboRLError("reset() while a step_async() is pending; call step_wait() first")
        self._episode_seed = [None if seed is None else seed + i for i in range(self.num_envs)]
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
