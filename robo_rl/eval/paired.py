"""Paired comparison of two policies' evaluations (``robo-rl compare``).

Evaluations written by ``robo-rl eval`` / ``robo-rl steer eval`` hold ``episode_success`` (benchmark results
files: per-episode outcomes in each block, read task by task and block by block): per env, the
outcomes of its episodes in order. With the same seed and env count, env i's k-th episode starts from the
same initial state under both policies, so outcomes pair up and the difference's CI can use the pairing.
Several files per side (e.g. two seed sets) are concatenated in the order given. Evaluations of a mixed
split (``env.variations.offset_prob`` < 1) also hold ``episode_offset``; the comparison is then repeated on
the shifted and on the in-distribution episodes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from robo_rl.errors import RoboRLError


def _check_outcomes(path: str, key: str, per_env: Any) -> None:
    """``per_env`` must be a list (one entry per env) of lists of 0/1 (or true/false) per episode."""
    ok = isinstance(per_env, list) and all(
        isinstance(e, list) and all(isinstance(x, (int, bool)) and x in (0, 1) for x in e) for e in per_env)
    if not ok:
        got = json.dumps(per_env)
        raise RoboRLError(f"{path}: '{key}' must be a list per env of per-episode 0/1 outcomes, e.g. [[1, 0], [0, 1]]; "
                          f"got {got[:60] + '...' if len(got) > 60 else got}")


def benchmark_outcomes(path: str, d: dict[str, Any]) -> list[list[int]]:
    """A benchmark results file's outcomes, one list per block (task by task in ``task_set`` order, block by
    block), each in episode order: env i's k-th episode of a block with B envs is episode i + k B, the
    episode whose seed is pinned, so two files with the same seed pair up whatever their env counts."""
    out: list[list[int]] = []
    tasks = d.get("tasks") if isinstance(d.get("tasks"), dict) else {}
    for task in d.get("task_set") or list(tasks):
        blocks = tasks.get(task, {}).get("blocks", {})
        for b in sorted(blocks, key=int):
            rec = blocks[b]
            if not isinstance(rec, list) or len(rec) < 4:
                raise RoboRLError(f"{path}: benchmark block {task} #{b} holds counts, not per-episode outcomes (an "
                                  "expert reference or an older file); pair evaluations of checkpoints made with "
                                  "this version of 'robo-rl eval --benchmark'")
            _check_outcomes(path, f"tasks.{task}.blocks.{b}[3]", rec[3])
            per_env = rec[3]
            longest = max((len(e) for e in per_env), default=0)
            out.append([int(e[k]) for k in range(longest) for e in per_env if k < len(e)])
    return out


def load_outcomes(paths: list[str]) -> tuple[np.ndarray, list[tuple[int, ...]], np.ndarray | None]:
    """Concatenated outcomes (N,) of evaluation JSON files (or run directories / their summary.json:
    the final evaluation of ``robo-rl train``), each file's per-env episode counts, and the episodes'
    offset tags (N,) bool when every file has them (a mixed split), else None."""
    out, layouts, tags = [], [], []
    for p in paths:
        if Path(p).is_dir():  # a run directory: its training run's final evaluation
            p = str(Path(p) / "summary.json")
        try:
            d = json.loads(Path(p).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise RoboRLError(f"{p}: not a readable evaluation JSON ({err}); pass files written by 'robo-rl eval' "
                              "or 'robo-rl steer eval', or a run directory with a final evaluation") from None
        if isinstance(d, dict) and isinstance(d.get("final_eval"), dict):
            d = d["final_eval"]
        per_env = d.get("episode_success") if isinstance(d, dict) else None
        if not per_env and isinstance(d, dict) and "schema" in d and "tasks" in d:
            per_env = benchmark_outcomes(p, d)
        if not per_env:
            raise RoboRLError(f"{p}: no 'episode_success' (per-episode outcomes); re-run the evaluation with this "
                              "version of 'robo-rl eval' / 'robo-rl steer eval'")
        _check_outcomes(p, "episode_success", per_env)
        layouts.append(tuple(len(e) for e in per_env))
        out.extend(int(x) for e in per_env for x in e)
        offsets = d.get("episode_offset")
        if offsets is not None and tags is not None:
            _check_outcomes(p, "episode_offset", offsets)
            if [len(e) for e in offsets] != [len(e) for e in per_env]:
                raise RoboRLError(f"{p}: 'episode_offset' does not match 'episode_success' episode for episode")
            tags.extend(bool(x) for e in offsets for x in e)
        else:
            tags = None
    return np.asarray(out, dtype=np.int64), layouts, (np.asarray(tags, dtype=bool) if tags is not None else None)


def compare(a_paths: list[str], b_paths: list[str], reps: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Success rates of A and B, the paired difference A - B with its bootstrap CI and McNemar p-value,
    and the unpaired CI for reference. Raises when the files do not pair (other seeds' layouts)."""
    from robo_rl.eval.metrics import wilson_interval
    from robo_rl.eval.stats import paired_difference, success_difference

    a, la, ta = load_outcomes(a_paths)
    b, lb, tb = load_outcomes(b_paths)
    if la != lb:
        raise RoboRLError(f"the evaluations do not pair: per-env episode counts {la} (A) vs {lb} (B); evaluate both "
                          "with the same --episodes, --num-envs and seeds, and list the files in the same order")
    if ta is not None and tb is not None and not np.array_equal(ta, tb):
        raise RoboRLError("the evaluations do not pair: their episodes' offset tags (episode_offset) differ; evaluate "
                          "both on the same split (env.variations) with the same seeds")

    def one(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
        res: dict[str, Any] = {"episodes": int(a.size)}
        for name, x in (("a", a), ("b", b)):
            lo, hi = wilson_interval(int(x.sum()), int(x.size))
            res[name] = {"success_rate": float(x.mean()) if x.size else float("nan"), "ci95_low": lo, "ci95_high": hi}
        res["paired"] = paired_difference(a, b, reps=reps, seed=seed)
        d, lo, hi = success_difference([a.sum()], [a.size], [b.sum()], [b.size], reps=reps, seed=seed)
        res["unpaired"] = {"difference": d, "low": lo, "high": hi}
        return res

    res = one(a, b)
    if ta is not None and tb is not None and 0 < ta.sum() < ta.size:
        res["by_offset"] = {"shifted": one(a[ta], b[ta]), "in_distribution": one(a[~ta], b[~ta])}
    return res
