"""`robo-rl deploy`: serve a policy to a robot over ROS 2."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys


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
