"""Wire compatibility with ROS 2 over real DDS: a separate process written only with cyclonedds (its
own hand-declared ROS 2 IDL types, its own serializer) exchanges JointState and Float64MultiArray
with our transport over loopback, on a random ROS domain."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("cyclonedds")

from tests.real_robot.ros2_idl import IDL_TYPES, LOOPBACK  # noqa: E402

PEER = IDL_TYPES + r'''
qos = Qos(Policy.Reliability.Reliable(duration(milliseconds=100)), Policy.History.KeepLast(10), Policy.Durability.Volatile)
dp = DomainParticipant(int(sys.argv[1]))
w = DataWriter(dp, Topic(dp, "rt/joint_states", JointState), qos=qos)
r = DataReader(dp, Topic(dp, "rt/forward_position_controller/commands", Float64MultiArray), qos=qos)
got = []
deadline = time.time() + 20
i = 0
while time.time() < deadline and len(got) < 3:
    now = time.time()
    w.write(JointState(Header(Time(int(now), 0), "base"), ["j1", "j2"], [float(i), 0.5], [], []))
    i += 1
    for s in r.take(N=10):
        got.append(list(s.data))
    time.sleep(0.05)
print(json.dumps({"sent": i, "received": got}))
'''


def test_plain_cyclonedds_peer_talks_to_our_transport(tmp_path, monkeypatch):
    from real_robot import messages as m
    from real_robot.transport import make_transport

    domain = random.randint(10, 200)
    env = {**os.environ, "CYCLONEDDS_URI": LOOPBACK, "ROS_DOMAIN_ID": str(domain)}
    monkeypatch.setenv("CYCLONEDDS_URI", LOOPBACK)  # this process only, for this test
    script = tmp_path / "peer.py"
    script.write_text(PEER)
    ours = make_transport("cyclonedds", domain)
    cmd_pub = ours.publisher("/forward_position_controller/commands", "std_msgs/msg/Float64MultiArray")
    received: list[np.ndarray] = []

    def on_joints(raw: bytes, _t: float) -> None:
        q, _ = m.joints_in_order(m.deserialize(raw, "sensor_msgs/msg/JointState"), ["j1", "j2"])
        received.append(q)
        cmd_pub.publish(m.serialize(m.float64_array(2 * q), "std_msgs/msg/Float64MultiArray"))

    ours.subscribe("/joint_states", "sensor_msgs/msg/JointState", on_joints)
    peer = subprocess.run([sys.executable, str(script), str(domain)], capture_output=True, text=True, timeout=60, env=env)
    ours.close()
    assert peer.returncode == 0, peer.stderr[-2000:]
    out = json.loads(peer.stdout.strip().splitlines()[-1])
    assert received, "our side received no joint states from the peer"
    assert all(q[1] == 0.5 for q in received)
    assert len(out["received"]) >= 3, out
    for cmd in out["received"]:  # each command is 2x a joint state the peer sent
        assert cmd[1] == 1.0 and cmd[0] % 2 == 0
