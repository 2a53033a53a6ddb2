"""`robo-rl train`: a training run from a config, or resumed from a run directory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from robo_rl.errors import RoboRLError


def cmd_train(args: argparse.Namespace) -> int:
    from robo_rl import checkpoint as ckpt_io
    from robo_rl.runners import train as train_mod

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
        summary = train_mod.resume(Path(args.resume), overrides)
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
        summary = train_mod.train(cfg)
    print(json.dumps(summary, indent=2))
    return 0
