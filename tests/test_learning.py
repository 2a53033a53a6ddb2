"""Slow: the default job actually learns (run with `pytest -m slow`)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.maniskill]


def test_quickstart_pushcube_learns(tmp_path, need_maniskill):
    proc = run_cli("train", "--json", "configs/quickstart.yaml", "run.max_minutes=15", "run.progress=false", "run.video=false",
                   "run.eval_every_steps=0", "run.final_eval_episodes=40", f"run.out_dir={tmp_path}", "run.name=learn",
                   timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "learn" / "summary.json").read_text())
    assert summary["final_eval"]["success_rate"] >= 0.5, summary
