"""Markdown + PNG report of benchmark results JSON (``robo_rl.eval.benchmark``), optionally comparing
two policies on the same benchmark (side-by-side table, probability of improvement)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from robo_rl.errors import ConfigError


def _load(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"results file '{p}' does not exist; write one with 'robo-rl eval CKPT --benchmark NAME --out FILE'")
    data = json.loads(p.read_text())
    if data.get("schema") != 1 or "tasks" not in data:
        raise ConfigError(f"'{p}' is not a robo-rl benchmark results file (schema 1)")
    return data


def _bars(results: list[dict[str, Any]], labels: list[str], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(results[0]["tasks"])
    x = np.arange(len(tasks))
    width = 0.8 / len(results)
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(tasks) + 2), 3.2))
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
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def write_report(results_path: str, compare_path: str | None = None, out: str | None = None) -> Path:
    """Write ``<results>.md`` (+ ``.png``) and return the markdown path."""
    a = _load(results_path)
    runs, labels = [a], [Path(a["checkpoint"]).parent.parent.name or "A"]
    if compare_path:
        b = _load(compare_path)
        if b["benchmark"] != a["benchmark"] or list(b["tasks"]) != list(a["tasks"]):
            raise ConfigError(f"cannot compare {a['benchmark']} with {b['benchmark']}: different benchmarks or task lists")
        runs.append(b)
        labels.append(Path(b["checkpoint"]).parent.parent.name or "B")
    md = Path(out) if out else Path(results_path).with_suffix(".md")
    png = md.with_suffix(".png")
    _bars(runs, labels, png)
    lines = [f"# {a['benchmark']}", "", f"Varies: {a['varies']}.", "",
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
    if len(runs) == 2:
        from robo_rl.eval.stats import improvement

        xa = np.array([[a["tasks"][t]["success_rate"] for t in a["tasks"]]])
        xb = np.array([[runs[1]["tasks"][t]["success_rate"] for t in a["tasks"]]])
        p = improvement(xa, xb, reps=200)
        lines += ["", f"P({labels[0]} > {labels[1]}) over tasks: {p['p_improvement']:.2f}"]
    lines += ["", f"![success per task]({png.name})", ""]
    md.write_text("\n".join(lines))
    return md
