"""`robo-rl demos` (scripted experts -> episodes) and `robo-rl demos convert` (recordings -> episodes)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from robo_rl.errors import RoboRLError


def cmd_demos(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from robo_rl.data.episodes import write_episodes

    if args.episodes < 1:
        raise RoboRLError(f"--episodes {args.episodes} must be >= 1")
    if args.frame_every < 1:
        raise RoboRLError(f"--frame-every {args.frame_every} must be >= 1 (1: a frame at every step)")
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
                                       only_success=args.only_success, on_episode=on_episode,
                                       fast_render=args.fast_render, init_states=args.init_states,
                                       frame_every=args.frame_every))
            meta = {"env": "libero", "task": args.task, "control_mode": "OSC_POSE delta + gripper", "obs_mode": "rgb",
                    "image_size": args.image_size, "fast_render": args.fast_render, "init_states": args.init_states,
                    "frame_every": args.frame_every,
                    "source": "scripted pick-and-place expert (privileged object poses)"}
        else:
            if args.fast_render or args.init_states != "sampled" or args.frame_every != 1:
                raise RoboRLError("--fast-render, --init-states and --frame-every apply to --sim libero only; drop them")
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
