"""`robo-rl train | eval | info | demos | bench`.

Every user error (config, checkpoint, CLI argument) ends as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from robo_rl.errors import RoboRLError

log = logging.getLogger("robo_rl")


def _setup_logging(verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        logging.basicConfig(level=level, format="%(message)s", handlers=[RichHandler(show_path=False)])
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("matplotlib", "PIL", "h5py"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


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


def cmd_eval(args: argparse.Namespace) -> int:

    import torch

    from robo_rl import checkpoint as ckpt_io
    from robo_rl.build import build_env, build_policy, with_num_envs
    from robo_rl.config import apply_overrides, from_dict
    from robo_rl.errors import CheckpointError, ConfigError
    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.evaluate import evaluate_policy, save_video

    ckpt_io.allow_large_models(args.allow_large)
    if args.report or args.compare:
        from robo_rl.eval.report import write_report

        if not args.report:  # robo-rl eval --compare A.json B.json
            if len(args.compare) != 2:
                raise RoboRLError("--compare without --report takes two results files: --compare A.json B.json")
            args.report, args.compare = args.compare[:1], args.compare[1:]
        md = write_report(args.report, args.compare, args.report_out, html=args.html)
        print(json.dumps({"report": str(md), **({"html": args.html} if args.html else {})}))
        return 0
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
    if args.overrides and (args.benchmark or args.via_ros):
        raise ConfigError("eval overrides apply to the plain evaluation, not to --benchmark or --via-ros")
    plain_only = [flag for flag, given in (("--stochastic", args.stochastic), ("--video", args.video),
                                           ("--no-video", args.no_video)) if given]
    if plain_only and args.benchmark:
        raise ConfigError(f"{', '.join(plain_only)} apply to the plain evaluation; --benchmark evaluates greedy actions "
                          "and records media with --media")
    if args.video and not args.no_video:
        from robo_rl.eval.plots import check_video_path

        check_video_path(args.video)  # a bad name fails now, not after the episodes
    torch.set_num_threads(1)
    if args.benchmark:
        from robo_rl.eval.benchmark import evaluate_benchmark

        if not args.out:
            raise RoboRLError("--benchmark needs --out RESULTS_JSON")
        t0 = time.monotonic()
        res = evaluate_benchmark(args.checkpoint, args.benchmark, args.episodes, args.out, args.num_envs or None,
                                 args.seed, block=args.block, task=args.task, strengths=tuple(args.strengths),
                                 media=args.media)
        minutes = (time.monotonic() - t0) / 60
        n_eps = sum(t["episodes"] for t in res["tasks"].values())
        print(f"{args.benchmark}: {n_eps} episodes, {minutes:.2f} min in this call = {n_eps / max(minutes, 1e-9):.1f} "
              "episodes/min (resumed blocks count as episodes but took no time)", file=sys.stderr)
        print(json.dumps({"out": args.out, "aggregate": res["aggregate"],
                          "tasks": {k: v["success_rate"] for k, v in res["tasks"].items()}}, indent=2))
        return 0
    if args.via_ros:
        from real_robot.sim_eval import evaluate_over_ros

        out_ros = evaluate_over_ros(args.checkpoint, args.via_ros, args.episodes, args.seed)
        print(f"success {out_ros['success_rate']:.3f} (95% CI [{out_ros['ci95_low']:.3f}, {out_ros['ci95_high']:.3f}]) "
              f"over {out_ros['episodes']} episodes via ROS 2", file=sys.stderr)
        _emit_eval(out_ros, args.out)
        return 0
    ckpt = ckpt_io.resolve(args.checkpoint)
    meta = ckpt_io.read_meta(ckpt)
    try:
        cfg = from_dict(TrainConfig, meta["config"])
    except (KeyError, ConfigError) as err:
        raise CheckpointError(f"checkpoint '{ckpt}' carries an unusable config ({err})") from None
    if args.overrides:  # a bad key or value is the override's fault: its own one-line error
        cfg = from_dict(TrainConfig, apply_overrides(meta["config"], args.overrides))
    from robo_rl.build import check_model_size

    check_model_size(cfg.policy, *ckpt_io.specs_from_meta(meta, ckpt), f"checkpoint '{ckpt}'")
    env_cfg = cfg.env
    if args.num_envs:
        env_cfg = with_num_envs(env_cfg, args.num_envs)
    env = build_env(env_cfg, render=not args.no_video)
    try:
        policy = build_policy(cfg.policy, env.obs_spec, env.action_spec)
        ckpt_io.load_into(policy, ckpt_io.load_model_state(ckpt), ckpt)
        policy.eval()
        if args.stochastic:  # the same --seed draws the same action noise: reproducible sampled evaluations
            torch.manual_seed(args.seed)
        res = evaluate_policy(env, policy, args.episodes, seed=args.seed, deterministic=not args.stochastic,
                              record_video=not args.no_video)
    finally:
        env.close()
    out = {"checkpoint": str(ckpt), "env_steps": meta.get("env_steps"), **res.as_dict()}
    if not args.no_video:
        video = Path(args.video) if args.video else ckpt.parent.parent / f"eval_{ckpt.name}.mp4"
        try:
            out["video"] = str(save_video(res, video))
        except (OSError, ValueError) as err:  # the results are kept: written to --out, printed, then the error
            _emit_eval(out, args.out)
            why = err.strerror if isinstance(err, OSError) else str(err).splitlines()[0]
            raise RoboRLError(f"cannot write video '{video}' ({why}); the results above are complete; pass --video "
                              "PATH.mp4 in a writable place") from None
    lo, hi = res.ci95
    print(f"success {res.success_rate:.3f} (95% CI [{lo:.3f}, {hi:.3f}]) over {res.episodes} episodes", file=sys.stderr)
    _emit_eval(out, args.out)
    return 0


def _emit_eval(result: dict, path: str | None) -> None:
    """Print an evaluation's JSON and, with ``--out``, write it atomically (the file ``robo-rl compare`` reads)."""
    text = json.dumps(result, indent=2)
    print(text, flush=True)  # first: a failed write below never loses the results
    if path:
        from robo_rl.checkpoint import atomic_write_text

        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(path), text + "\n")
        except OSError as err:
            raise RoboRLError(f"cannot write '{path}' ({err.strerror}); the results are printed above; pass --out "
                              "in a writable place") from None


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
    from robo_rl.bench import run_bench

    return run_bench(args.name, args.bench_args)


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


def _strengths(text: str) -> list[float]:
    """``--strengths 0,0.5,1`` -> [0.0, 0.5, 1.0] (argparse turns the error into one usage line)."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not 0 <= v < float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers >= 0, e.g. 0,0.5,1,2")
    return values


def cmd_curves(args: argparse.Namespace) -> int:
    """Seed groups of runs compared: binned mean/min/max of a metric, a band plot, the final evaluations."""
    from pathlib import Path

    from robo_rl.eval.plots import curve_groups

    if args.bin < 1:
        raise RoboRLError(f"--bin {args.bin} must be >= 1 (env steps per bin)")
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
    print(f"plot: {args.out}")
    return 0


def cmd_demos(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from robo_rl.data.episodes import write_episodes

    if args.episodes < 1:
        raise RoboRLError(f"--episodes {args.episodes} must be >= 1")
    attempts, successes = [0], [0]
    from rich.console import Console

    with Progress(TextColumn(f"[bold]demos {args.task}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), console=Console(stderr=True)) as progress:
        bar = progress.add_task("demos", total=args.episodes, info="")

        def on_episode(ep: Any, kept: bool) -> None:
            attempts[0] += 1
            successes[0] += int(ep.succeeded)
            progress.update(bar, advance=int(kept), info=f"expert success {successes[0]}/{attempts[0]}")

        if args.sim == "libero":
            import os

            from sims.libero.experts import generate as libero_generate

            os.environ.setdefault("MUJOCO_GL", "osmesa")
            os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")
            suite, _, idx = args.task.partition("/")
            if idx and not idx.isdigit():
                raise RoboRLError(f"--task {args.task!r}: expected SUITE/INDEX with an integer index, e.g. libero_object/0")
            maniskill_only = {"--workers": (args.workers, 1), "--expert": (args.expert, "planner"),
                              "--noise": (args.noise, 0.0), "--max-steps": (args.max_steps, 50),
                              "--robot": (args.robot, None)}
            given = [flag for flag, (value, default) in maniskill_only.items() if value != default]
            if given:
                raise RoboRLError(f"{', '.join(given)} apply to --sim maniskill only; LIBERO demos are the scripted "
                                  "expert's rgb + state episodes in one process: drop them")
            eps = list(libero_generate(suite, int(idx or 0), args.episodes, seed=args.seed, image_size=args.image_size,
                                       only_success=args.only_success, on_episode=on_episode))
            meta = {"env": "libero", "task": args.task, "control_mode": "OSC_POSE delta + gripper", "obs_mode": "rgb",
                    "source": "scripted pick-and-place expert (privileged object poses)"}
        else:
            from sims.maniskill.experts import KINDS, generate

            eps = list(generate(args.task, args.episodes, seed=args.seed, obs_mode=args.obs_mode,
                                image_size=args.image_size, only_success=args.only_success, on_episode=on_episode,
                                workers=args.workers, kind=args.expert, noise=args.noise, max_steps=args.max_steps,
                                robot=args.robot))
            meta = {"env": "maniskill", "task": args.task, "control_mode": KINDS[args.expert], "obs_mode": args.obs_mode,
                    "source": "ManiSkill motion-planning solution" if args.expert == "planner" else
                    f"robo-rl scripted end-effector expert (DART noise {args.noise})"}
            if args.robot:
                meta["robot_uids"] = args.robot
    meta.update(seed=args.seed, attempts=attempts[0], expert_success_rate=successes[0] / max(1, attempts[0]))
    if not eps:
        why = (f"the expert succeeded in none of {attempts[0]} attempts on {args.task}, so --only-success kept nothing"
               if args.only_success and attempts[0] else f"the expert produced no episode on {args.task} (no plan found)")
        raise RoboRLError(f"{why}; no file was written; try other --seed values"
                          + (" or drop --only-success" if args.only_success else ""))
    try:
        path = write_episodes(args.out, eps, meta)
    except OSError as err:
        raise RoboRLError(f"cannot write '{args.out}' ({err.strerror}); pass --out in a writable place") from None
    print(json.dumps({"out": str(path), "episodes": len(eps), "attempts": attempts[0],
                      "expert_success_rate": meta["expert_success_rate"]}, indent=2))
    return 0


def cmd_demos_convert(args: argparse.Namespace) -> int:
    from real_robot.bag_episodes import convert_recordings, is_bag

    missing = [s for s in args.src if not Path(s).exists()]
    if args.robot and missing:
        raise RoboRLError(f"recording '{missing[0]}' does not exist; pass rosbag2 bag directories or "
                          ".mcap/.db3 files")
    bags = [is_bag(s) for s in args.src]
    given = {"--control-mode": args.control_mode, "--drop-unconvertible": args.drop_unconvertible,
             "--robot": args.robot, "--split-gap": args.split_gap is not None,
             "--keep-holds": args.keep_holds, "--success": args.success}
    if any(bags):  # rosbag2 recordings -> episodes in the robot's action space
        h5_only = [f for f in ("--control-mode", "--drop-unconvertible") if given[f]]
        if not all(bags):
            others = ", ".join(s for s, b in zip(args.src, bags) if not b)
            raise RoboRLError("demos convert takes rosbag2 recordings (directories or .mcap/.db3 files) "
                              f"or one episodes .h5 file, not both: {others}")
        if h5_only:
            raise RoboRLError(f"{', '.join(h5_only)}: only for an episodes .h5 file, not rosbag2 recordings; "
                              "drop it")
        if not args.robot:
            raise RoboRLError("converting rosbag2 recordings needs --robot ROBOT_YAML "
                              "(e.g. configs/robots/panda_sim.yaml)")
        print(json.dumps(convert_recordings(args.src, args.robot, args.out, args.split_gap, args.keep_holds,
                                            args.success), indent=2))
        return 0
    bag_only = [f for f in ("--robot", "--split-gap", "--keep-holds", "--success") if given[f]]
    if bag_only:
        raise RoboRLError(f"{', '.join(bag_only)}: only for rosbag2 recordings, not an episodes .h5 file; "
                          "drop it")
    if len(args.src) != 1 or not args.control_mode:
        raise RoboRLError("an episodes .h5 file converts alone, with --control-mode "
                          "(e.g. pd_joint_delta_pos)")
    args.src = args.src[0]
    from robo_rl.data.episodes import load_episodes, read_meta, write_episodes
    from sims.maniskill.convert import convert

    meta = read_meta(args.src)
    src_mode = str(meta.get("control_mode", ""))
    from robo_rl.data.episodes import DatasetError

    eps, dropped = [], []
    for ep in load_episodes(args.src):
        try:
            eps.append(convert(ep, src_mode, args.control_mode))
        except DatasetError as err:
            if not args.drop_unconvertible or "cannot be converted exactly" not in str(err):
                raise
            dropped.append(ep.seed)
    if not eps:
        raise RoboRLError(f"no episode of '{args.src}' converts exactly to {args.control_mode}")
    clipped = sum(int(ep.extra.get("clipped_steps", 0)) for ep in eps)
    meta = {**meta, "control_mode": args.control_mode, "converted_from": src_mode, "clipped_steps": clipped,
            "dropped_seeds": dropped}
    try:
        path = write_episodes(args.out, eps, meta)
    except OSError as err:
        raise RoboRLError(f"cannot write '{args.out}' ({err.strerror}); pass --out in a writable place") from None
    print(json.dumps({"out": str(path), "episodes": len(eps), "control_mode": args.control_mode,
                      "steps": sum(ep.length for ep in eps), "clipped_steps": clipped,
                      "dropped_unconvertible": len(dropped)}, indent=2))
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from real_robot.deploy import run
    from robo_rl import checkpoint as ckpt_io

    ckpt_io.allow_large_models(args.allow_large)
    ros_args = ["--ros-args", *args.ros_args] if args.ros_args is not None else None
    summary = run(args.checkpoint, args.robot, args.transport, args.seconds, record=args.record, managed=args.managed,
                  ros_args=ros_args)
    print(json.dumps(summary, indent=2), flush=True)
    # The final safe command is out and everything is closed; skip the interpreter's teardown of torch and
    # rclpy (~0.4 s) so a stopped deployment exits within a second of its final command.
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)


def cmd_steer(args: argparse.Namespace) -> int:
    from robo_rl import checkpoint as ckpt_io
    from robo_rl.runners import steer

    ckpt_io.allow_large_models(args.allow_large)
    if args.steer_command == "collect":
        out = steer.collect(args.checkpoint, args.episodes, args.out, args.num_envs, args.seed or 0, args.overrides,
                            explore=args.explore, explore_per=args.explore_per)
    elif args.steer_command == "fit":
        out = steer.fit(args.checkpoint, args.log, args.out, steps=args.steps, beta=args.beta, tau=args.tau,
                        baseline=not args.no_baseline, advantage=args.advantage, temperature=args.temperature,
                        shared_head=not args.two_heads, gae_lambda=args.gae_lambda, head=args.head,
                        returns=args.returns, fail_log=args.fail_log)
    else:
        out = steer.evaluate(args.checkpoint, args.steering, args.episodes, args.mode,
                             10_000 if args.seed is None else args.seed, args.num_envs, args.overrides, tau=args.tau,
                             beta=args.beta, stochastic=args.stochastic)
    _emit_eval(out, args.out if args.steer_command == "eval" else None)  # collect/fit's --out is their own file
    return 0


def cmd_vla(args: argparse.Namespace) -> int:
    from vla.openvla.mini import build_mini

    if args.action_dim < 1 or args.image_size < 32:
        raise RoboRLError("--action-dim must be >= 1 and --image-size >= 32")
    from robo_rl.checkpoint import check_replaceable
    from vla.openvla.checkpoint import is_robo_rl_dir

    check_replaceable(Path(args.out), is_robo_rl_dir, "robo-rl OpenVLA checkpoint")  # before the slow build
    path = build_mini(args.out, image_size=args.image_size, action_dim=args.action_dim, llm_layers=args.llm_layers)
    print(json.dumps({"out": str(path)}))
    return 0


def _tau_arg(text: str) -> float | str:
    """``--tau``: a probability in [0, 1] or 'auto'."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability in [0, 1] or 'auto'") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability in [0, 1] or 'auto'")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="robo-rl", description="RL post-training of robot policies.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a policy from a YAML config")
    t.add_argument("config", nargs="?", help="YAML config, e.g. configs/quickstart.yaml")
    t.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.lr=3e-4 env.num_envs=4")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    t.add_argument("--dry-run", action="store_true", help="build env (1 env, CPU), policy (no weights) and algorithm, then stop")
    t.add_argument("--allow-large", action="store_true",
                   help="build models a checkpoint describes even above 100M parameters (resume, teacher)")
    t.set_defaults(fn=cmd_train)

    e = sub.add_parser("eval", help="evaluate a run or checkpoint (or a benchmark of it; or report benchmark results)")
    e.add_argument("checkpoint", nargs="?", help="run directory or checkpoints/step_* directory; with --benchmark also "
                   "'random' or 'expert' (reference policies: uniform actions, the simulator's scripted expert)")
    e.add_argument("--task", help="with --benchmark: the ManiSkill task of a reference policy (default PickCube-v1), or "
                        "SUITE/INDEX (e.g. libero_object/3) for one task of a LIBERO suite")
    e.add_argument("--benchmark", help="named benchmark (libero-spatial, maniskill-vision, ...): results JSON to --out")
    e.add_argument("--out", help="results JSON: with --benchmark resumed if it holds finished blocks of the same "
                   "evaluation; otherwise the evaluation's JSON (what robo-rl compare reads)")
    e.add_argument("--report", metavar="RESULTS_JSON", nargs="+",
                   help="write a markdown + PNG report of benchmark results (one section per file)")
    e.add_argument("--compare", metavar="RESULTS_JSON", nargs="+",
                   help="a second policy's results side by side (with --report), or A.json B.json alone")
    e.add_argument("--report-out", metavar="MD", help="report path (default: the first results file with .md)")
    e.add_argument("--html", metavar="HTML", help="with --report: also write the report as one self-contained HTML "
                   "page (charts, thumbnails and videos embedded)")
    e.add_argument("--episodes", type=int, default=50)
    e.add_argument("--num-envs", type=int, default=0, help="parallel envs (default: the run's)")
    e.add_argument("--strengths", type=_strengths, default=[1.0],
                   help="with --benchmark: comma-separated multiples of the split's variations to sweep, e.g. 0,0.5,1,2")
    e.add_argument("--media", action="store_true", help="with --benchmark: thumbnails + video of a few episodes per task")
    e.add_argument("--block", type=int, default=10, help="with --benchmark: episodes per block (the unit of resumption)")
    e.add_argument("--seed", type=int, default=10_000)
    e.add_argument("--stochastic", action="store_true", help="sample actions instead of the mean")
    e.add_argument("--video", help="mp4 path (default: <run>/eval_<checkpoint>.mp4)")
    e.add_argument("--no-video", action="store_true")
    e.add_argument("--via-ros", metavar="ROBOT_YAML", help="evaluate through the ROS 2 bridge against the simulated robot process")
    e.add_argument("overrides", nargs="*", help="env.key=value / policy.key=value overrides of the checkpoint's config, "
                   "e.g. an OOD variation or a pi0 sampler setting (policy.noise_level=0 with --stochastic)")
    e.add_argument("--allow-large", action="store_true",
                   help="build the checkpoint's model even above 100M parameters")
    e.set_defaults(fn=cmd_eval)

    ck = sub.add_parser("checkpoint", help="checkpoint utilities")
    cksub = ck.add_subparsers(dest="checkpoint_command", required=True)
    up = cksub.add_parser("upgrade", help="convert a run's pickled trainer.pt (older robo-rl) to trainer."
                                          "safetensors + trainer.json, loading only the types robo-rl wrote")
    up.add_argument("run", metavar="RUN",
                    help="run directory (every checkpoint) or one checkpoints/step_* directory")
    up.set_defaults(fn=cmd_checkpoint)

    i = sub.add_parser("info", help="what is registered and which simulator backends work here")
    i.add_argument("--json", action="store_true")
    i.set_defaults(fn=cmd_info)

    d = sub.add_parser("demos", help="expert demonstrations")
    dsub = d.add_subparsers(dest="demos_command", required=True)
    g = dsub.add_parser("generate", help="record expert demonstrations (ManiSkill motion planning, LIBERO scripted) to a robo-rl episodes file")
    g.add_argument("--sim", choices=["maniskill", "libero"], default="maniskill")
    g.add_argument("--task", default="PickCube-v1", help="ManiSkill env id, or LIBERO suite/task_index (libero_object/0)")
    g.add_argument("--episodes", type=int, default=100)
    g.add_argument("--out", required=True, help="output .h5 file")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--obs-mode", choices=["state", "rgb"], default="state")
    g.add_argument("--image-size", type=int, default=128)
    g.add_argument("--only-success", action="store_true", help="drop failed expert attempts")
    g.add_argument("--workers", type=int, default=1,
                   help="ManiSkill: expert processes in parallel (same episodes, in seed order, as one)")
    g.add_argument("--expert", choices=["planner", "scripted"], default="planner",
                   help="ManiSkill: mplib motion planner (pd_joint_pos actions) or the scripted closed-loop "
                        "end-effector expert (pd_ee_delta_pos; PickCube-v1, PushCube-v1)")
    g.add_argument("--noise", type=float, default=0.0,
                   help="scripted expert: std of Gaussian noise on the executed arm action (labels stay clean)")
    g.add_argument("--max-steps", type=int, default=50, help="scripted expert: step budget per episode")
    g.add_argument("--robot", default=None,
                   help="ManiSkill robot_uids instead of the task's robot (e.g. panda_wristcam: a wrist camera too); "
                        "train with env.extra.robot_uids set the same")
    g.set_defaults(fn=cmd_demos)
    c = dsub.add_parser("convert", help="convert a demos file's actions to another control mode (exact, or "
                                        "an error), or rosbag2 recordings (deploy --record, ros2 bag record) "
                                        "to episodes")
    c.add_argument("src", nargs="+", help="one robo-rl episodes .h5 file, or rosbag2 recordings (bag "
                                          "directories or .mcap/.db3 files): each bag one episode")
    c.add_argument("--control-mode", choices=["pd_joint_delta_pos"],
                   help="episodes file: the target control mode")
    c.add_argument("--out", required=True, help="output .h5 file (for recordings: a new path)")
    c.add_argument("--drop-unconvertible", action="store_true",
                   help="leave out episodes with a step the target controller cannot make (counted in the output)")
    c.add_argument("--robot", help="recordings: the robot config (topics, joints, cameras, action_mode)")
    c.add_argument("--split-gap", type=float, metavar="SECONDS",
                   help="recordings: a new episode where no command was sent for longer than this")
    c.add_argument("--keep-holds", action="store_true",
                   help="recordings: keep the steps the safety filter held (default: dropped)")
    c.add_argument("--success", action="store_true",
                   help="recordings: mark every episode successful (default: unknown, stored as not)")
    c.set_defaults(fn=cmd_demos_convert)

    dp = sub.add_parser("deploy", help="serve a trained policy on a ROS 2 robot (safety-filtered)")
    dp.add_argument("checkpoint", help="run directory or checkpoints/step_* directory")
    dp.add_argument("--robot", required=True, help="robot config, e.g. configs/robots/panda_sim.yaml")
    dp.add_argument("--transport", choices=["auto", "rclpy", "cyclonedds", "inprocess"], default=None,
                    help="override the robot config's transport")
    dp.add_argument("--seconds", type=float, default=None,
                    help="stop after this long (default: until Ctrl-C or SIGTERM; a second one exits at once)")
    dp.add_argument("--record", default=None, metavar="DIR",
                    help="record inputs, commands and interventions into this new rosbag2 (mcap) directory")
    dp.add_argument("--managed", action="store_true",
                    help="rclpy: wait for a lifecycle manager's configure/activate (default: do both at start)")
    dp.add_argument("--ros-args", dest="ros_args", nargs=argparse.REMAINDER, default=None,
                    help="rclpy arguments that follow, e.g. --ros-args -p control_rate_hz:=20.0 -r __node:=arm_policy")
    dp.add_argument("--allow-large", action="store_true",
                    help="build the checkpoint's model even above 100M parameters")
    dp.set_defaults(fn=cmd_deploy)

    v = sub.add_parser("vla", help="VLA model utilities")
    vsub = v.add_subparsers(dest="vla_command", required=True)
    bm = vsub.add_parser("build-mini", help="assemble the mini OpenVLA-style model (SmolLM2-135M + MobileNetV2) offline")
    bm.add_argument("--out", default=".models/openvla-mini", help="output directory")
    bm.add_argument("--image-size", type=int, default=128)
    bm.add_argument("--action-dim", type=int, default=8, help="action dims (8 = Panda pd_joint_pos / pd_joint_delta_pos)")
    bm.add_argument("--llm-layers", type=int, default=4, help="keep the first N of SmolLM2's 30 layers (4: CPU-sized; 30: all)")
    bm.set_defaults(fn=cmd_vla)

    st = sub.add_parser("steer", help="RL^2 latent steering of a flow (pi0) policy: collect logs, fit, evaluate")
    ssub = st.add_subparsers(dest="steer_command", required=True)
    sc = ssub.add_parser("collect", help="roll out the frozen base policy and log chunks, returns and failures")
    sc.add_argument("checkpoint", help="run directory or checkpoint of a pi0 policy")
    sc.add_argument("--episodes", type=int, default=100)
    sc.add_argument("--out", required=True, help="output .npz log")
    sc.add_argument("--explore", type=float, default=0.0,
                    help="std of an action offset in normalized units added to the base's actions (0: the base as is)")
    sc.add_argument("--explore-per", choices=["episode", "call"], default="episode",
                    help="hold the --explore offset for a whole episode (default) or redraw it every call")
    sf = ssub.add_parser("fit", help="train the latent velocity head and the failure predictor on a log")
    sf.add_argument("checkpoint")
    sf.add_argument("--log", required=True, nargs="+", help="one or more logs from 'steer collect' (pooled)")
    sf.add_argument("--out", required=True, help="output steering directory")
    sf.add_argument("--fail-log", nargs="+", default=None,
                    help="train the failure predictor (and --tau auto) on these logs instead of --log, e.g. the base's "
                         "own rollouts when --log holds exploring ones")
    sf.add_argument("--steps", type=int, default=500)
    sf.add_argument("--beta", type=float, default=1.0)
    sf.add_argument("--tau", type=_tau_arg, default=0.5,
                    help="gate threshold on p_fail, or 'auto' (the held-out Youden-optimal threshold)")
    sf.add_argument("--advantage", choices=["value", "gae", "return"], default="value",
                    help="return-to-go minus a fitted value baseline (default), GAE(lambda) on that value, "
                         "or the standardized return-to-go")
    sf.add_argument("--returns", choices=["success", "dense"], default="success",
                    help="what the advantages rank: 1[episode succeeded] (default), or the logged dense return-to-go "
                         "(only where episodes do not end on success: there a dense return ranks success below failure)")
    sf.add_argument("--head", choices=["flow", "mean"], default="flow",
                    help="flow: velocity head on the action expert's latents (flow matching); mean: advantage shift of "
                         "the chunk's mean on the pooled prefix, applied as a constant velocity")
    sf.add_argument("--gae-lambda", type=float, default=0.9, help="GAE lambda of --advantage gae (1 = 'value', 0 = TD)")
    sf.add_argument("--temperature", type=float, default=1.0,
                    help="advantage temperature T of the weights exp(A / T) (advantages are standardized; lower = sharper)")
    sf.add_argument("--no-baseline", action="store_true",
                    help="one head fit to the logged chunks' flow (not only the advantage shift)")
    sf.add_argument("--two-heads", action="store_true",
                    help="fit h_w and h_1 as two nets (default: one net with a weighted/unweighted flag)")
    se = ssub.add_parser("eval", help="success of the base policy with steering gated / always on / off")
    se.add_argument("checkpoint")
    se.add_argument("--steering", required=True, help="a directory from 'steer fit'")
    se.add_argument("--episodes", type=int, default=100)
    se.add_argument("--mode", choices=["gated", "always", "off"], default="gated")
    se.add_argument("--tau", type=float, default=None, help="with --mode gated: the gate threshold (default: the fitted one)")
    se.add_argument("--beta", type=float, default=None,
                    help="steering scale (default: the fitted one; > 1 extrapolates the advantage shift, like guidance)")
    se.add_argument("--stochastic", action="store_true",
                    help="start each chunk from Gaussian noise (as deployed and as collected), seeded by --seed; "
                         "default: from x_0 = 0")
    se.add_argument("--out", help="also write the evaluation JSON here (atomically), for 'robo-rl compare'")
    for q in (sc, se):
        q.add_argument("--num-envs", type=int, default=None)
        q.add_argument("--seed", type=int, default=None)
        q.add_argument("overrides", nargs="*", help="env.key=value overrides (e.g. an OOD variation)")
    for q in (sc, sf, se):
        q.set_defaults(fn=cmd_steer)
    for sp in (sc, sf, se):
        sp.add_argument("--allow-large", action="store_true",
                        help="build the checkpoint's model even above 100M parameters")

    cv = sub.add_parser("curves", help="compare seed groups of runs: binned learning curves with min-max bands")
    cv.add_argument("--group", action="append", required=True, help="LABEL=RUN_DIR[,RUN_DIR...] (repeat per group)")
    cv.add_argument("--metric", default="train/success_rate")
    cv.add_argument("--bin", type=int, default=10_000, help="env steps per bin")
    cv.add_argument("--out", default="curves.png")
    cv.set_defaults(fn=cmd_curves)

    cp = sub.add_parser("compare", help="paired success difference of two evaluations on the same starts "
                                        "(JSON from 'eval' / 'steer eval' with the same seeds and --num-envs)")
    cp.add_argument("--a", nargs="+", required=True, help="evaluation JSON file(s) of policy A (several: concatenated)")
    cp.add_argument("--b", nargs="+", required=True, help="the matching file(s) of policy B, in the same order")
    cp.set_defaults(fn=cmd_compare)

    b = sub.add_parser("bench", help="benchmarks: ppo (ours vs SB3), env (VecEnv overhead), decode (VLA batch decoding), "
                                     "sample (pi0 chunk sampling), ros (ROS 2 node latency), rollout (serial vs pipelined), "
                                     "scale (VLA-driven env batch: steps/s, GPU utilization), chunks (blind chunk steps vs "
                                     "rendering every step)")
    b.add_argument("name", help="ppo | env | decode | sample | ros | rollout | scale | chunks")
    b.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the benchmark (see --help)")
    b.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # dotted overrides may also follow options ("train CFG --resume X a.b=1"): argparse fills a
    # positional list only once, so later KEY=VALUE words come back unparsed
    stray = [w for w in extra if w.startswith("-") or "=" not in w]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*(args.overrides or []), *extra]
    _setup_logging(args.verbose)
    try:
        return int(args.fn(args) or 0)
    except RoboRLError as err:
        print(f"robo-rl: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = "; resume with 'robo-rl train --resume RUN_DIR'" if getattr(args, "fn", None) is cmd_train else ""
        print(f"robo-rl: interrupted{hint}", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
