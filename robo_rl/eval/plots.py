"""Learning-curve PNG and mp4 videos (matplotlib Agg, imageio-ffmpeg)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from robo_rl.errors import ConfigError, RoboRLError

VIDEO_SUFFIXES = (".mp4", ".gif", ".mkv", ".mov", ".avi")
"""Containers ``write_video`` writes (imageio-ffmpeg, H.264; GIF through ffmpeg's gif encoder)."""


def save_figure(fig: Any, out_png: Path, dpi: int = 100) -> None:
    """Save a matplotlib figure to ``out_png`` atomically (a temp name in the same directory, then
    renamed), creating the directory; close the figure. A readable failure names the path."""
    import matplotlib.pyplot as plt

    from robo_rl.files import atomic_path

    out_png = Path(out_png)
    try:
        out_png.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out_png, out_png.suffix or ".png") as tmp:
            fig.savefig(tmp, dpi=dpi, format=out_png.suffix[1:].lower() or "png")
    except (OSError, ValueError) as err:  # ValueError: an image format matplotlib does not write
        why = (err.strerror or str(err)) if isinstance(err, OSError) else str(err).splitlines()[0]
        raise RoboRLError(f"cannot write figure '{out_png}' ({why}); pass a .png path in a writable directory") from None
    finally:
        plt.close(fig)


def check_video_path(path: str | Path) -> Path:
    """``path`` as a Path if ``write_video`` can write it (suffix in ``VIDEO_SUFFIXES``); a ConfigError
    naming the path otherwise. Call it before evaluating, so a bad name fails before the episodes run."""
    p = Path(path)
    if p.suffix.lower() not in VIDEO_SUFFIXES:
        raise ConfigError(f"video path '{p}' has {f'suffix {p.suffix!r}' if p.suffix else 'no suffix'}; name it "
                          f"*.mp4 (or {', '.join(VIDEO_SUFFIXES[1:])}), e.g. '{p.stem or 'video'}.mp4'")
    return p


def _read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a run's metrics.csv."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _curve_points(rows: list[dict[str, str]], metric: str) -> list[tuple[float, float, float]]:
    """(env steps, wall-clock minutes or nan, value) of every row that has ``metric``."""
    out = []
    for r in rows:
        if r.get(metric) not in (None, ""):
            wall = r.get("wall_time")
            out.append((float(r["env_steps"]), float(wall) / 60 if wall not in (None, "") else float("nan"),
                        float(r[metric])))
    return out


def learning_curve(metrics_csv: Path, out_png: Path) -> None:
    """Plot success rate (train and eval) against wall-clock minutes and env steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _read_rows(metrics_csv)
    if not rows:
        return

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key, label, style in (("train/success_rate", "train (last 40 episodes)", "-"),
                              ("eval/success_rate", "eval (deterministic)", "o-")):
        pts = _curve_points(rows, key)
        steps, minutes, vals = (np.asarray(c) for c in zip(*pts)) if pts else (np.zeros(0),) * 3
        axes[0].plot(minutes, vals, style, label=label, ms=3)
        axes[1].plot(steps, vals, style, label=label, ms=3)
    axes[0].set_xlabel("wall-clock (min)")
    axes[1].set_xlabel("env steps")
    for ax in axes:
        ax.set_ylabel("success rate")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle(metrics_csv.parent.name)
    fig.tight_layout()
    save_figure(fig, out_png, dpi=100)


def _finish_steps_plot(fig: Any, ax: Any, metric: str, out_png: Path) -> None:
    """Axes limits, grid and legend of a metric-vs-env-steps plot; written atomically."""
    if metric.endswith("success_rate"):
        ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    save_figure(fig, out_png, dpi=100)


def compare_curves(runs: dict[str, Path], out_png: Path, reference: tuple[str, float] | None = None,
                   metric: str = "eval/success_rate") -> None:
    """``metric`` (default: evaluation success) against env steps for several runs (label ->
    metrics.csv) in one plot, with an optional horizontal reference line (label, value), e.g. a
    teacher's success. Per-iteration training metrics (``train/return``) are drawn as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, path in runs.items():
        pts = _curve_points(_read_rows(path), metric)
        if pts:
            x, _, y = zip(*pts)
            ax.plot(x, y, "o-" if metric.startswith("eval/") else "-", ms=3, label=label)
    if reference is not None:
        ax.axhline(reference[1], ls="--", c="k", lw=1, label=reference[0])
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric)
    _finish_steps_plot(fig, ax, metric, out_png)


def write_video(frames: list[np.ndarray], path: Path, fps: int = 20) -> None:
    """frames: list of (H, W, 3) uint8 -> mp4 at ``path`` (written to a temp name, then renamed); the
    suffix picks the container (``check_video_path``)."""
    import imageio.v2 as imageio

    from robo_rl.files import atomic_path

    path = check_video_path(path)
    with atomic_path(path, path.suffix) as tmp, \
            imageio.get_writer(tmp, fps=fps, codec="libx264", quality=7, macro_block_size=1) as w:
        for f in frames:
            w.append_data(np.asarray(f, dtype=np.uint8))


def first_reach(path: Path, metric: str, target: float, window: int = 3) -> tuple[float, float] | None:
    """The first (env steps, wall-clock minutes) at which the mean of ``metric`` over the last
    ``window`` logged rows of ``path`` (a metrics.csv) is >= ``target``; None if it never is. The
    window smooths per-iteration rollout success (a few episodes per row)."""
    rows = _curve_points(_read_rows(path), metric)
    for k in range(len(rows)):
        last = rows[max(0, k - window + 1):k + 1]
        if len(last) == min(window, len(rows)) and sum(v for *_, v in last) / len(last) >= target:
            return rows[k][0], rows[k][1]
    return None


def curve_groups(groups: dict[str, list[Path]], out_png: Path, metric: str = "train/success_rate",
                 bin_steps: int = 10_000) -> dict[str, list[tuple[int, float, float, float]]]:
    """Several seeds per label (label -> metrics.csv files) in one figure of two panels: ``metric``
    against env steps, binned every ``bin_steps`` (last value in each bin per seed) and drawn as the
    seed mean with a min-max band; and against wall-clock minutes (each seed's logged rows, the
    label's colour). Returns label -> [(bin end, mean, min, max)] over the bins every seed reached."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table: dict[str, list[tuple[int, float, float, float]]] = {}
    fig, (ax, ax_t) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for label, paths in groups.items():
        curves = [_curve_points(_read_rows(p), metric) for p in paths]
        per_seed: list[dict[int, float]] = []
        for rows in curves:
            bins: dict[int, float] = {}
            for steps, _, v in rows:
                bins[-(-int(steps) // bin_steps) * bin_steps] = v
            per_seed.append(bins)
        common = sorted(set.intersection(*(set(b) for b in per_seed))) if per_seed else []
        table[label] = []
        for x in common:
            ys = [b[x] for b in per_seed]
            table[label].append((x, sum(ys) / len(ys), min(ys), max(ys)))
        color = None
        if table[label]:
            xs, mean, lo, hi = zip(*table[label])
            line, = ax.plot(xs, mean, "o-", ms=3, label=f"{label} (n={len(paths)})")
            color = line.get_color()
            ax.fill_between(xs, lo, hi, color=color, alpha=0.2)
        for j, rows in enumerate(curves):
            timed = [(t, v) for _, t, v in rows if t == t]
            if timed:
                t, v = zip(*timed)
                ln, = ax_t.plot(t, v, "-", lw=1, color=color, alpha=0.8, label=label if j == 0 else None)
                color = ln.get_color()
    ax.set_xlabel("env steps")
    ax.set_ylabel(f"{metric} (mean, min-max over seeds)")
    ax_t.set_xlabel("wall-clock minutes")
    ax_t.grid(alpha=0.3)
    if ax_t.lines:
        ax_t.legend(loc="lower right", fontsize=8)
    _finish_steps_plot(fig, ax, metric, out_png)
    return table
