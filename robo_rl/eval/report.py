"""Markdown + PNG report of benchmark results JSON (``robo_rl.eval.benchmark``): one section per
results file (a table per split, bar chart with 95% CIs, success vs variation strength when the split
was swept, thumbnails when the evaluation saved media), optionally comparing a second policy on the
same benchmarks (side-by-side tables and charts, probability of improvement).

With ``html=PATH`` the same report is also written as one self-contained HTML page
(``robo_rl.eval.report_html``): inline CSS, charts, thumbnails and videos embedded as data URIs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from robo_rl.errors import ConfigError, RoboRLError
from robo_rl.eval.plots import save_figure
from robo_rl.eval.reference import REFERENCE_POLICIES


def _load(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"results file '{p}' does not exist; write one with 'robo-rl eval CKPT --benchmark NAME --out FILE'")
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):  # ValueError: bad JSON or bytes that are not UTF-8
        data = None
    if not isinstance(data, dict) or data.get("schema") != 1 or "tasks" not in data or "aggregate" not in data:
        if data is None:
            kind = "not JSON"
        elif not isinstance(data, dict):
            kind = f"a JSON {type(data).__name__}, not an object"
        else:
            kind = "no schema 1 object with tasks and aggregate"
        raise ConfigError(f"'{p}' is not a finished robo-rl benchmark results file ({kind}); pass the --out file "
                          "of a completed 'robo-rl eval CKPT --benchmark NAME'")
    data["_path"] = str(p)
    return data


def label_of(res: dict[str, Any]) -> str:
    """A short name for the evaluated policy: the reference policy or the run directory."""
    ck = res["checkpoint"]
    if ck in REFERENCE_POLICIES:
        return ck
    p = Path(ck)
    return (p.parent.parent.name if p.parent.name == "checkpoints" else p.name) or ck


def _split_strength(task: str) -> tuple[str, float | None]:
    base, _, s = task.rpartition(" x")
    try:
        return (base, float(s)) if base else (task, None)
    except ValueError:
        return task, None


def _bars(results: list[dict[str, Any]], labels: list[str], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(results[0]["tasks"])
    x = np.arange(len(tasks))
    width = 0.8 / len(results)
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(tasks) + 2), 3.2))
    for i, (res, label) in enumerate(zip(results, labels)):
        rates = np.array([res["tasks"][t]["success_rate"] for t in tasks])
        lo = np.array([res["tasks"][t]["ci95"][0] for t in tasks])
        hi = np.array([res["tasks"][t]["ci95"][1] for t in tasks])
        ax.bar(x + i * width, rates, width, yerr=[rates - lo, hi - rates], capsize=3, label=label)
    ax.set_xticks(x + width * (len(results) - 1) / 2, tasks, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success (95% CI)")
    ax.set_title(results[0]["benchmark"])
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out_png, dpi=110)


def _strength_plot(results: list[dict[str, Any]], labels: list[str], out_png: Path) -> bool:
    """Success vs variation strength (one line per policy and task) if the split was swept."""
    curves: dict[tuple[int, str], list[tuple[float, float, float, float]]] = {}
    for i, res in enumerate(results):
        for t, rec in res["tasks"].items():
            base, s = _split_strength(t)
            if s is not None:
                curves.setdefault((i, base), []).append((s, rec["success_rate"], *rec["ci95"]))
    if not curves or all(len(v) < 2 for v in curves.values()):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for (i, base), pts in sorted(curves.items()):
        s, r, lo, hi = map(np.array, zip(*sorted(pts)))
        line, = ax.plot(s, r, "o-", ms=3, label=f"{labels[i]}: {base}")
        ax.fill_between(s, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xlabel(f"variation strength (x {results[0]['benchmark']} split)")
    ax.set_ylabel("success (95% CI)")
    ax.set_ylim(-0.02, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out_png, dpi=110)
    return True


def _thumbnails(res: dict[str, Any], md_dir: Path, label: str) -> list[str]:
    media = Path(res["_path"]).with_suffix(".media")
    pngs = sorted(media.glob("*.png")) if media.is_dir() else []
    if not pngs:
        return []
    import os

    cells = [f"![{p.stem}]({os.path.relpath(p, md_dir)})" for p in pngs[:8]]
    names = [p.stem.rsplit("_", 2)[0] + " " + p.stem.rsplit("_", 1)[1] for p in pngs[:8]]
    return ["", f"Last frames of {label}'s first episodes (videos next to them in `{media.name}/`):", "",
            "| " + " | ".join(names) + " |", "|" + "---|" * len(cells), "| " + " | ".join(cells) + " |"]


def comparison(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """For two runs on the same tasks: ``difference`` (mean success of the first minus the second over tasks,
    95% bootstrap CI over episodes) and ``p_improvement`` (P(first > second) over tasks; None with fewer
    than 3 tasks, where it means little). None for a single run."""
    if len(runs) != 2:
        return None
    from robo_rl.eval.stats import improvement, success_difference

    a, b = runs
    ts = list(a["tasks"])
    diff = success_difference([a["tasks"][t]["successes"] for t in ts], [a["tasks"][t]["episodes"] for t in ts],
                              [b["tasks"][t]["successes"] for t in ts], [b["tasks"][t]["episodes"] for t in ts])
    p = None
    if len(ts) >= 3:
        xa = np.array([[a["tasks"][t]["success_rate"] for t in ts]])
        xb = np.array([[b["tasks"][t]["success_rate"] for t in ts]])
        p = float(improvement(xa, xb, reps=200)["p_improvement"])
    return {"difference": tuple(float(v) for v in diff), "p_improvement": p}


def _section(runs: list[dict[str, Any]], labels: list[str], md_dir: Path,
             stem: str) -> tuple[list[str], dict[str, Any]]:
    """The markdown lines of one benchmark's section (writing its charts next to the markdown), and what the
    HTML page needs besides the results: the chart paths, the comparison and the small-sample note."""
    a = runs[0]
    png = md_dir / f"{stem}.png"
    _bars(runs, labels, png)
    lines = [f"## {a['benchmark']}", "", f"Varies: {a['varies']}.", "",
             f"Episodes per task: {a['episodes_per_task']}, seeds from {a['seed']}; environment: "
             + ", ".join(f"{k} {v}" for k, v in a["environment"].items()), "",
             "| task | " + " | ".join(f"{lab} success [95% CI]" for lab in labels) + " |",
             "|---|" + "---:|" * len(runs)]
    for t in a["tasks"]:
        cells = [f"{r['tasks'][t]['success_rate']:.2f} [{r['tasks'][t]['ci95'][0]:.2f}, {r['tasks'][t]['ci95'][1]:.2f}]"
                 for r in runs]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines.append("| **mean over tasks** | " + " | ".join(
        f"**{r['aggregate']['mean']:.2f}** [{r['aggregate']['mean_low']:.2f}, {r['aggregate']['mean_high']:.2f}]"
        for r in runs) + " |")
    if len(a["tasks"]) >= 4:
        lines.append("| IQM over tasks | " + " | ".join(f"{r['aggregate']['iqm_over_tasks']:.2f}" for r in runs) + " |")
    few = min(r["tasks"][t]["episodes"] for r in runs for t in a["tasks"])
    note = None
    if few < 30:
        from robo_rl.eval.metrics import wilson_interval

        lo, hi = wilson_interval(few, few)
        note = (few, lo, hi)
        lines += ["", f"Note: {few} episodes per task. Bootstrap intervals understate uncertainty at this size (all "
                  f"{few} episodes succeeding gives [1.00, 1.00]; the Wilson interval would be [{lo:.2f}, {hi:.2f}])."]
    stats = comparison(runs)
    if stats is not None:
        d, lo, hi = stats["difference"]
        lines += ["", f"Success {labels[0]} - {labels[1]} (mean over tasks): {d:+.3f} [{lo:+.3f}, {hi:+.3f}] "
                  "(95% bootstrap over episodes)"]
        if stats["p_improvement"] is not None:
            lines += ["", f"P({labels[0]} > {labels[1]}) over tasks: {stats['p_improvement']:.2f}"]
    lines += ["", f"![success per task]({png.name})"]
    strength_png: Path | None = md_dir / f"{stem}_strength.png"
    if _strength_plot(runs, labels, strength_png):
        lines += ["", f"![success vs variation strength]({strength_png.name})"]
    else:
        strength_png = None
    for r, lab in zip(runs, labels):
        lines += _thumbnails(r, md_dir, lab)
    return lines + [""], {"bars": png, "strength": strength_png, "comparison": stats, "few": note}


def write_report(results_paths: str | list[str], compare_paths: str | list[str] | None = None,
                 out: str | None = None, html: str | None = None) -> Path:
    """Write a markdown report (+ PNGs) of one or more results files (one section each), each compared
    with the results of the same benchmark in ``compare_paths`` if given; return the markdown path. With
    ``html``, also write the report as one self-contained HTML page there."""
    paths = [results_paths] if isinstance(results_paths, str) else list(results_paths)
    comp = [compare_paths] if isinstance(compare_paths, str) else list(compare_paths or [])
    mains = [_load(p) for p in paths]
    others = {}
    for b in map(_load, comp):
        others[(b["benchmark"], tuple(b["tasks"]))] = b
    md = Path(out) if out else Path(paths[0]).with_suffix(".md")
    page = None
    if html:  # a bad --html fails before anything is written
        from robo_rl.eval.report_html import check_html_path

        page = check_html_path(html, md)
    try:
        md.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RoboRLError(f"cannot create the report directory '{md.parent}' ({err.strerror or err}); pass "
                          "--report-out in a writable place") from None
    title = label_of(mains[0]) + (f" vs {label_of(next(iter(others.values())))}" if others else "")
    lines = [f"# Benchmark report: {title}", ""]
    sections = []
    for k, a in enumerate(mains):
        runs = [a]
        if comp:
            b = others.get((a["benchmark"], tuple(a["tasks"])))
            if b is None:
                raise ConfigError(f"no comparison results for {a['benchmark']} with tasks {', '.join(a['tasks'])} "
                                  f"among {', '.join(comp)}: evaluate the second policy on the same benchmark")
            runs.append(b)
        stem = md.stem + ("" if len(mains) == 1 else f"_{k}_{a['benchmark']}")
        labels = [label_of(r) for r in runs]
        section_lines, extra = _section(runs, labels, md.parent, stem)
        lines += section_lines
        sections.append({"runs": runs, "labels": labels, **extra})
    from robo_rl.files import atomic_write_text

    try:
        atomic_write_text(md, "\n".join(lines))
    except OSError as err:
        raise RoboRLError(f"cannot write the report '{md}' ({err.strerror or err}); pass --report-out in a "
                          "writable place") from None
    if page is not None:
        from robo_rl.eval.report_html import write_html

        write_html(page, f"Benchmark report: {title}", sections)
    return md
