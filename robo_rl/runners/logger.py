"""Run-directory metrics: CSV (append-only, flushed per row), TensorBoard scalars, learning curve; the
live progress bar."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

CSV_COLUMNS = (
    "iteration", "env_steps", "wall_time", "steps_per_s",
    "train/success_rate", "train/return", "train/episode_length", "train/episodes",
    "eval/success_rate", "eval/ci_low", "eval/ci_high", "eval/return",
    "loss/policy_loss", "loss/value_loss", "loss/entropy", "loss/approx_kl", "loss/clip_frac",
    "loss/explained_variance", "loss/grad_norm", "loss/lr", "env/worker_restarts",
    "loss/reverse_kl", "loss/teacher_distance", "loss/teacher_lambda", "loss/teacher_r2",
    "loss/clip_frac_low", "loss/clip_frac_high", "rollout/groups", "rollout/informative_groups", "rollout/rounds",
    "loss/self_imitation",
)
OFFLINE_COLUMNS = (
    "iteration", "env_steps", "wall_time", "epoch", "loss/nll", "loss/val_nll", "loss/entropy", "loss/grad_norm",
    "eval/success_rate", "eval/ci_low", "eval/ci_high",
)


def _steps(row: dict[str, str]) -> float:
    try:
        return float(row.get("env_steps") or 0)
    except ValueError:
        return 0.0


def _rewrite(path: Path, columns: tuple[str, ...], rows: list[dict[str, str]]) -> None:
    """Replace ``path`` with ``rows`` atomically (``robo_rl.files.atomic_write_text``)."""
    import io

    from robo_rl.files import atomic_write_text

    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


class MetricsLogger:
    """Appends one CSV row per call; mirrors every scalar to TensorBoard.

    ``keep_until_step``: on a resume, rows logged after the checkpoint being resumed (env_steps above
    it) are dropped first (the file is rewritten atomically), so the curve never runs backwards; an
    existing file keeps its own header.
    """

    def __init__(self, run_dir: Path, tensorboard: bool = True, columns: tuple[str, ...] = CSV_COLUMNS,
                 keep_until_step: int | None = None) -> None:
        self.path = run_dir / "metrics.csv"
        new = not self.path.exists() or self.path.stat().st_size == 0
        if not new:
            with open(self.path, newline="") as fh:
                reader = csv.DictReader(fh)
                columns = tuple(reader.fieldnames or columns)
                rows = list(reader) if keep_until_step is not None else []
            kept = [r for r in rows if keep_until_step is None or _steps(r) <= keep_until_step]
            if len(kept) != len(rows):
                _rewrite(self.path, columns, kept)
        self._fh = open(self.path, "a", newline="")
        self._writer = csv.DictWriter(self._fh, fieldnames=columns, extrasaction="ignore")
        if new:
            self._writer.writeheader()
            self._fh.flush()
        self._tb: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tb"))

    def log(self, row: dict[str, float]) -> None:
        self._writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
        self._fh.flush()
        os.fsync(self._fh.fileno())
        if self._tb is not None:
            step = int(row["env_steps"])
            for k, v in row.items():
                if k not in ("iteration", "env_steps") and isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()


class Progress:
    """rich progress bar with live success rate, return and env steps/s (no-op when disabled)."""

    def __init__(self, enabled: bool, total: int, start: int) -> None:
        self._p: Any = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        # stderr, so stdout carries only the run summary (JSON)
        self._p = RichProgress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           TextColumn("{task.fields[info]}"), refresh_per_second=2, console=Console(stderr=True))
        self._task = self._p.add_task("train", total=total, completed=start, info="")
        self._p.start()

    def update(self, steps: int, row: dict[str, Any]) -> None:
        if self._p is None:
            return
        parts = [f"{row['steps_per_s']:.0f} steps/s"]
        if "train/success_rate" in row:
            parts.append(f"success {row['train/success_rate']:.2f}")
            parts.append(f"return {row['train/return']:.2f}")
        if "eval/success_rate" in row:
            parts.append(f"eval {row['eval/success_rate']:.2f}")
        self._p.update(self._task, completed=steps, info=" | ".join(parts))

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()
