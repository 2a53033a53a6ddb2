"""How env worker processes start.

``spawn`` runs a fresh interpreter per worker: each one imports its simulator again (ManiSkill: ~4.4 s of
``import mani_skill`` per worker on a 2-core AMD EPYC). ``forkserver`` forks every worker from one server
process that imported the simulator once (``preload``) and nothing else: it has run no torch op, opened
no GL/Vulkan context and holds no threads, which is what makes forking it safe where forking the trainer
(torch's thread pool, SAPIEN, a renderer) deadlocks. The server starts with the first worker and lives as
long as the process that started it; it is shared by every vector env of that process.

A forked worker would see the server's environment and CPU mask (those of the moment the server
started); ``launch_env`` hands it the parent's current ones, so it starts as a spawned worker would.
What a preloaded module read from the environment on import (ManiSkill's ``MS_ASSET_DIR``) keeps the
value of the server's start: set such variables before the first env of the process starts.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.context import BaseContext

START_METHODS = ("spawn", "forkserver")

_preload: list[str] = []


def worker_context(start_method: str, preload: tuple[str, ...] = ()) -> BaseContext:
    """The multiprocessing context for env workers. ``preload``: modules the fork server imports when it
    starts (ignored once it runs; a worker imports what the server lacks itself). A module that fails to
    import there is skipped by the server, and its worker reports the error on import, as under spawn."""
    if start_method not in START_METHODS:
        raise ValueError(f"env worker start method {start_method!r} is not one of {', '.join(START_METHODS)}")
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        for name in preload:
            if name not in _preload:
                _preload.append(name)
        ctx.set_forkserver_preload(list(_preload))
    return ctx


def launch_env(ctx: BaseContext, worker_env: dict[str, str],
               cpus: tuple[int, ...] | None) -> tuple[dict[str, str], bool, tuple[int, ...] | None]:
    """(environment to set, whether it replaces the worker's whole environment, CPU mask) for a worker
    started by ``ctx``: under forkserver the parent's environment and mask now, with ``worker_env`` on top;
    under spawn (which inherits both) just ``worker_env`` and ``cpus``."""
    if ctx.get_start_method() != "forkserver":
        return dict(worker_env), False, cpus
    mask = cpus if cpus is not None else tuple(sorted(os.sched_getaffinity(0)))
    return {**os.environ, **worker_env}, True, mask
