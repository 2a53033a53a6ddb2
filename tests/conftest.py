"""Shared fixtures. Heavy simulator tests are skipped (with the reason) where ManiSkill cannot run."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def maniskill_status() -> tuple[bool, str]:
    from robo_rl.info import _check_maniskill

    item = _check_maniskill()
    return item["ok"], item["detail"]


@pytest.fixture
def need_maniskill() -> None:
    ok, detail = maniskill_status()
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(f"ManiSkill must work in CI: {detail}")
        pytest.skip(detail)


def run_cli(*args: str, timeout: float = 600, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `robo-rl ...` in a subprocess (the real console entry point module)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "robo_rl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env=full_env)


@functools.lru_cache(maxsize=1)
def libero_status() -> tuple[bool, str]:
    from robo_rl.info import _check_libero

    item = _check_libero()
    return item["ok"], item["detail"]


@pytest.fixture
def need_libero() -> None:
    ok, detail = libero_status()
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(f"LIBERO must work in CI: {detail}")
        pytest.skip(detail)
