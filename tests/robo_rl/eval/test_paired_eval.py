"""Paired evaluation: per-episode outcomes, the paired difference and McNemar test against hand values,
`robo-rl compare` on evaluation files, and (real ManiSkill) that env i's k-th episode starts from the same
state whatever the policy did before, which is what makes two evaluations' episodes pairs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from robo_rl.errors import RoboRLError
from robo_rl.eval.paired import compare
from robo_rl.eval.stats import paired_difference


def test_paired_difference_hand_values():
    a, b = [1, 1, 0, 0, 1, 0], [0, 1, 0, 0, 0, 0]
    r = paired_difference(a, b, reps=2000)
    assert r["difference"] == pytest.approx(2 / 6) and (r["a_only"], r["b_only"]) == (2, 0)
    assert r["mcnemar_p"] == pytest.approx(0.5)  # two discordant pairs, both for A: 2 * (1/2)^2
    assert r["low"] <= r["difference"] <= r["high"]
    same = paired_difference(a, a, reps=200)
    assert (same["difference"], same["low"], same["high"], same["mcnemar_p"]) == (0.0, 0.0, 0.0, 1.0)
    assert paired_difference(b, a, reps=200)["difference"] == pytest.approx(-2 / 6)
    with pytest.raises(ValueError, match="equal, non-zero lengths"):
        paired_difference([1, 0], [1])


def test_pairing_narrows_the_interval_when_outcomes_agree():
    rng = np.random.default_rng(0)
    easy = rng.random(400) < 0.3                      # starts on which both succeed
    a = easy | (rng.random(400) < 0.1)
    b = easy.copy()
    r = paired_difference(a, b, reps=4000)
    from robo_rl.eval.stats import success_difference

    _, ulo, uhi = success_difference([a.sum()], [400], [b.sum()], [400], reps=4000)
    assert r["low"] > 0 and (r["high"] - r["low"]) < 0.6 * (uhi - ulo)
    assert r["b_only"] == 0 and r["mcnemar_p"] < 1e-6


def _write(path, per_env, offsets=None):
    path.write_text(json.dumps({"success_rate": float(np.mean([x for e in per_env for x in e])),
                                "episode_success": per_env} | ({"episode_offset": offsets} if offsets else {})))
    return str(path)


def test_compare_splits_a_mixed_split_by_offset(tmp_path):
    """With episode_offset on both sides the comparison is repeated on the shifted and the in-distribution
    episodes; differing tags (another split) are refused."""
    tags = [[1, 0, 1], [0, 1, 0]]
    a = _write(tmp_path / "a.json", [[1, 1, 1], [0, 0, 1]], tags)
    b = _write(tmp_path / "b.json", [[0, 1, 0], [1, 0, 1]], tags)
    r = compare([a], [b], reps=500)
    shifted, ind = r["by_offset"]["shifted"], r["by_offset"]["in_distribution"]
    assert shifted["episodes"] == ind["episodes"] == 3
    assert shifted["a"]["success_rate"] == pytest.approx(2 / 3) and shifted["paired"]["difference"] == pytest.approx(2 / 3)
    assert ind["paired"]["difference"] == pytest.approx(-1 / 3) and ind["paired"]["b_only"] == 1
    assert "by_offset" not in compare([_write(tmp_path / "c.json", [[1, 1, 1], [0, 0, 1]])], [b], reps=100)
    other = _write(tmp_path / "d.json", [[0, 1, 0], [1, 0, 1]], [[0, 0, 1], [0, 1, 0]])
    with pytest.raises(RoboRLError, match="offset tags"):
        compare([a], [other])


def test_compare_files_and_refusals(tmp_path):
    a1 = _write(tmp_path / "a1.json", [[1, 0], [1, 1]])
    a2 = _write(tmp_path / "a2.json", [[0], [1]])
    b1 = _write(tmp_path / "b1.json", [[0, 0], [1, 0]])
    b2 = _write(tmp_path / "b2.json", [[0], [1]])
    r = compare([a1, a2], [b1, b2], reps=500)
    assert r["episodes"] == 6 and r["a"]["success_rate"] == pytest.approx(4 / 6)
    assert r["paired"]["difference"] == pytest.approx(2 / 6) and r["paired"]["a_only"] == 2
    from tests.conftest import cli_in_process, run_cli

    proc = run_cli("compare", "--a", a1, a2, "--b", b1, b2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["paired"]["a_only"] == 2 and "over 6 paired episodes: A - B +0.333" in proc.stderr
    bad = cli_in_process("compare", "--a", a1, "--b", b2)
    assert bad.returncode != 0 and "do not pair" in bad.stderr
    with pytest.raises(RoboRLError, match=r"do not pair: per-env episode counts"):
        compare([a1], [b2])
    (tmp_path / "old.json").write_text(json.dumps({"success_rate": 0.5}))
    with pytest.raises(RoboRLError, match="no 'episode_success'"):
        compare([str(tmp_path / "old.json")], [b1])
    with pytest.raises(RoboRLError, match="not a readable evaluation JSON"):
        compare([str(tmp_path / "missing.json")], [b1])


def test_compare_pairs_benchmark_results_by_episode_and_refuses_count_only_blocks(tmp_path):
    def bench(name, blocks):
        path = tmp_path / name
        path.write_text(json.dumps({"schema": 1, "benchmark": "libero-spatial", "task_set": ["t/0"],
                                    "tasks": {"t/0": {"blocks": blocks}}}))
        return str(path)

    # one env vs two envs: env i's k-th episode is episode i + 2k, so both files list episodes 0..3 in order
    a = bench("a.json", {"0": [4, 2, 0.0, [[1, 1, 0, 0]]]})
    b = bench("b.json", {"0": [4, 2, 0.0, [[1, 0], [1, 0]]]})
    res = compare([a], [b])
    assert res["episodes"] == 4 and res["paired"]["difference"] == 0.0 and res["paired"]["a_only"] == 0
    old = bench("old.json", {"0": [4, 2, 0.0]})
    with pytest.raises(RoboRLError, match=r"old\.json: benchmark block t/0 #0 holds counts, not per-episode outcomes"):
        compare([old], [b])


def test_compare_refuses_malformed_outcomes_in_one_line(tmp_path):
    b1 = _write(tmp_path / "b1.json", [[0, 0], [1, 0]])
    for bad in ([1, 0, 1], [[1, 2], [0, 0]], [[1, "1"], [0, 0]], {"0": [1, 0]}, [[0.5, 1], [0, 0]]):
        (tmp_path / "bad.json").write_text(json.dumps({"episode_success": bad}))
        with pytest.raises(RoboRLError, match=r"bad\.json: 'episode_success' must be a list per env of per-episode 0/1 "
                                              r"outcomes, e.g\. \[\[1, 0\], \[0, 1\]\]; got ") as err:
            compare([str(tmp_path / "bad.json")], [b1])
        assert "\n" not in str(err.value)
    offsets_flat = _write(tmp_path / "o.json", [[0, 0], [1, 0]], [0, 1, 0, 1])
    with pytest.raises(RoboRLError, match=r"'episode_offset' must be a list per env"):
        compare([offsets_flat], [offsets_flat])
    (tmp_path / "bools.json").write_text(json.dumps({"episode_success": [[True, False], [True, True]]}))
    assert compare([str(tmp_path / "bools.json")], [b1], reps=100)["paired"]["a_only"] == 2


@pytest.mark.maniskill
def test_episode_starts_do_not_depend_on_the_actions(need_maniskill):
    """Two runs from one seed with different actions: mid-episode states differ, every env's next
    episode starts from the same state."""
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    def starts(scale: float):
        env = ManiSkillVecEnv(ManiSkillConfig(task="PushCube-v1", num_envs=2, max_episode_steps=4))
        try:
            rng = np.random.default_rng(1)
            obs, _ = env.reset(seed=3)
            first, mid = [obs["state"].copy()], []
            for t in range(8):
                a = scale * rng.uniform(-1, 1, (2, *env.action_spec.shape)).astype(np.float32)
                res = env.step(a)
                if t == 1:
                    mid.append(res.obs["state"].copy())
                if (res.terminated | res.truncated).all():
                    first.append(res.obs["state"].copy())
            return first, mid
        finally:
            env.close()

    (f0, m0), (f1, m1) = starts(0.0), starts(1.0)
    assert len(f0) == len(f1) == 3  # the initial reset and two autoresets
    assert not np.allclose(m0[0], m1[0])
    for x, y in zip(f0, f1):
        np.testing.assert_allclose(x, y, atol=1e-5)
    assert not np.allclose(f0[1], f0[2])  # and successive episodes do differ


def test_compare_reads_a_training_runs_final_evaluation(tmp_path):
    """A run directory (or its summary.json) stands for its final evaluation; one without any is refused."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"run": "x", "final_eval": {"success_rate": 0.75,
                                                                            "episode_success": [[1, 1], [1, 0]]}}))
    b = _write(tmp_path / "b.json", [[0, 1], [1, 0]])
    for a in (str(run), str(run / "summary.json")):
        r = compare([a], [b], reps=200)
        assert r["a"]["success_rate"] == pytest.approx(0.75) and r["paired"]["a_only"] == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "summary.json").write_text(json.dumps({"run": "y"}))
    with pytest.raises(RoboRLError, match="no 'episode_success'"):
        compare([str(empty)], [b])
    with pytest.raises(RoboRLError, match="run directory with a final evaluation"):
        compare([str(tmp_path / "missing")], [b])


def test_compare_into_a_closed_pipe_stops_without_a_traceback(tmp_path):
    """`robo-rl compare ... | head -1`: the reader leaves before the JSON is written; no traceback, exit 141."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    a = _write(tmp_path / "a.json", [[1, 0], [1, 1]])
    b = _write(tmp_path / "b.json", [[0, 0], [1, 0]])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered, as in a shell
    proc = subprocess.Popen([sys.executable, "-m", "robo_rl.cli", "compare", "--a", a, "--b", b], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the first write
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err[-2000:]
    assert "Traceback" not in err and "BrokenPipeError" not in err
