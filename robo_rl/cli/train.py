"""`robo-rl train`: a training run from a config, or resumed from a run directory."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from robo_rl.errors import RoboRLError


def cmd_train(args: argparse.Namespace) -> int:
    from robo_rl import checkpoint as ckpt_io
    from robo_rl.runners import train as train_mod
    from robo_rl.runners.stop import StopRequest, stop_on_signals

    ckpt_io.allow_large_models(args.allow_large)
    if args.resume:
        overrides = list(args.overrides or [])
        if args.config:  # argparse puts the first KEY=VALUE of "train --resume RUN a.b=1" in CONFIG
            if "=" not in args.config:
                raise RoboRLError(f"robo-rl train --resume takes the run's own config.yaml, not {args.config!r}; "
                                  f"pass only dotted overrides after it (e.g. algo.lr=1e-5)")
            overrides.insert(0, args.config)
        if args.dry_run:  # check what the resume would run; nothing in the run directory is touched
            from robo_rl.runners.dry_run import dry_run

            if not Path(args.resume).is_dir():
                raise RoboRLError(f"run directory '{args.resume}' does not exist; pass a directory created by 'robo-rl train'")
            print(json.dumps(dry_run(train_mod.load_run_config(Path(args.resume), overrides)), indent=2))
            return 0
        with stop_on_signals(StopRequest()) as stop:
            summary = train_mod.resume(Path(args.resume), overrides, stop=stop)
    else:
        if not args.config:
            raise RoboRLError("robo-rl train needs a CONFIG file (e.g. configs/quickstart.yaml) or --resume RUN_DIR")
        from robo_rl.config import load
        from robo_rl.run_config import TrainConfig

        cfg = load(TrainConfig, args.config, args.overrides)
        if args.dry_run:
            from robo_rl.runners.dry_run import dry_run

            print(json.dumps(dry_run(cfg), indent=2))
            return 0
        with stop_on_signals(StopRequest()) as stop:
            summary = train_mod.train(cfg, stop=stop)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    if stop.is_set():  # kept, but not finished: scripts chaining train && eval stop here
        print(f"robo-rl: interrupted; resume with 'robo-rl train --resume {summary.get('run_dir', 'RUN_DIR')}'",
              file=sys.stderr)
        return 130
    return 0


def summary_lines(summary: dict) -> list[str]:
    """The end of a run in a few lines: the final success with its CI, steps, time, where the files are."""
    lines = []
    final = summary.get("final_eval")
    if isinstance(final, dict) and "success_rate" in final:
        lines.append(f"[bold]success {final['success_rate']:.2f}[/bold] (95% CI [{final['ci95_low']:.2f}, "
                     f"{final['ci95_high']:.2f}]) over {final['episodes']} evaluation episodes")
    done = [f"{summary[k]:,} {k.replace('_', ' ')}" for k in ("env_steps", "gradient_steps") if k in summary]
    if "wall_time_min" in summary:
        done.append(f"{summary['wall_time_min']:.1f} min")
    if summary.get("stop_reason"):
        done.append(f"stopped by {summary['stop_reason']}")
    if done:
        lines.append(", ".join(done))
    run_dir = summary.get("run_dir")
    if run_dir:
        lines.append(f"run      {run_dir}")
        curve = Path(run_dir) / "learning_curve.png"
        if curve.is_file():
            lines.append(f"curve    {curve}")
    if summary.get("video"):
        lines.append(f"video    {summary['video']}")
    if run_dir:
        lines.append(f"summary  {Path(run_dir) / 'summary.json'} (print it with --json)")
    return lines


def print_summary(summary: dict) -> None:
    from rich.console import Console

    console = Console(highlight=False)
    for line in summary_lines(summary):
        console.print(line, soft_wrap=True)
