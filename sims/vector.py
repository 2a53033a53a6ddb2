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
from typing import Any, Protocol

import numpy as np

from robo_rl.contracts import ArraySpec, Observation, StepResult
from robo_rl.errors import RoboRLError, SimulatorUnavailable

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


def _worker(conn: Any, factory: EnvFactory, worker_env: dict[str, str]) -> None:
    os.environ.update(worker_env)
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover - torch is a core dependency
        pass
    try:
        env = factory()
    except BaseException as err:  # report any failure to the parent as one line
        msg = str(err) if isinstance(err, RoboRLError) else f"{type(err).__name__}: {err}"
        conn.send(("error", msg.splitlines()[0] if msg else type(err).__name__, traceback.format_exc()))
        conn.close()
        return
    conn.send(("ok", (env.obs_spec, env.action_spec)))
    while True:
        try:
            cmd, data = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        try:
            if cmd == "step":
                obs, reward, terminated, truncated, info = env.step(data)
                final_obs = None
                if terminated or truncated:
                    final_obs = obs
                    obs = env.reset()
                conn.send(("ok", (obs, reward, terminated, truncated, info, final_obs)))
            elif cmd == "reset":
                conn.send(("ok", env.reset(seed=data)))
            elif cmd == "render":
                conn.send(("ok", env.render()))
            elif cmd == "close":
                env.close()
                conn.send(("ok", None))
                break
            else:
                conn.send(("error", f"unknown worker command {cmd!r}", ""))
        except BaseException as err:
            conn.send(("error", f"{type(err).__name__}: {err}", traceback.format_exc()))
    conn.close()


@dataclass
class _Worker:
    process: Any
    conn: Any


class SubprocVecEnv:
    """B subprocess workers, one env each, behind the VecEnv contract.

    Args:
        factories: one picklable zero-arg callable per env.
        step_timeout: seconds a worker may take for one step before it is declared hung.
        start_timeout: seconds a worker may take to build its env.
        worker_env: environment variables set in every worker before the env is built.
    """

    def __init__(self, factories: list[EnvFactory], step_timeout: float = 60.0, start_timeout: float = 180.0,
                 worker_env: dict[str, str] | None = None, start_method: str = "spawn") -> None:
        if not factories:
            raise RoboRLError("SubprocVecEnv needs at least one env factory (num_envs >= 1)")
        self._ctx = mp.get_context(start_method)
        self._factories = factories
        self._worker_env = dict(worker_env or {})
        self.step_timeout = step_timeout
        self.start_timeout = start_timeout
        self.num_envs = len(factories)
        self.restarts = 0
        self._workers: list[_Worker | None] = [None] * self.num_envs
        self._last_obs: list[dict[str, Any] | None] = [None] * self.num_envs
        self._seeds: list[int | None] = [None] * self.num_envs
        self._closed = False
        try:
            pending = [self._spawn(i) for i in range(self.num_envs)]
            specs = [self._await_start(i, w) for i, w in enumerate(pending)]
        except BaseException:
            self.close()
            raise
        self.obs_spec, self.action_spec = specs[0]

    # -- worker lifecycle -------------------------------------------------------------------
    def _spawn(self, i: int) -> _Worker:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child, self._factories[i], self._worker_env),
                                 daemon=True, name=f"robo-rl-env-{i}")
        proc.start()
        child.close()
        worker = _Worker(proc, parent)
        self._workers[i] = worker
        return worker

    def _await_start(self, i: int, worker: _Worker) -> tuple[dict[str, ArraySpec], ArraySpec]:
        if not worker.conn.poll(self.start_timeout):
            raise SimulatorUnavailable(f"env worker {i} did not start within {self.start_timeout:.0f}s")
        try:
            msg = worker.conn.recv()
        except EOFError:
            raise SimulatorUnavailable(
                f"env worker {i} died while building its env (exit code {worker.process.exitcode})") from None
        if msg[0] == "error":
            log.debug("env worker %d failed:\n%s", i, msg[2])
            raise SimulatorUnavailable(msg[1])
        return msg[1]

    def _restart(self, i: int, seed: int | None) -> dict[str, Any]:
        old = self._workers[i]
        if old is not None:
            old.conn.close()
            if old.process.is_alive():
                old.process.kill()
            old.process.join(timeout=5)
        self.restarts += 1
        log.warning("env worker %d died or hung; replaced it (restart #%d)", i, self.restarts)
        self._await_start(i, self._spawn(i))
        w = self._workers[i]
        w.conn.send(("reset", seed))
        return self._recv(i, self.start_timeout)

    def _recv(self, i: int, timeout: float) -> Any:
        w = self._workers[i]
        if not w.conn.poll(timeout):
            raise TimeoutError(f"env worker {i} took more than {timeout:.0f}s")
        msg = w.conn.recv()
        if msg[0] == "error":
            log.debug("env worker %d error:\n%s", i, msg[2])
            raise RoboRLError(f"env worker {i}: {msg[1]}")
        return msg[1]

    # -- VecEnv contract ----------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        self._seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        for i, w in enumerate(self._workers):
            w.conn.send(("reset", self._seeds[i]))
        obs = [self._recv(i, self.start_timeout) for i in range(self.num_envs)]
        self._last_obs = obs
        return stack_obs(obs), {}

    def step(self, actions: np.ndarray) -> StepResult:
        actions = np.asarray(actions, dtype=np.float32)
        if actions.shape[0] != self.num_envs:
            raise RoboRLError(f"step() got actions of shape {actions.shape}; expected leading dim {self.num_envs}")
        sent = []
        for i, w in enumerate(self._workers):
            try:
                w.conn.send(("step", actions[i]))
                sent.append(True)
            except (BrokenPipeError, OSError):
                sent.append(False)
        obs, rew, term, trunc, success = [], np.zeros(self.num_envs, np.float32), [], [], []
        finals: dict[int, dict[str, Any]] = {}
        restarted = np.zeros(self.num_envs, bool)
        extra_info: list[dict[str, Any]] = []
        for i in range(self.num_envs):
            try:
                if not sent[i]:
                    raise EOFError
                o, r, te, tr, info, final = self._recv(i, self.step_timeout)
            except (EOFError, OSError, TimeoutError):
                restarted[i] = True
                finals[i] = self._last_obs[i]
                o, r, te, tr, info = self._restart(i, None), 0.0, False, True, {"success": False}
                final = finals[i]
            obs.append(o)
            rew[i] = r
            term.append(bool(te))
            trunc.append(bool(tr))
            success.append(bool(info.get("success", False)))
            extra_info.append(info)
            if final is not None:
                finals[i] = final
        self._last_obs = obs
        out_info: dict[str, Any] = {"success": np.asarray(success, bool), "worker_restarted": restarted}
        if finals:
            out_info["final_obs"] = stack_obs([finals.get(i, obs[i]) for i in range(self.num_envs)])
        return StepResult(stack_obs(obs), rew, np.asarray(term, bool), np.asarray(trunc, bool), out_info)

    def render(self) -> np.ndarray:
        for w in self._workers:
            w.conn.send(("render", None))
        return np.stack([self._recv(i, self.step_timeout) for i in range(self.num_envs)])

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

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

    def __enter__(self) -> SubprocVecEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; never raise from a finalizer
        try:
            self.close()
        except Exception:
            pass


def stack_obs(items: list[dict[str, Any]]) -> Observation:
    """Stack per-env observation dicts into one batched Observation (lists for strings)."""
    out: Observation = {}
    for key in items[0]:
        vals = [it[key] for it in items]
        out[key] = list(vals) if isinstance(vals[0], str) else np.stack(vals)
    return out
