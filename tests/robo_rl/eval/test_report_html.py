"""The self-contained HTML benchmark report (`robo-rl eval --report A.json --compare B.json --html R.html`):
made-up results files (two benchmarks, a strength sweep, thumbnails and a video), the page's content and
embedding, one-line errors for bad paths, and the page checked in headless Chromium (no console errors,
every image and video loads, every section present)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import cli_in_process, run_cli

STRENGTHS = (0.0, 1.0, 2.0, 4.0)


def _results(path: Path, checkpoint: str, benchmark: str, varies: str, successes: dict[str, int], episodes: int,
             seed: int = 10_000) -> dict:
    """Write a finished schema-1 benchmark results file with the given successes per task (made-up numbers:
    the CIs are the Wilson interval, the aggregate a plain mean; the report only reads them)."""
    from robo_rl.eval.metrics import wilson_interval

    tasks = {}
    for t, s in successes.items():
        lo, hi = wilson_interval(s, episodes)
        tasks[t] = {"blocks": {"0": [episodes, s, float(s)]}, "episodes": episodes, "successes": s,
                    "success_rate": s / episodes, "ci95": [lo, hi], "mean_return": float(s) / episodes}
    rates = np.array([r["success_rate"] for r in tasks.values()])
    data = {"schema": 1, "benchmark": benchmark, "varies": varies, "checkpoint": checkpoint, "seed": seed,
            "episodes_per_task": episodes, "block": 10, "strengths": [1.0], "task_set": list(tasks),
            "env": {"name": "maniskill", "task": "PickCube-v1"},
            "environment": {"physics": "physx_cpu", "render": "cpu (lavapipe)", "robo-rl": "0.1.0"},
            "tasks": tasks, "aggregate": {"mean": float(rates.mean()), "mean_low": float(rates.min()),
                                          "mean_high": float(rates.max()), "iqm_over_tasks": float(rates.mean()),
                                          "tasks": len(tasks)}}
    path.write_text(json.dumps(data, indent=1))
    return data


def make_results(d: Path, video: bool = True) -> dict[str, Path]:
    """Two policies on two benchmarks: an execution split swept at four strengths (with thumbnails and a
    video for the first policy) and the in-distribution split. Returns the four results paths."""
    from robo_rl.eval.plots import write_video

    d.mkdir(parents=True, exist_ok=True)
    sweep = [f"PickCube-v1 x{s:g}" for s in STRENGTHS]
    ex = "initial object positions +-5 cm in x and y"
    paths = {"a": d / "a.json", "b": d / "b.json", "a_id": d / "a_id.json", "b_id": d / "b_id.json"}
    _results(paths["a"], "runs/ppo-pickcube/checkpoints/step_300000", "maniskill-execution", ex,
             dict(zip(sweep, (18, 17, 11, 7))), 20)
    _results(paths["b"], "expert", "maniskill-execution", ex, dict(zip(sweep, (20, 20, 19, 16))), 20)
    _results(paths["a_id"], "runs/ppo-pickcube/checkpoints/step_300000", "maniskill-id",
             "nothing: the training distribution", {"PickCube-v1": 86}, 100)
    _results(paths["b_id"], "expert", "maniskill-id", "nothing: the training distribution", {"PickCube-v1": 100}, 100)
    media = d / "a.media"
    media.mkdir(exist_ok=True)
    import imageio.v2 as imageio

    rng = np.random.default_rng(0)
    frames = []
    for t in sweep:
        slug = t.replace(" ", "_")
        for i, ok in enumerate((True, False)):
            img = np.zeros((64, 64, 3), np.uint8)
            img[..., 1 if ok else 0] = 200
            img[20:44, 20:44] = rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)
            imageio.imwrite(media / f"{slug}_env{i}_{'success' if ok else 'failure'}.png", img)
        if video and t == sweep[0]:
            frames = [np.full((64, 128, 3), 10 * k, np.uint8) for k in range(12)]
            write_video(frames, media / f"{slug}.mp4")
    return paths


SECTION_IDS = ("overview", "bench-0-maniskill-execution", "table-0", "comparison-0", "bars-0", "strength-0", "media-0",
               "bench-1-maniskill-id", "table-1", "comparison-1", "bars-1")


def test_html_report_is_one_self_contained_page_with_every_section(tmp_path):
    from robo_rl.eval.report import write_report

    p = make_results(tmp_path / "res")
    md = write_report([str(p["a"]), str(p["a_id"])], [str(p["b"]), str(p["b_id"])], html=str(tmp_path / "out" / "r.html"))
    page = (tmp_path / "out" / "r.html").read_text()
    assert md == p["a"].with_suffix(".md") and md.is_file()
    for sid in SECTION_IDS:
        assert f'id="{sid}"' in page, sid
    # self-contained: every image and video is a data URI, no stylesheet or script is fetched
    srcs = re.findall(r'\bsrc="([^"]*)"', page)
    assert srcs and all(s.startswith(("data:image/png;base64,", "data:video/mp4;base64,")) for s in srcs), srcs[:3]
    assert "<link" not in page and "<script" not in page and "http://" not in page and "https://" not in page
    assert sum(s.startswith("data:video/mp4") for s in srcs) == 1
    assert sum(s.startswith("data:image/png") for s in srcs) == 3 + 8  # 2 bar charts + strength curve + 8 thumbs
    # the numbers: per-task CIs, the mean, the comparison
    assert "ppo-pickcube" in page and "expert" in page
    assert '0.90 <span class="muted">[0.70, 0.97]' in page and "P(ppo-pickcube &gt; expert) over tasks: 0.00" in page
    assert '<span class="diff neg">-0.275</span>' in page  # the mean difference, its CI below 0
    assert "95% bootstrap over episodes" in page and "IQM over tasks" in page


def test_html_report_escapes_names_and_refuses_bad_paths_in_one_line(tmp_path):
    from robo_rl.errors import ConfigError, RoboRLError
    from robo_rl.eval.report import write_report

    p = make_results(tmp_path, video=False)
    data = json.loads(p["a"].read_text())
    data["varies"] = '<img src=x onerror="alert(1)"> & <script>alert(2)</script>'
    p["a"].write_text(json.dumps(data))
    write_report(str(p["a"]), html=str(tmp_path / "x.html"))
    page = (tmp_path / "x.html").read_text()
    assert "<script" not in page and "onerror=\"" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt; &amp; &lt;script&gt;alert(2)&lt;/script&gt;" in page
    with pytest.raises(ConfigError, match=r"^--html path '.*r\.md' must end in \.html"):
        write_report(str(p["a"]), html=str(tmp_path / "r.md"))
    with pytest.raises(ConfigError, match="is the markdown report itself"):
        write_report(str(p["a"]), out=str(tmp_path / "same.html"), html=str(tmp_path / "same.html"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RoboRLError, match=r"cannot write the HTML report '.*file/r\.html'.*; pass --html in a writable"):
        write_report(str(p["a"]), html=str(blocker / "r.html"))
    for err in (ConfigError, RoboRLError):
        assert "\n" not in str(err)


def test_cli_writes_the_html_next_to_the_markdown(tmp_path):
    p = make_results(tmp_path, video=False)
    proc = run_cli("eval", "--report", str(p["a"]), "--compare", str(p["b"]), "--html", str(tmp_path / "r.html"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out == {"report": str(p["a"].with_suffix(".md")), "html": str(tmp_path / "r.html")}
    assert 'id="comparison-0"' in (tmp_path / "r.html").read_text()
    proc = run_cli("eval", "--report", str(p["a"]))  # without --html: the page next to the markdown
    assert proc.returncode == 0 and json.loads(proc.stdout)["html"] == str(p["a"].with_suffix(".html"))
    assert "<html" in p["a"].with_suffix(".html").read_text()
    proc = cli_in_process("eval", "runs/x", "--html", str(tmp_path / "y.html"))
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--html" in proc.stderr


def test_html_report_in_headless_chromium(tmp_path):
    from tests.browser import Chromium, find_chromium

    if not find_chromium():
        if os.environ.get("CI") == "true":
            pytest.fail("Chromium must be installed in CI (scripts/setup.sh installs Debian's chromium)")
        pytest.skip("no Chromium: install Debian's 'chromium' package (scripts/setup.sh does) to check the page")
    from robo_rl.eval.report import write_report

    p = make_results(tmp_path / "res")
    out = tmp_path / "report.html"
    write_report([str(p["a"]), str(p["a_id"])], [str(p["b"]), str(p["b_id"])], html=str(out))
    shots = os.environ.get("ROBO_RL_SCREENSHOTS")
    with Chromium(width=1100) as browser:
        rep = browser.check_page(out.as_uri(), screenshot=Path(shots) / "report.png" if shots else None)
    assert rep.problems == [], rep.problems
    for sid in SECTION_IDS:
        assert f'id="{sid}"' in rep.dom, sid
    assert rep.title.startswith("Benchmark report: ppo-pickcube vs expert")
