"""Observation-to-command latency of the ROS 2 policy node over real DDS on loopback.

A peer process (plain transport + rosbags CDR, no node code) publishes a 224x224 rgb8 image and a
JointState at 30 Hz; the node (cyclonedds transport, reactive mode, an identity policy so model time
is zero) turns each observation into a safety-filtered Float64MultiArray command; the peer matches
each command to the observation it came from (the first joint carries a sequence number) and
records the round trip: image + joint state out, command back. Prints p50/p99/max in ms.

    robo-rl bench ros --seconds 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from robo_rl.bench.output import check_min, check_positive

LOOPBACK = '<CycloneDDS><Domain><General><Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces></General></Domain></CycloneDDS>'
JOINTS = [f"j{i}" for i in range(7)]
SCALE = 1e-4  # joint 0 = seq * SCALE (within the limits below)


class IdentityPolicy:
    """Returns the observed joint positions: zero model time, and the command identifies its observation."""

    def act(self, obs: dict[str, Any], deterministic: bool = True) -> Any:
        import torch

        from robo_rl.contracts import PolicyOutput

        return PolicyOutput(actions=torch.as_tensor(obs["state"])[:, : len(JOINTS)])


def peer(domain: int, seconds: float, rate: float) -> None:
    from real_robot import messages as m
    from real_robot.transport import QoS, make_transport

    tr = make_transport("cyclonedds", domain)
    img_pub = tr.publisher("/camera/color/image_raw", "sensor_msgs/msg/Image", QoS.sensor_data())
    js_pub = tr.publisher("/joint_states", "sensor_msgs/msg/JointState")
    sent: dict[int, float] = {}
    lat: list[float] = []

    def on_cmd(raw: bytes, t: float) -> None:
        seq = int(round(float(m.deserialize(raw, "std_msgs/msg/Float64MultiArray").data[0]) / SCALE))
        if seq in sent:
            lat.append(t - sent.pop(seq))

    tr.subscribe("/forward_position_controller/commands", "std_msgs/msg/Float64MultiArray", on_cmd)
    rgb = np.random.default_rng(0).integers(0, 255, (224, 224, 3), dtype=np.uint8)
    time.sleep(2.0)  # discovery
    period, nxt, seq = 1.0 / rate, time.monotonic(), 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seq += 1
        q = np.zeros(len(JOINTS))
        q[0] = seq * SCALE
        img_pub.publish(m.serialize(m.image(rgb, time.time()), "sensor_msgs/msg/Image"))
        sent[seq] = time.monotonic()
        js_pub.publish(m.serialize(m.joint_state(JOINTS, q, None, time.time()), "sensor_msgs/msg/JointState"))
        nxt += period
        time.sleep(max(0.0, nxt - time.monotonic()))
    time.sleep(0.5)
    print(json.dumps({"sent": seq, "latencies_s": lat}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="robo-rl bench ros", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=30.0)
    ap.add_argument("--domain", type=int, default=None, help="ROS domain id (default: random)")
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    check_positive(ap, args, "seconds", "rate")
    check_min(ap, args, 0, "domain")
    os.environ.setdefault("CYCLONEDDS_URI", LOOPBACK)
    domain = args.domain if args.domain is not None else int(np.random.default_rng().integers(20, 200))
    if args.peer:
        peer(domain, args.seconds, args.rate)
        return 0
    from real_robot.config import CameraConfig, RobotConfig
    from real_robot.node import PolicyNode
    from real_robot.safety import SafetyConfig
    from real_robot.transport import make_transport

    robot = RobotConfig(name="bench", joint_names=tuple(JOINTS), cameras=(CameraConfig(height=224, width=224),),
                        safety=SafetyConfig((-3.0,) * 7, (3.0,) * 7, (1e3,) * 7, max_delta=10.0, control_rate_hz=args.rate),
                        transport="cyclonedds", control_rate_hz=args.rate)
    tr = make_transport("cyclonedds", domain)
    node = PolicyNode(robot, IdentityPolicy(), tr, reactive=True)
    proc = subprocess.run([sys.executable, "-m", "robo_rl.cli", "bench", "ros", "--peer", "--domain", str(domain),
                           "--seconds", str(args.seconds), "--rate", str(args.rate)],
                          capture_output=True, text=True, timeout=args.seconds + 60, env={**os.environ})
    node.stop()
    tr.close()
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
        return 1
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    lat = np.array(res["latencies_s"]) * 1e3
    if lat.size == 0:
        print("no commands came back", file=sys.stderr)
        return 1
    out = {"rate_hz": args.rate, "image": "224x224 rgb8", "observations": res["sent"], "commands_matched": int(lat.size),
           "p50_ms": round(float(np.percentile(lat, 50)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3),
           "max_ms": round(float(lat.max()), 3), "rejected": dict(node.rejected), "interventions": dict(node.safety.counts)}
    print(json.dumps(out, indent=2))
    return 0
