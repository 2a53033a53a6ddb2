"""`robo-rl checkpoint | info | bench | vla`: checkpoint upgrades, install checks, benchmarks, VLA assets."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from robo_rl.errors import RoboRLError


def cmd_checkpoint(args: argparse.Namespace) -> int:
    """``checkpoint upgrade RUN``: convert a run's pickled trainer.pt files to safetensors + JSON."""
    from robo_rl import checkpoint as ckpt_io
    from robo_rl.runlock import RunLock

    path = Path(args.run)
    if not path.is_dir():
        raise RoboRLError(f"'{path}' is not a directory; pass a run directory made by 'robo-rl train' (or a "
                          "checkpoints/step_* directory of one)")
    with RunLock(ckpt_io.run_of(path) if (path / "meta.json").is_file() else path):
        done = ckpt_io.upgrade(path)
    print(json.dumps(done, indent=2))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from robo_rl.info import collect

    report = collect()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for kind, names in report["registries"].items():
        console.print(f"[bold]{kind}[/]: {', '.join(names)}")
    table = Table("backend", "status", "detail")
    for name, item in report["backends"].items():
        table.add_row(name, "[green]ok[/]" if item["ok"] else "[red]unavailable[/]", item["detail"])
    console.print(table)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from benchmarks import run_bench

    return run_bench(args.name, args.bench_args)


def cmd_vla(args: argparse.Namespace) -> int:
    from vla.openvla.mini import build_mini

    if args.action_dim < 1 or args.image_size < 32:
        raise RoboRLError("--action-dim must be >= 1 and --image-size >= 32")
    from robo_rl.files import check_replaceable
    from vla.openvla.checkpoint import is_robo_rl_dir

    check_replaceable(Path(args.out), is_robo_rl_dir, "robo-rl OpenVLA checkpoint")  # before the slow build
    path = build_mini(args.out, image_size=args.image_size, action_dim=args.action_dim, llm_layers=args.llm_layers)
    print(json.dumps({"out": str(path)}))
    return 0
