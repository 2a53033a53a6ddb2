"""The import-layer contracts in ``.importlinter`` hold (function-level imports count), and they catch an
upward import added to the core."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("robo_rl", "sims", "vla", "policies", "real_robot", "benchmarks")
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (dev extra)")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), str(root / ".importlinter"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_tree_keeps_its_floors():
    res = _lint(REPO)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "4 kept, 0 broken" in res.stdout


def test_an_upward_import_in_the_core_breaks_the_contract(tmp_path):
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
    metrics = tmp_path / "robo_rl" / "eval" / "metrics.py"
    metrics.write_text(metrics.read_text() + "\n\ndef _probe():\n    from sims.maniskill.env import cuda_available\n"
                       "    return cuda_available()\n")
    res = _lint(tmp_path)
    assert res.returncode != 0
    assert "robo_rl.eval.metrics -> sims.maniskill.env" in res.stdout, res.stdout[-3000:]
