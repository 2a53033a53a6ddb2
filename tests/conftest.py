"""Shared fixtures. Heavy simulator tests are skipped (with the reason) where ManiSkill cannot run."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _backend_fixture(check_name: str, label: str):
    """A fixture that skips (or, in CI, fails) when a simulator backend does not work here."""

    @functools.lru_cache(maxsize=1)
    def status() -> tuple[bool, str]:
        from robo_rl import info

        item = getattr(info, check_name)()
        return item["ok"], item["detail"]

    @pytest.fixture
    def fixture() -> None:
        ok, detail = status()
        if not ok:
            if os.environ.get("CI") == "true":
                pytest.fail(f"{label} must work in CI: {detail}")
            pytest.skip(detail)

    return fixture


need_maniskill = _backend_fixture("_check_maniskill", "ManiSkill")
need_libero = _backend_fixture("_check_libero", "LIBERO")


def run_cli(*args: str, timeout: float = 600, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `robo-rl ...` in a subprocess (the real console entry point module)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "robo_rl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env=full_env)


def cli_in_process(*args: str) -> subprocess.CompletedProcess:
    """`robo-rl ARGS` through ``robo_rl.cli.main`` in this process: the exit code and output ``run_cli`` would give,
    without a fresh interpreter importing torch (refusals, and repeats of a command a test already ran through
    ``run_cli``). An exception other than the CLI's own errors propagates (where a subprocess would print a
    traceback)."""
    import torch

    from robo_rl.cli import main

    out, err, cwd, threads = io.StringIO(), io.StringIO(), os.getcwd(), torch.get_num_threads()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(["robo-rl", *args], code, out.getvalue(), err.getvalue())


def interrupt_cli_after_rows(args: list[str], metrics: Path, rows: int) -> tuple[int, str, str]:
    """Start `robo-rl ARGS` in its own process group, press Ctrl-C (SIGINT to the whole group, as a terminal
    does) once metrics.csv has more than ``rows`` lines; (exit code, stdout, stderr). Output goes through
    files next to the run directory, so a chatty run cannot block on a full pipe."""
    logs = metrics.parent.parent
    logs.mkdir(parents=True, exist_ok=True)
    out_path, err_path = logs / f"{metrics.parent.name}.stdout", logs / f"{metrics.parent.name}.stderr"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "robo_rl.cli", *args], cwd=REPO, stdout=out, stderr=err,
                                start_new_session=True)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            if metrics.is_file() and len(metrics.read_text().splitlines()) > rows:
                break
            assert proc.poll() is None, err_path.read_text()[-3000:]
            time.sleep(0.2)
        else:
            pytest.fail(f"fewer than {rows} metrics rows within 300 s")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out_path.read_text(), err_path.read_text()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes need_maniskill / need_libero carries the maniskill / libero marker, so that
    ``-m "not maniskill and not libero"`` deselects every simulator test (tests that pick the backend
    at run time mark themselves)."""
    for item in items:
        for sim in ("maniskill", "libero"):
            if f"need_{sim}" in getattr(item, "fixturenames", ()):
                item.add_marker(getattr(pytest.mark, sim))


FAKE_ENV = "fake_reach"


@pytest.fixture
def fake_env():
    """The registered, simulator-free env ``fake_reach`` (tests/fakes/vec.py), for one test; yields its name."""
    from robo_rl.registry import ENVS

    ENVS.register(FAKE_ENV, "tests.fakes.vec:PointReachVecEnv")
    yield FAKE_ENV
    ENVS.unregister(FAKE_ENV)
