"""Shared fixtures. Heavy simulator tests are skipped (with the reason) where ManiSkill cannot run."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
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
