"""`robo-rl demos convert BAG --robot R --out F`: rosbag2 recordings (BagRecorder's mcap bags, and bags of
another writer) become robo-rl episodes whose observations and actions equal what was recorded, in the
robot's action space; bad input fails with one line before anything is written."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from real_robot import messages as m
from real_robot.config import load_robot
from real_robot.recorder import BagRecorder
from robo_rl.cli import main
from robo_rl.data.episodes import load_episodes, read_meta

IMAGE, JOINTS, STRING = "sensor_msgs/msg/Image", "sensor_msgs/msg/JointState", "std_msgs/msg/String"
ARRAY, TRAJ = "std_msgs/msg/Float64MultiArray", "trajectory_msgs/msg/JointTrajectory"
TWIST = "geometry_msgs/msg/TwistStamped"
T0 = 1_700_000_000_000_000_000  # bag time of step 0 (ns)
MS = 1_000_000  # ns


def robot_yaml(tmp_path, base="panda_sim", name="r.yaml", **changes):
    """A robot config from configs/robots/<base>.yaml with ``changes``; cameras become two 6x8 views."""
    cfg = yaml.safe_load(open(f"configs/robots/{base}.yaml"))
    if cfg.get("cameras", True):
        cfg["cameras"] = [{"topic": t, "height": 6, "width": 8} for t in ("/cam/front", "/cam/wrist")]
    cfg.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def command_cdr(robot, cmd, t):
    """``cmd`` (command_dim,) as the robot's command message (a trajectory's second point differs)."""
    if robot.command_type == ARRAY:
        return m.serialize(m.float64_array(cmd), ARRAY)
    if robot.command_type == TRAJ:
        names = list(robot.joint_names)
        return m.serialize(m.joint_trajectory(names, np.stack([cmd, cmd + 1]), 0.1, t), TRAJ)
    return m.serialize(m.twist_stamped(cmd[:3], cmd[3:], t), TWIST)


def record(path, robot, steps=8, held=(), gap_after=None, new_instruction_at=None, joints=None, write=None):
    """A synthetic episode at control_rate_hz: per step k images (+1 ms), joints (+2 ms), state (+3 ms),
    the command (+5 ms) and an intervention entry (+6 ms: held for k in ``held``, a clamp every 3rd
    step); step ``steps`` has observations only. Returns what was written per step."""
    rec = write or BagRecorder(path, robot)
    rng = np.random.default_rng(len(str(path)))
    names = list(joints or robot.joint_names)
    period = int(1e9 / robot.control_rate_hz)
    truth = {"rgb": [], "q": [], "qd": [], "state": [], "cmd": []}
    rec.write(robot.instruction_topic, m.serialize(m.string("stack the cubes"), STRING), T0)
    t = T0
    for k in range(steps + 1):
        if k == new_instruction_at:
            rec.write(robot.instruction_topic, m.serialize(m.string("unstack them"), STRING), t)
        imgs = [rng.integers(0, 256, (c.height, c.width, 3), dtype=np.uint8) for c in robot.cameras]
        for cam, img in zip(robot.cameras, imgs):
            rec.write(cam.topic, m.serialize(m.image(img, t / 1e9), IMAGE), t + 1 * MS)
        q, qd, state = rng.normal(size=len(names)), rng.normal(size=len(names)), rng.normal(size=5)
        js = m.joint_state(names, q, qd, t / 1e9)
        rec.write(robot.joint_states_topic, m.serialize(js, JOINTS), t + 2 * MS)
        if robot.state_source == "topic":
            rec.write(robot.state_topic, m.serialize(m.float64_array(state), ARRAY), t + 3 * MS)
        truth["rgb"].append(np.stack(imgs) if imgs else None)
        truth["q"].append(q)
        truth["qd"].append(qd)
        truth["state"].append(state)
        if k == steps:
            break
        cmd = rng.normal(size=robot.command_dim)
        rec.write(robot.command_topic, command_cdr(robot, cmd, t / 1e9), t + 5 * MS)
        truth["cmd"].append(cmd)
        if k in held or k % 3 == 0:
            rec.intervention(k in held, ("stale",) if k in held else ("clamped",), t + 6 * MS)
        t += period + (int(2e9) if k == gap_after else 0)
    if write is None:
        rec.close()
    return truth


def convert(capsys, *args):
    """``robo-rl demos convert ARGS`` in process: (exit code, stdout, stderr)."""
    code = main(["demos", "convert", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def expected(truth, robot, steps, final=None):
    """Observations at ``steps`` plus ``final`` (default: the step after the last); commands of ``steps``."""
    obs_steps = [*steps, steps[-1] + 1 if final is None else final]
    if robot.state_source == "topic":
        state = np.stack([truth["state"][k] for k in obs_steps])
    else:
        state = np.stack([np.concatenate([truth["q"][k], truth["qd"][k]]) for k in obs_steps])
    rgb = np.stack([truth["rgb"][k] for k in obs_steps]) if robot.cameras else None
    return state.astype(np.float32), rgb, np.stack([truth["cmd"][k] for k in steps])


def test_recorded_episode_converts_to_what_was_written_and_bc_loads_it(tmp_path, capsys):
    cfg = robot_yaml(tmp_path)
    robot = load_robot(cfg)
    truth = record(tmp_path / "bag", robot, steps=8, held=(2, 5))
    code, out, err = convert(capsys, tmp_path / "bag", "--robot", cfg, "--out", tmp_path / "demos.h5")
    assert code == 0, err
    (ep,) = load_episodes(tmp_path / "demos.h5")
    state, rgb, cmds = expected(truth, robot, [0, 1, 3, 4, 6, 7])  # held steps 2 and 5 dropped
    assert ep.obs["rgb"].dtype == np.uint8 and ep.obs["rgb"].shape == (7, 2, 6, 8, 3)
    np.testing.assert_array_equal(ep.obs["rgb"], rgb)  # cameras in config order, at the command times
    np.testing.assert_array_equal(ep.obs["state"], state)
    np.testing.assert_allclose(ep.actions, cmds.astype(np.float32))
    assert ep.instruction == "stack the cubes" and not ep.succeeded and not ep.rewards.any()
    meta = read_meta(tmp_path / "demos.h5")
    assert meta["control_mode"] == "absolute_joint" and meta["env"] == "real_robot"
    assert meta["obs_spec"] == {"state": [16], "rgb": [2, 6, 8, 3]}
    assert meta["action_spec"]["shape"] == [8] and meta["held_steps"] == 2
    assert '"held_steps_dropped": 2' in out

    from robo_rl.errors import ConfigError
    from robo_rl.runners.offline import flatten, load_demos

    eps, _ = load_demos(str(tmp_path / "demos.h5"), ["rgb", "state"], only_success=False, max_episodes=None)
    rows = flatten(eps, ["rgb", "state"])
    assert rows.actions.shape == (6, 8) and rows.obs["rgb"].shape == (6, 2, 6, 8, 3)
    with pytest.raises(ConfigError, match="no successful episodes"):  # success unknown: BC's default filter
        load_demos(str(tmp_path / "demos.h5"), ["state"], only_success=True, max_episodes=None)
    assert convert(capsys, tmp_path / "bag", "--robot", cfg, "--out", tmp_path / "ok.h5", "--success")[0] == 0
    (ep,) = load_demos(str(tmp_path / "ok.h5"), ["state"], only_success=True, max_episodes=None)[0]
    assert ep.succeeded and ep.success.sum() == 1


def test_delta_joint_actions_are_command_minus_measured_position(tmp_path, capsys):
    cfg = robot_yaml(tmp_path, action_mode="delta_joint")
    robot = load_robot(cfg)
    truth = record(tmp_path / "bag", robot, steps=5)
    assert convert(capsys, tmp_path / "bag", "--robot", cfg, "--out", tmp_path / "d.h5")[0] == 0
    (ep,) = load_episodes(tmp_path / "d.h5")
    want = np.stack([truth["cmd"][k] - truth["q"][k] for k in range(5)])
    np.testing.assert_allclose(ep.actions, want.astype(np.float32), rtol=1e-6)
    assert read_meta(tmp_path / "d.h5")["action_spec"]["low"] is None


def test_holds_kept_on_request_and_episodes_split_at_gaps_and_new_instructions(tmp_path, capsys):
    cfg = robot_yaml(tmp_path)
    robot = load_robot(cfg)
    truth = record(tmp_path / "bag", robot, steps=9, held=(1,), gap_after=3, new_instruction_at=7)
    code, _, err = convert(capsys, tmp_path / "bag", "--robot", cfg, "--out", tmp_path / "s.h5",
                           "--split-gap", 0.5, "--keep-holds")
    assert code == 0, err
    eps = list(load_episodes(tmp_path / "s.h5"))
    assert [ep.instruction for ep in eps] == ["stack the cubes", "stack the cubes", "unstack them"]
    # a 2 s gap after step 3, a new instruction at step 7, held step 1 kept; after the gap's last command
    # the final observation is one control period later: still step 3's
    for ep, steps, final in zip(eps, ([0, 1, 2, 3], [4, 5, 6], [7, 8]), (3, 7, 9), strict=True):
        state, rgb, cmds = expected(truth, robot, steps, final)
        np.testing.assert_array_equal(ep.obs["state"], state)
        np.testing.assert_array_equal(ep.obs["rgb"], rgb)
        np.testing.assert_allclose(ep.actions, cmds.astype(np.float32))
    assert convert(capsys, tmp_path / "bag", "--robot", cfg, "--out", tmp_path / "t.h5")[0] == 0
    assert [ep.length for ep in load_episodes(tmp_path / "t.h5")] == [6, 2]  # no gap split; held step dropped


@pytest.mark.parametrize("base,changes", [
    ("panda_sim_delta", {}),  # state topic, no camera, passthrough
    ("panda_sim", {"command_type": TRAJ}),  # a trajectory's first point
    ("panda_servo_twist", {}),  # ee_twist: the 6 twist values
])
def test_state_topic_trajectory_and_twist_commands(tmp_path, capsys, base, changes):
    cfg = robot_yaml(tmp_path, base, **changes)
    robot = load_robot(cfg)
    truth = record(tmp_path / "bag", robot, steps=4)
    assert convert(capsys, tmp_path / "bag", "--robot", cfg, "--out", tmp_path / "o.h5")[0] == 0
    (ep,) = load_episodes(tmp_path / "o.h5")
    state, rgb, cmds = expected(truth, robot, [0, 1, 2, 3])
    np.testing.assert_array_equal(ep.obs["state"], state)
    assert ("rgb" in ep.obs) == bool(robot.cameras)
    np.testing.assert_allclose(ep.actions, cmds.astype(np.float32), rtol=1e-6)
    assert ep.actions.shape == (4, robot.command_dim)


class OtherWriter:
    """Writes as another tool would, through rosbags' Writer (sqlite3 or mcap, format version 8): bgr8
    images, no intervention or instruction topic, an unrelated topic."""

    def __init__(self, path, robot, storage):
        from rosbags.rosbag2 import StoragePlugin, Writer

        self.w = Writer(path, version=8, storage_plugin=getattr(StoragePlugin, storage))
        self.w.open()
        topics = [(c.topic, IMAGE) for c in robot.cameras] + [
            (robot.joint_states_topic, JOINTS), (robot.command_topic, robot.command_type),
            ("/chatter", STRING)]
        self.conns = {t: self.w.add_connection(t, typ, typestore=m.typestore()) for t, typ in topics}

    def write(self, topic, cdr, t):
        if topic not in self.conns:
            topic, cdr = "/chatter", m.serialize(m.string("hello"), STRING)
        if self.conns[topic].msgtype == IMAGE:
            msg = m.deserialize(cdr, IMAGE)
            rgb = msg.data.reshape(msg.height, msg.width, 3)
            msg.encoding, msg.data = "bgr8", np.ascontiguousarray(rgb[..., ::-1]).reshape(-1)
            cdr = m.serialize(msg, IMAGE)
        self.w.write(self.conns[topic], t, cdr)

    def intervention(self, held, kinds, t):
        """Another tool records no intervention entries."""


@pytest.mark.parametrize("storage", ["SQLITE3", "MCAP"])
def test_bag_of_another_writer(tmp_path, capsys, storage):
    cfg = robot_yaml(tmp_path)
    robot = load_robot(cfg)
    joints = ["extra_joint", *reversed(robot.joint_names)]  # other order, one joint more
    writer = OtherWriter(tmp_path / "bag", robot, storage)
    truth = record(tmp_path / "bag", robot, steps=4, joints=joints, write=writer)
    writer.w.close()
    src = tmp_path / "bag" if storage == "SQLITE3" else tmp_path / "bag" / "bag.mcap"  # a bare .mcap file too
    code, _, err = convert(capsys, src, "--robot", cfg, "--out", tmp_path / "o.h5")
    assert code == 0, err
    (ep,) = load_episodes(tmp_path / "o.h5")
    order = [joints.index(n) for n in robot.joint_names]
    state = np.stack([np.concatenate([truth["q"][k][order], truth["qd"][k][order]]) for k in range(5)])
    np.testing.assert_array_equal(ep.obs["state"], state.astype(np.float32))
    np.testing.assert_array_equal(ep.obs["rgb"], np.stack(truth["rgb"]))  # bgr8 back to rgb
    assert ep.instruction == robot.default_instruction and ep.length == 4


def bad_inputs(tmp_path):
    """(name, CLI arguments without --out unless given, expected error fragment) per bad input."""
    cfg = robot_yaml(tmp_path)
    robot = load_robot(cfg)
    good = tmp_path / "good"
    record(good, robot, steps=2)
    record(tmp_path / "fewjoints", robot, steps=2, joints=list(robot.joint_names)[:-1])
    BagRecorder(tmp_path / "empty", robot).close()
    (tmp_path / "notes.mcap").write_text("not a bag")
    (tmp_path / "dir").mkdir()
    (tmp_path / "taken.h5").write_text("")
    (tmp_path / "afile").write_text("")
    cam_6x9 = [{"topic": "/cam/front", "height": 6, "width": 9}]
    other_cam = robot_yaml(tmp_path, name="i.yaml", cameras=cam_6x9)
    return [
        ("text file", [tmp_path / "notes.mcap", "--robot", cfg], "not a readable rosbag2 recording"),
        ("no metadata", [tmp_path / "dir", "--robot", cfg], "not a readable rosbag2 recording"),
        ("no such bag", [tmp_path / "nope", "--robot", cfg], "recording '"),
        ("missing topic", [good, "--robot", robot_yaml(tmp_path, name="c.yaml", command_topic="/other")],
         "has no topic /other"),
        ("image size", [good, "--robot", other_cam], "image is 6x8, the robot config expects 6x9"),
        ("joints", [tmp_path / "fewjoints", "--robot", cfg],
         "joint_states lacks joints ['panda_finger_joint1']"),
        ("empty", [tmp_path / "empty", "--robot", cfg], "holds no message on /forward_position_controller"),
        ("out exists", [good, "--robot", cfg, "--out", tmp_path / "taken.h5"], "already exists"),
        ("out unwritable", [good, "--robot", cfg, "--out", tmp_path / "afile" / "o.h5"],
         "not a writable directory"),
        ("no robot", [good], "needs --robot"),
        ("h5 flag", [good, "--robot", cfg, "--control-mode", "pd_joint_delta_pos"],
         "only for an episodes .h5"),
        ("mixed", [good, tmp_path / "taken.h5", "--robot", cfg], "not both"),
        ("bag flag on h5", [tmp_path / "taken.h5", "--control-mode", "pd_joint_delta_pos", "--keep-holds"],
         "--keep-holds: only for rosbag2 recordings"),
        ("short gap", [good, "--robot", cfg, "--split-gap", "0.01"], "must exceed one control period"),
    ]


def test_bad_inputs_fail_in_one_line_before_writing(tmp_path, capsys):
    for name, args, want in bad_inputs(tmp_path):
        code, _, err = convert(capsys, *args, *([] if "--out" in args else ["--out", tmp_path / "out.h5"]))
        assert code == 2 and want in err, (name, err)
        assert err.startswith("robo-rl: error:") and err.count("\n") == 1, (name, err)
        assert not (tmp_path / "out.h5").exists() and not list(tmp_path.glob(".*.tmp-*")), name
    assert (tmp_path / "taken.h5").read_text() == ""


def test_policy_node_recording_converts(tmp_path, capsys):
    """A bag the policy node itself recorded (in-process transport): delta actions equal the policy's
    (inside every per-step limit), the step the stale-input watchdog held is dropped."""
    import torch

    from real_robot.node import PolicyNode
    from real_robot.transport import make_transport
    from robo_rl.contracts import PolicyOutput

    class Policy:
        def act(self, obs, deterministic=False):
            return PolicyOutput(actions=torch.full((1, len(robot.joint_names)), 0.003))

    class Clock:
        t = 100.0

        def __call__(self):
            return self.t

    cfg = robot_yaml(tmp_path, action_mode="delta_joint")
    robot = load_robot(cfg)
    tr, clock = make_transport("inprocess"), Clock()
    rec = BagRecorder(tmp_path / "bag", robot)
    node = PolicyNode(robot, Policy(), tr, clock=clock, recorder=rec)
    js = tr.publisher(robot.joint_states_topic, JOINTS)
    cams = [tr.publisher(c.topic, IMAGE) for c in robot.cameras]
    mid = (np.array(robot.safety.position_lower) + np.array(robot.safety.position_upper)) / 2
    for k in range(5):
        for pub in cams:
            pub.publish(m.serialize(m.image(np.full((6, 8, 3), k, np.uint8), clock.t), IMAGE))
        q = mid + 0.001 * k
        js.publish(m.serialize(m.joint_state(list(robot.joint_names), q, None, clock.t), JOINTS))
        node.infer_once()
        clock.t += 1.0 if k == 2 else 0.01  # step 2's inputs are 1 s old at its tick: held
        assert node.control_tick().held == (k == 2)
    rec.close()
    assert convert(capsys, tmp_path / "bag", "--robot", cfg, "--out", tmp_path / "o.h5")[0] == 0
    (ep,) = load_episodes(tmp_path / "o.h5")
    np.testing.assert_allclose(ep.actions, 0.003, atol=1e-6)  # within every per-step limit
    assert [int(ep.obs["rgb"][i, 0, 0, 0, 0]) for i in range(4)] == [0, 1, 3, 4]
    np.testing.assert_allclose(ep.obs["state"][:4, 0], mid[0] + 0.001 * np.array([0, 1, 3, 4]), atol=1e-6)
