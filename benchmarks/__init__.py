"""Benchmarks that print ratios measured side by side in one run (`robo-rl bench NAME`)."""

from __future__ import annotations

import importlib

from robo_rl.errors import RoboRLError

BENCHES = {"env": "benchmarks.env_overhead", "ppo": "benchmarks.ppo_vs_sb3", "decode": "benchmarks.decode",
           "ros": "benchmarks.ros_latency", "sample": "benchmarks.sample",
           "rollout": "benchmarks.rollout", "scale": "benchmarks.scale",
           "chunks": "benchmarks.chunks", "sil": "benchmarks.sil_update"}


def run_bench(name: str, argv: list[str]) -> int:
    if name not in BENCHES:
        raise RoboRLError(f"unknown benchmark {name!r}; choose one of {', '.join(sorted(BENCHES))}")
    return int(importlib.import_module(BENCHES[name]).main(argv) or 0)
