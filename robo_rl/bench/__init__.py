"""Benchmarks that print ratios measured side by side in one run (`robo-rl bench NAME`)."""

from __future__ import annotations

import importlib

from robo_rl.errors import RoboRLError

BENCHES = {"env": "robo_rl.bench.env_overhead", "ppo": "robo_rl.bench.ppo_vs_sb3", "decode": "robo_rl.bench.decode",
           "ros": "robo_rl.bench.ros_latency", "sample": "robo_rl.bench.sample",
           "rollout": "robo_rl.bench.rollout", "scale": "robo_rl.bench.scale",
           "chunks": "robo_rl.bench.chunks"}


def run_bench(name: str, argv: list[str]) -> int:
    if name not in BENCHES:
        raise RoboRLError(f"unknown benchmark {name!r}; choose one of {', '.join(sorted(BENCHES))}")
    return int(importlib.import_module(BENCHES[name]).main(argv) or 0)
