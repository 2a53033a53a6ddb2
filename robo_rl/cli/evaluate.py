"""`robo-rl eval | compare | curves`: evaluate a checkpoint (directly, on a benchmark or through ROS 2),
compare evaluations, plot learning curves."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from robo_rl.errors import RoboRLError


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from robo_rl import checkpoint as ckpt_io

    ckpt_io.allow_large_models(args.allow_large)
    if args.report or args.compare:
        return _eval_report(args)
    _check_eval_args(args)
    torch.set_num_threads(1)
    if args.benchmark:
        return _eval_benchmark(args)
    if args.via_ros:
        from real_robot.sim_eval import evaluate_over_ros

        out_ros = evaluate_over_ros(args.checkpoint, args.via_ros, args.episodes, args.seed)
        print(f"success {out_ros['success_rate']:.3f} (95% CI [{out_ros['ci95_low']:.3f}, {out_ros['ci95_high']:.3f}]) "
              f"over {out_ros['episodes']} episodes via ROS 2", file=sys.stderr)
        emit_eval(out_ros, args.out)
        return 0
    return _eval_plain(args)


def _eval_report(args: argparse.Namespace) -> int:
    """``--report RESULTS [--compare OTHER] [--html]`` or ``--compare A B``: the benchmark report."""
    from robo_rl.eval.report import write_report

    if not args.report:  # robo-rl eval --compare A.json B.json
        if len(args.compare) != 2:
            raise RoboRLError("--compare without --report takes two results files: --compare A.json B.json")
        args.report, args.compare = args.compare[:1], args.compare[1:]
    from pathlib import Path

    md_path = Path(args.report_out) if args.report_out else Path(args.report[0]).with_suffix(".md")
    page = args.html or str(md_path.with_suffix(".html"))  # the HTML page always, next to the markdown by default
    md = write_report(args.report, args.compare, args.report_out, html=page)
    print(json.dumps({"report": str(md), "html": page}))
    return 0


def _check_eval_args(args: argparse.Namespace) -> None:
    """One-line errors for flag combinations that cannot work, before anything is built."""
    from robo_rl.errors import ConfigError

    if args.html:
        raise RoboRLError("--html writes the report of benchmark results: use it with --report RESULTS_JSON "
                          "[--compare OTHER_JSON]")
    if not args.checkpoint:
        raise RoboRLError("robo-rl eval needs a CHECKPOINT (or --report RESULTS_JSON)")
    if args.episodes < 1:
        raise RoboRLError(f"--episodes {args.episodes} must be >= 1")
    bad = [o for o in args.overrides if not o.startswith(("env.", "policy."))]
    if bad:
        raise ConfigError(f"eval takes env.* and policy.* overrides (e.g. policy.noise_level=0, "
                          f"env.variations.object_pose_jitter=0.05); got {', '.join(bad)}")
    if args.overrides and args.via_ros:
        raise ConfigError("eval overrides apply to the plain evaluation and --benchmark, not to --via-ros")
    if args.benchmark:
        from robo_rl.eval.benchmark import check_placement_overrides

        check_placement_overrides(args.overrides)
    if args.device != "cpu" and args.via_ros:
        raise ConfigError("--device is for sim evaluations; through ROS 2 the policy runs where the bridge's robot "
                          "config puts it")
    from robo_rl.rollout.device import resolve_device

    resolve_device(args.device, "--device")  # a GPU this machine lacks: one line before any env starts
    plain_only = [flag for flag, given in (("--video", args.video), ("--no-video", args.no_video)) if given]
    if plain_only and args.benchmark:
        raise ConfigError(f"{', '.join(plain_only)} apply to the plain evaluation; --benchmark records media with --media")
    if args.benchmark and not args.out:
        raise RoboRLError("--benchmark needs --out RESULTS_JSON")
    if args.video and not args.no_video:
        from robo_rl.eval.plots import check_video_path

        check_video_path(args.video)  # a bad name fails now, not after the episodes


def _eval_benchmark(args: argparse.Namespace) -> int:
    from robo_rl.eval.benchmark import evaluate_benchmark

    t0 = time.monotonic()
    res = evaluate_benchmark(args.checkpoint, args.benchmark, args.episodes, args.out, args.num_envs or None,
                             args.seed, block=args.block, task=args.task, strengths=tuple(args.strengths),
                             media=args.media, stochastic=args.stochastic, env_overrides=args.overrides,
                             device=args.device)
    minutes = (time.monotonic() - t0) / 60
    n_eps = sum(t["episodes"] for t in res["tasks"].values())
    print(f"{args.benchmark}: {n_eps} episodes, {minutes:.2f} min in this call = {n_eps / max(minutes, 1e-9):.1f} "
          "episodes/min (resumed blocks count as episodes but took no time)", file=sys.stderr)
    print(json.dumps({"out": args.out, "aggregate": res["aggregate"],
                      "tasks": {k: v["success_rate"] for k, v in res["tasks"].items()}}, indent=2))
    return 0


def _eval_plain(args: argparse.Namespace) -> int:
    """The checkpoint's own env (with ``env.*``/``policy.*`` overrides): success, CI, video."""
    import torch

    from robo_rl import checkpoint as ckpt_io
    from robo_rl.build import build_env, build_policy, check_model_size, load_run, with_num_envs
    from robo_rl.config import apply_overrides, from_dict
    from robo_rl.rollout.device import on_device, place, resolve_device
    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.evaluate import evaluate_policy, save_video

    device = resolve_device(args.device, "--device")
    run = load_run(args.checkpoint)
    ckpt, cfg = run.ckpt, run.config
    if args.overrides:  # a bad key or value is the override's fault: its own one-line error
        cfg = from_dict(TrainConfig, apply_overrides(run.meta["config"], args.overrides))
    check_model_size(cfg.policy, run.obs_spec, run.action_spec, f"checkpoint '{ckpt}'")
    env_cfg = with_num_envs(cfg.env, args.num_envs) if args.num_envs else cfg.env
    env = build_env(env_cfg, render=not args.no_video)
    try:
        policy = build_policy(cfg.policy, env.obs_spec, env.action_spec)
        ckpt_io.load_into(policy, ckpt_io.load_model_state(ckpt), ckpt)
        place(policy, device).eval()
        if args.stochastic:  # the same --seed draws the same action noise: reproducible sampled evaluations
            torch.manual_seed(args.seed)
        res = evaluate_policy(env, on_device(policy, device), args.episodes, seed=args.seed, deterministic=not args.stochastic,
                              record_video=not args.no_video)
    finally:
        env.close()
    out = {"checkpoint": str(ckpt), "env_steps": run.meta.get("env_steps"), **res.as_dict()}
    if not args.no_video:
        video = Path(args.video) if args.video else ckpt.parent.parent / f"eval_{ckpt.name}.mp4"
        try:
            out["video"] = str(save_video(res, video))
        except (OSError, ValueError) as err:  # the results are kept: written to --out, printed, then the error
            emit_eval(out, args.out)
            why = err.strerror if isinstance(err, OSError) else str(err).splitlines()[0]
            raise RoboRLError(f"cannot write video '{video}' ({why}); the results above are complete; pass --video "
                              "PATH.mp4 in a writable place") from None
    lo, hi = res.ci95
    print(f"success {res.success_rate:.3f} (95% CI [{lo:.3f}, {hi:.3f}]) over {res.episodes} episodes", file=sys.stderr)
    emit_eval(out, args.out)
    return 0


def emit_eval(result: dict, path: str | None) -> None:
    """Print an evaluation's JSON and, with ``--out``, write it atomically (the file ``robo-rl compare`` reads)."""
    text = json.dumps(result, indent=2)
    print(text, flush=True)  # first: a failed write below never loses the results
    if path:
        from robo_rl.files import atomic_write_text

        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(path), text + "\n")
        except OSError as err:
            raise RoboRLError(f"cannot write '{path}' ({err.strerror}); the results are printed above; pass --out "
                              "in a writable place") from None


def cmd_compare(args: argparse.Namespace) -> int:
    """Two policies' evaluations on the same starts: the paired success difference and its CI."""
    from robo_rl.eval.paired import compare

    res = compare(args.a, args.b)
    p = res["paired"]
    print(f"A {res['a']['success_rate']:.3f} vs B {res['b']['success_rate']:.3f} over {res['episodes']} paired episodes: "
          f"A - B {p['difference']:+.3f} [{p['low']:+.3f}, {p['high']:+.3f}] (95% paired bootstrap; unpaired "
          f"[{res['unpaired']['low']:+.3f}, {res['unpaired']['high']:+.3f}]); A only {p['a_only']}, B only "
          f"{p['b_only']}, McNemar p = {p['mcnemar_p']:.3f}", file=sys.stderr)
    for part, sub in res.get("by_offset", {}).items():
        q = sub["paired"]
        print(f"  {part}: A {sub['a']['success_rate']:.3f} vs B {sub['b']['success_rate']:.3f} over {sub['episodes']}: "
              f"A - B {q['difference']:+.3f} [{q['low']:+.3f}, {q['high']:+.3f}], McNemar p = {q['mcnemar_p']:.3f}",
              file=sys.stderr)
    print(json.dumps(res, indent=2))
    return 0


def cmd_curves(args: argparse.Namespace) -> int:
    """Seed groups of runs compared: binned mean/min/max of a metric, a band plot, the final evaluations."""
    from pathlib import Path

    from robo_rl.eval.plots import curve_groups, first_reach

    if args.bin < 1:
        raise RoboRLError(f"--bin {args.bin} must be >= 1 (env steps per bin)")
    if args.window < 1:
        raise RoboRLError(f"--window {args.window} must be >= 1 (logged rows averaged for --reach)")
    groups: dict[str, list[Path]] = {}
    finals: dict[str, list[float]] = {}
    for spec in args.group:
        label, sep, dirs = spec.partition("=")
        if not sep or not dirs:
            raise RoboRLError(f"--group {spec!r}: use LABEL=RUN_DIR[,RUN_DIR...]")
        for d in dirs.split(","):
            csv_path = Path(d) / "metrics.csv"
            if not csv_path.is_file():
                raise RoboRLError(f"--group {label}: '{d}' has no metrics.csv; pass run directories made by 'robo-rl train'")
            with open(csv_path, newline="") as fh:
                columns = next(csv.reader(fh), [])
            if args.metric not in columns:
                raise RoboRLError(f"--metric {args.metric!r} is not a column of '{csv_path}'; its columns: "
                                  f"{', '.join(c for c in columns if c != 'env_steps')}")
            groups.setdefault(label, []).append(csv_path)
            summary = Path(d) / "summary.json"
            if summary.is_file():
                final = json.loads(summary.read_text()).get("final_eval")
                if final:
                    finals.setdefault(label, []).append(final["success_rate"])
    table = curve_groups(groups, Path(args.out), args.metric, args.bin)
    steps = sorted({x for rows in table.values() for x, *_ in rows})
    print(f"{args.metric} per {args.bin} env steps: seed mean [min, max]")
    print(f"{'steps':>8} " + " ".join(f"{k:>22}" for k in table))
    for x in steps:
        cells = []
        for rows in table.values():
            hit = [r for r in rows if r[0] == x]
            cells.append(f"{hit[0][1]:.2f} [{hit[0][2]:.2f}, {hit[0][3]:.2f}]" if hit else "-")
        print(f"{x:>8} " + " ".join(f"{c:>22}" for c in cells))
    for label, rows in table.items():
        auc = sum(r[1] for r in rows) / max(1, len(rows))
        fin = finals.get(label)
        print(f"{label}: mean over the curve {auc:.3f}" + (f"; final evaluations {', '.join(f'{f:.2f}' for f in fin)} "
                                                          f"(mean {sum(fin) / len(fin):.3f})" if fin else ""))
    if args.reach is not None:
        for label, paths in groups.items():
            hits = [first_reach(p, args.metric, args.reach, args.window) for p in paths]
            cells = [f"{h[0]:.0f} steps / {h[1]:.1f} min" if h else "not reached" for h in hits]
            print(f"{label}: first reaches {args.reach:g} (mean of {args.window} rows) at {'; '.join(cells)}")
    print(f"plot: {args.out}")
    return 0
