"""CPU affinity: give env worker processes and the policy/learner process cores of their own.

On a CPU machine the env workers and the policy otherwise share every core, so the pipelined
collector (``run.pipeline``) has nothing to overlap: both halves of a step compete for the same
cores. Pinning them apart is the CPU analogue of envs on the CPU and the policy on a GPU.
Linux only (``os.sched_setaffinity``).
"""

from __future__ import annotations

import os

from robo_rl.errors import ConfigError

_unpinned: tuple[int, ...] | None = None  # this process's CPU mask before ``pin_process`` narrowed it


def available_cpus() -> tuple[int, ...]:
    """CPU ids this process could run on before any ``pin_process`` (children may use all of them)."""
    return _unpinned if _unpinned is not None else tuple(sorted(os.sched_getaffinity(0)))


def check_cpus(cpus: tuple[int, ...] | list[int], key: str) -> tuple[int, ...]:
    """``cpus`` as a sorted tuple, if every id is one this process may run on; else a one-line
    ConfigError naming ``key``, the bad ids and the allowed ones."""
    allowed = list(available_cpus())
    ids = tuple(sorted(set(int(c) for c in cpus)))
    bad = [c for c in ids if c not in allowed]
    if not ids or bad:
        what = "is empty" if not ids else f"names CPUs {bad} this process cannot run on"
        raise ConfigError(f"config key '{key}' = {list(cpus)} {what}; allowed CPU ids: {allowed}")
    return ids


def unpin_process() -> None:
    """Give every thread of this process back the CPU mask it had before ``pin_process`` (a run that ends,
    or is refused, leaves its caller as it found it)."""
    global _unpinned
    if _unpinned is not None:
        _set_every_thread(_unpinned)
        _unpinned = None


def pin_process(cpus: tuple[int, ...] | list[int], key: str = "run.policy_cpus") -> tuple[int, ...]:
    """Pin every thread of the calling process, and so every thread it starts later (torch's pool),
    to ``cpus``; returns the checked ids."""
    global _unpinned
    ids = check_cpus(cpus, key)
    if _unpinned is None:
        _unpinned = available_cpus()
    _set_every_thread(ids)
    return ids


def _set_every_thread(cpus: tuple[int, ...]) -> None:
    for tid in os.listdir("/proc/self/task"):  # sched_setaffinity(0) would set the calling thread only
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):  # a thread that just ended
            pass

