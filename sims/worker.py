"""What runs inside a ``SubprocVecEnv`` worker process: the env protocols a simulator implements (one
``SingleEnv`` per worker, or a ``BatchEnv`` of several envs in one scene) and the worker loop that steps
them, writes observations to shared memory, auto-resets and reports errors to the parent."""

from __future__ import annotations

import os
import signal
import traceback
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from robo_rl.contracts import ArraySpec
from robo_rl.errors import RoboRLError
from sims.shm import SharedArrays


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
            cpus: tuple[int, ...] | None = None, whole_env: bool = False) -> None:
    """Worker loop hosting ``len(rows)`` envs (env j writes shm row ``rows[j]``), stepped in turn.
    ``cpus``: pin this process to these CPU ids first, so every thread the simulator starts later
    (physics, llvmpipe) inherits the mask. ``whole_env``: ``worker_env`` is the whole environment (a worker
    forked from a fork server takes its parent's, not the server's). Messages: ("attach", layouts) once, then
    ("step"|"reset"|"render"|"close", data). Replies are ("ok", small payload per env) or
    ("error", one line, traceback)."""
    # the parent owns this process's lifetime (it closes the pipe): a Ctrl-C at the terminal reaches the whole
    # process group, and the parent's own handling (finish the iteration, save) needs its envs alive
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    if whole_env:
        os.environ.clear()
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
