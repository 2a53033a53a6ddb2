"""`robo-rl curves`: seed groups of runs binned and compared (logic on written metrics files)."""

from __future__ import annotations

import json

import torch

from tests.conftest import cli_in_process, run_cli


def _run(path, points, final=None):
    path.mkdir(parents=True)
    rows = ["iteration,env_steps,train/success_rate"] + [f"{i},{s},{v}" for i, (s, v) in enumerate(points, 1)]
    (path / "metrics.csv").write_text("\n".join(rows) + "\n")
    if final is not None:
        (path / "summary.json").write_text(json.dumps({"final_eval": {"success_rate": final}}))


def test_groups_are_binned_with_mean_min_max(tmp_path):
    from robo_rl.eval.plots import curve_groups

    _run(tmp_path / "a", [(4000, 0.1), (9000, 0.2), (14000, 0.5), (20000, 0.6)])
    _run(tmp_path / "b", [(10000, 0.4), (20000, 0.8), (30000, 0.9)])
    table = curve_groups({"g": [tmp_path / "a" / "metrics.csv", tmp_path / "b" / "metrics.csv"]}, tmp_path / "c.png")
    # last value per 10k bin and seed; only bins every seed reached
    assert table["g"] == [(10000, 0.30000000000000004, 0.2, 0.4), (20000, 0.7, 0.6, 0.8)]
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_curves_cli_prints_table_and_finals(tmp_path):
    _run(tmp_path / "s0", [(10000, 0.5), (20000, 1.0)], final=0.9)
    _run(tmp_path / "r0", [(10000, 0.3), (20000, 0.9)], final=1.0)
    proc = run_cli("curves", "--group", f"single={tmp_path / 's0'}", "--group", f"ray={tmp_path / 'r0'}",
                   "--out", str(tmp_path / "c.png"))
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "0.50 [0.50, 0.50]" in proc.stdout and "final evaluations 1.00" in proc.stdout
    bad = cli_in_process("curves", "--group", f"x={tmp_path / 'missing'}", "--out", str(tmp_path / "d.png"))
    assert bad.returncode == 2 and "has no metrics.csv" in bad.stderr and bad.stderr.count("\n") <= 2


def test_curves_and_eval_argument_errors_are_one_line(tmp_path):
    """Bad curves/eval arguments fail before any work, in one line naming the argument."""
    _run(tmp_path / "s0", [(10000, 0.5)])
    cases = [
        (["curves", "--group", f"a={tmp_path / 's0'}", "--bin", "0", "--out", str(tmp_path / "c.png")], "--bin 0 must be >= 1"),
        (["curves", "--group", f"a={tmp_path / 's0'}", "--metric", "train/sucess_rate", "--out", str(tmp_path / "c.png")],
         "--metric 'train/sucess_rate' is not a column of"),
        (["eval", str(tmp_path / "s0"), "--video", str(tmp_path / "clip")], "has no suffix; name it *.mp4"),
        (["eval", str(tmp_path / "s0"), "--benchmark", "maniskill-vision", "--out", str(tmp_path / "r.json"), "--video",
          str(tmp_path / "v.mp4")], "--video apply to the plain evaluation"),
        (["eval", str(tmp_path / "s0"), "--strengths", "abc"], "'abc': expected comma-separated numbers >= 0"),
        (["eval", str(tmp_path / "s0"), "--benchmark", "maniskill-vision", "--out", str(tmp_path / "r.json"),
          "policy.temperature=2", "env.task=PushCube-v1", "env.envs_per_worker=2"],
         "its overrides may only say where the envs run (env.gl, env.render_gpu"),
        (["eval", str(tmp_path / "s0"), "--device", "gpu"], "--device 'gpu' is not a device; use cpu, cuda or cuda:N"),
        *([] if torch.cuda.is_available() else
          [(["eval", str(tmp_path / "s0"), "--device", "cuda"], "--device 'cuda' but this machine has no CUDA device")]),
    ]
    for argv, fragment in cases:
        proc = cli_in_process(*argv)
        assert proc.returncode == 2 and fragment in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert not (tmp_path / "c.png").exists()


def test_first_reach_smooths_and_reports_steps_and_minutes(tmp_path):
    """--reach: the first row where the mean of the last `window` rows is >= the target, with its wall time."""
    from robo_rl.eval.plots import first_reach

    p = tmp_path / "m.csv"
    p.write_text("iteration,env_steps,wall_time,train/success_rate\n"
                 "1,1000,60,0.0\n2,2000,120,1.0\n3,3000,180,0.5\n4,4000,240,1.0\n5,5000,300,1.0\n")
    assert first_reach(p, "train/success_rate", 1.0, window=1) == (2000, 2.0)
    # window 3: means 0.5 (rows 1-3), 0.833 (2-4), 0.833 (3-5)
    assert first_reach(p, "train/success_rate", 0.8, window=3) == (4000, 4.0)
    assert first_reach(p, "train/success_rate", 0.9, window=3) is None
    _run(tmp_path / "s0", [(10000, 0.5), (20000, 1.0)])
    proc = run_cli("curves", "--group", f"a={tmp_path / 's0'}", "--reach", "0.9", "--window", "1",
                   "--out", str(tmp_path / "c.png"))
    assert proc.returncode == 0 and "a: first reaches 0.9 (mean of 1 rows) at 20000 steps / nan min" in proc.stdout
