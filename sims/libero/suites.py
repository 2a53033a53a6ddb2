"""The LIBERO suites, their tasks and the standard evaluation episode lengths."""

from __future__ import annotations

import contextlib
import difflib
import io
import logging
from dataclasses import dataclass

from robo_rl.errors import ConfigError

log = logging.getLogger(__name__)

# Max steps per episode used by the LIBERO/OpenVLA/openpi evaluations (the longest demo + margin).
MAX_STEPS: dict[str, int] = {
    "libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400,
}
SUITES = tuple(MAX_STEPS)


@dataclass(frozen=True)
class TaskInfo:
    """One LIBERO task: index in its suite, name, instruction and files (absolute paths)."""

    suite: str
    index: int
    name: str
    instruction: str
    bddl_file: str
    init_states_file: str


def check_suite(suite: str) -> None:
    if suite not in MAX_STEPS:
        close = difflib.get_close_matches(suite, SUITES, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(f"config key 'env.suite' = {suite!r} is not a LIBERO suite; {hint}choose one of {', '.join(SUITES)}")


def suite_tasks(suite: str) -> list[TaskInfo]:
    """All tasks of ``suite`` through LIBERO's own benchmark registry."""
    import os

    from sims.libero.paths import ensure_config

    check_suite(suite)
    ensure_config()
    from libero.libero import benchmark, get_libero_path

    with contextlib.redirect_stdout(io.StringIO()) as said:  # LIBERO print()s its task order: keep stdout for our JSON
        bench = benchmark.get_benchmark_dict()[suite]()
    for line in said.getvalue().splitlines():
        log.debug("libero: %s", line)
    out = []
    for i in range(bench.get_num_tasks()):
        t = bench.get_task(i)
        out.append(TaskInfo(suite, i, t.name, t.language,
                            os.path.join(get_libero_path("bddl_files"), t.problem_folder, t.bddl_file),
                            os.path.join(get_libero_path("init_states"), t.problem_folder, t.init_states_file)))
    return out


def check_task_ids(suite: str, task_ids: tuple[int, ...], num_tasks: int) -> None:
    bad = [i for i in task_ids if not 0 <= i < num_tasks]
    if bad:
        raise ConfigError(f"config key 'env.task_ids' has {bad} but {suite} has tasks 0..{num_tasks - 1}")
