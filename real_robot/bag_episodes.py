"""rosbag2 recordings (``BagRecorder``'s mcap bags, ``ros2 bag record`` mcap or sqlite3) -> robo-rl episodes.

One step per message on the robot config's ``command_topic``; its observation is the newest message of
every input at or before the command's bag time, its action the command in the policy's action space
(``_episode``). One episode per bag, split where the instruction changes and, with ``split_gap`` s, where
no command was sent for longer. Dropped: held steps (unless ``keep_holds``) and commands before every
input arrived. Rewards are 0; success is unknown (False; True at the last step with ``success``).
Reading parses CDR bytes and safe YAML only: nothing in a bag runs as code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from real_robot import messages as m
from real_robot.config import TWIST, RobotConfig
from real_robot.recorder import INTERVENTIONS
from robo_rl.data.episodes import DatasetError, Episode
from robo_rl.errors import ConfigError, RoboRLError

IMAGE, JOINTS = "sensor_msgs/msg/Image", "sensor_msgs/msg/JointState"
STRING, ARRAY = "std_msgs/msg/String", "std_msgs/msg/Float64MultiArray"
STEP_COUNTS = ("held_steps", "held_steps_dropped", "incomplete_steps_dropped")


class BagError(DatasetError):
    """A recording that cannot become episodes: not a bag, a topic missing, a message that does not fit."""


class Stream:
    """One topic's messages: bag times ``t`` (N,) int64 ns and decoded ``values`` (for images the read
    order index, decoded later), sorted by time by ``sort``."""

    def __init__(self) -> None:
        self.t, self.values = [], []  # type: ignore[var-annotated]

    def sort(self) -> None:
        order = np.argsort(np.asarray(self.t, np.int64), kind="stable")
        self.t = np.asarray(self.t, np.int64)[order]
        self.values = [self.values[i] for i in order]

    def at(self, times: np.ndarray) -> np.ndarray:
        """(K,) index of the newest message at or before each of ``times`` (K,) ns; -1 where none."""
        return np.searchsorted(self.t, times, side="right") - 1

    def get(self, times: np.ndarray, default: Any = None) -> list[Any]:
        """The newest value at or before each of ``times`` (K,) ns; ``default`` where there is none."""
        return [self.values[i] if i >= 0 else default for i in self.at(times)]


def is_bag(path: str | Path) -> bool:
    """A directory (a rosbag2 bag) or a bare .mcap/.db3 storage file, by name; reading checks the content."""
    return Path(path).is_dir() or Path(path).suffix in (".mcap", ".db3")


def _inputs(robot: RobotConfig) -> dict[str, str]:
    """Topic -> message type of every input a step needs (cameras, state, joints for state or deltas)."""
    need = {c.topic: IMAGE for c in robot.cameras}
    if robot.state_source == "topic":
        need[robot.state_topic] = ARRAY
    if robot.state_source == "joints" or robot.action_mode == "delta_joint":
        need[robot.joint_states_topic] = JOINTS
    return need


def _open(path: Path) -> Any:
    from rosbags.rosbag2 import Reader

    try:
        reader = Reader(path)
        reader.open()
    except Exception as err:  # rosbags raises FileNotFoundError, ReaderError, YAML and struct errors
        why = (str(err) or type(err).__name__)[:200]
        raise BagError(f"'{path}' is not a readable rosbag2 recording ({why}); pass a bag directory "
                       "(with metadata.yaml) or a .mcap/.db3 file") from None
    return reader


def _connections(reader: Any, robot: RobotConfig, path: Path) -> list[Any]:
    """The connections of the topics we read; a required topic absent or of another type is a BagError."""
    required = {**_inputs(robot), robot.command_topic: robot.command_type}
    conns = []
    for topic, typ in {**required, robot.instruction_topic: STRING, INTERVENTIONS: STRING}.items():
        found = [c for c in reader.connections if c.topic == topic]
        other = sorted({c.msgtype for c in found} - {typ})
        if other:
            raise BagError(f"'{path}': topic {topic} carries {other[0]}; robot '{robot.name}' needs {typ}")
        if not found and topic in required:
            have = ", ".join(sorted({c.topic for c in reader.connections})) or "none"
            raise BagError(f"'{path}' has no topic {topic} ({typ}) that robot '{robot.name}' needs; "
                           f"its topics: {have}")
        conns += found
    return conns


def _messages(reader: Any, conns: list[Any], path: Path) -> Iterator[tuple[str, str, int, bytes]]:
    """(topic, message type, bag time ns, CDR bytes) in read order; a corrupt storage file is a BagError."""
    try:
        for conn, t, raw in reader.messages(connections=conns):
            yield conn.topic, conn.msgtype, int(t), raw
    except Exception as err:  # a truncated or corrupt storage file
        raise BagError(f"'{path}' cannot be read to its end ({type(err).__name__}: {err})") from None


def _command(msg: Any, robot: RobotConfig) -> np.ndarray:
    """(command_dim,) float64 numbers of one command message, joints in ``joint_names`` order."""
    if robot.command_type == TWIST:
        tw = msg.twist
        vec = np.array([tw.linear.x, tw.linear.y, tw.linear.z, tw.angular.x, tw.angular.y, tw.angular.z])
    elif hasattr(msg, "points"):
        if not len(msg.points):
            raise m.MessageError("JointTrajectory has no points")
        vec, names = np.asarray(msg.points[0].positions, np.float64), list(msg.joint_names)
        if names and (set(robot.joint_names) - set(names) or vec.size != len(names)):
            raise m.MessageError(f"JointTrajectory of joints {names} with {vec.size} positions; "
                                 f"robot '{robot.name}' needs {list(robot.joint_names)}")
        vec = vec[[names.index(n) for n in robot.joint_names]] if names else vec
    else:
        vec = np.asarray(msg.data, np.float64)
    if vec.shape != (robot.command_dim,):
        raise m.MessageError(f"command has {vec.size} values; robot '{robot.name}' takes {robot.command_dim}")
    if not np.all(np.isfinite(vec)):
        raise m.MessageError("command holds non-finite values")
    return vec


def _decode(topic: str, msgtype: str, raw: bytes, t: int, robot: RobotConfig, path: Path) -> Any:
    """One message -> image (H, W, 3) uint8 RGB, command (A,), joints (2J,), held flag (intervention entry
    JSON {"held": bool, "kinds": [...]}), instruction or state (D,); one that does not fit is a BagError."""
    try:
        msg = m.deserialize(raw, msgtype)
        if msgtype == IMAGE:
            cam = next(c for c in robot.cameras if c.topic == topic)
            return m.image_to_rgb(msg, (cam.height, cam.width))
        if topic == robot.command_topic:
            return _command(msg, robot)
        if topic == robot.joint_states_topic:
            q, qd = m.joints_in_order(msg, list(robot.joint_names))
            return np.concatenate([q, np.zeros_like(q) if qd is None else qd])
        if topic == INTERVENTIONS:
            entry = json.loads(str(msg.data))
            if not isinstance(entry, dict) or not isinstance(entry.get("held"), bool):
                raise ValueError(f"entry {str(msg.data)[:60]!r} is not JSON {{'held': bool, 'kinds': [...]}}")
            return entry["held"]
        return str(msg.data) if topic == robot.instruction_topic else m.state_vector(msg, None)
    except ValueError as err:  # m.MessageError, bad JSON
        raise BagError(f"'{path}': {topic} message at {t / 1e9:.3f} s: {err}") from None


def _scan(reader: Any, conns: list[Any], robot: RobotConfig, path: Path,
          images: dict[str, set[int]] | None = None) -> dict[str, Stream]:
    """Every message of ``conns`` decoded into time-sorted Streams (images: read-order index); with
    ``images`` ({camera topic: read-order indices}) a second read: camera Streams, those images decoded."""
    streams = {c.topic: Stream() for c in conns}
    cams = {c.topic for c in robot.cameras}
    for topic, msgtype, t, raw in _messages(reader, conns, path):
        if images is not None and topic not in cams:
            continue
        s = streams[topic]
        if images is None and topic in cams:
            s.values.append(len(s.values))  # decoded in the second read
        elif images is None or len(s.values) in images[topic]:
            s.values.append(_decode(topic, msgtype, raw, t, robot, path))
        else:
            s.values.append(None)
        s.t.append(t)
    for s in streams.values():
        s.sort()
    return {k: v for k, v in streams.items() if images is None or k in cams}


def _segments(streams: dict[str, Stream], robot: RobotConfig, split_gap: float | None, keep_holds: bool,
              counts: dict[str, int]) -> list[tuple[np.ndarray, np.ndarray, str]]:
    """Per episode: (kept command indices (T,), observation times (T+1,) ns, instruction)."""
    n = len(tc := streams[robot.command_topic].t)  # (n,) command times, ns
    s = streams.get(INTERVENTIONS, Stream())  # an entry belongs to the newest command at or before it
    k = np.searchsorted(tc, s.t, side="right") - 1
    held = np.zeros(n, bool)
    held[k[np.asarray(s.values, bool) & (k >= 0)]] = True
    complete = np.ones(n, bool)
    for topic in _inputs(robot):
        complete &= streams[topic].at(tc) >= 0
    instr = streams.get(robot.instruction_topic, Stream())
    texts = np.array(instr.get(tc, robot.default_instruction), object)
    keep = complete & (keep_holds | ~held)
    counts.update(held_steps=int(held.sum()), incomplete_steps_dropped=int((~complete).sum()),
                  held_steps_dropped=0 if keep_holds else int((held & complete).sum()))
    start = np.zeros(n, bool)
    start[1:] = texts[1:] != texts[:-1]
    if split_gap is not None:
        start[1:] |= np.diff(tc) > int(split_gap * 1e9)
    period = int(1e9 / robot.control_rate_hz)
    out = []
    for seg in np.split(np.arange(n), np.flatnonzero(start)):
        seg = seg[keep[seg]]
        if len(seg):
            last = int(seg[-1])
            # the final observation: one control period after the last command, or at the next command
            t_end = min(int(tc[last]) + period, int(tc[last + 1]) if last + 1 < n else 2**62)
            out.append((seg, np.append(tc[seg], t_end), str(texts[last])))
    return out


def _episode(streams: dict[str, Stream], robot: RobotConfig, seg: np.ndarray, times: np.ndarray,
             instruction: str, success: bool, path: Path) -> Episode:
    """Observations at ``times`` (T+1,) ns; actions (T, A) float32: the command (absolute_joint,
    passthrough, ee_twist: vx, vy, vz m/s, wx, wy, wz rad/s) or minus the measured positions (delta_joint)."""
    joints = streams.get(robot.joint_states_topic)
    state = (streams[robot.state_topic] if robot.state_source == "topic" else joints).get(times)
    if len(sizes := {r.size for r in state}) > 1:
        raise BagError(f"'{path}': {robot.state_topic} vectors change length ({sorted(sizes)})")
    obs = {"state": np.stack(state).astype(np.float32)}
    if robot.cameras:
        views = [streams[c.topic].get(times) for c in robot.cameras]  # V lists of T+1 (H, W, 3)
        obs["rgb"] = np.stack([np.stack(v) for v in zip(*views)])
    actions = np.stack([streams[robot.command_topic].values[i] for i in seg])
    if robot.action_mode == "delta_joint":
        actions = actions - np.stack(joints.get(times[:-1]))[:, : len(robot.joint_names)]
    done = (np.arange(len(seg)) == len(seg) - 1) & success  # (T,) success after each action
    return Episode(obs, actions.astype(np.float32), np.zeros(len(seg), np.float32), done, instruction)


def bag_episodes(path: str | Path, robot: RobotConfig, split_gap: float | None = None,
                 keep_holds: bool = False, success: bool = False) -> tuple[list[Episode], dict[str, int]]:
    """The episodes of one recording, and its step counts (``STEP_COUNTS``)."""
    path = Path(path)
    if len({(c.height, c.width) for c in robot.cameras}) > 1:
        raise ConfigError(f"robot '{robot.name}' cameras differ in size; obs rgb (V, H, W, 3) needs one size")
    counts: dict[str, int] = {}
    reader = _open(path)
    try:
        conns = _connections(reader, robot, path)
        streams = _scan(reader, conns, robot, path)
        if not len(streams[robot.command_topic].t):
            raise BagError(f"'{path}' holds no message on {robot.command_topic}: no step to learn from")
        plan = _segments(streams, robot, split_gap, keep_holds, counts)
        needed = {c.topic: {i for _, ts, _ in plan for i in streams[c.topic].get(ts)} for c in robot.cameras}
        if robot.cameras and plan:
            streams.update(_scan(reader, conns, robot, path, needed))
    finally:
        reader.close()
    return [_episode(streams, robot, seg, ts, text, success, path) for seg, ts, text in plan], counts


def check_out(out: str | Path) -> None:
    """A new file in a writable place, or a RoboRLError (before anything is read or written)."""
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise RoboRLError(f"--out '{out}' already exists; pass a new path")
    parent = next(p for p in out.absolute().parents if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise RoboRLError(f"cannot write --out '{out}' ('{parent}' is not a writable directory); "
                          "pass --out in a writable place")


def _meta(robot: RobotConfig, paths: list[str], eps: list[Episode], success: bool, counts: dict) -> dict:
    """The file's meta: setup keys the BC loader compares, spaces, robot, instructions and provenance."""
    low, high = list(robot.safety.position_lower), list(robot.safety.position_upper)
    if robot.action_mode == "delta_joint":  # deltas from the measured position have no fixed bounds
        low = high = None
    return {"env": "real_robot", "task": robot.name, "control_mode": robot.action_mode,
            "obs_mode": "rgb" if robot.cameras else "state", "joint_names": list(robot.joint_names),
            "obs_spec": {k: list(v.shape[1:]) for k, v in eps[0].obs.items()},
            "action_spec": {"shape": [robot.command_dim], "low": low, "high": high},
            "command_type": robot.command_type, "control_rate_hz": robot.control_rate_hz,
            "instructions": sorted({ep.instruction for ep in eps}), "source": [str(p) for p in paths],
            "success": "given (--success)" if success else "unknown (stored as False)", **counts}


def convert_recordings(paths: list[str], robot_path: str, out: str, split_gap: float | None = None,
                       keep_holds: bool = False, success: bool = False) -> dict[str, Any]:
    """Every recording in ``paths`` -> one episodes file ``out``, written only if all convert; the summary."""
    from real_robot.config import load_robot
    from robo_rl.data.episodes import write_episodes

    check_out(out)
    robot = load_robot(robot_path)
    if split_gap is not None and not split_gap > 1.0 / robot.control_rate_hz:
        raise RoboRLError(f"--split-gap {split_gap} s must exceed one control period "
                          f"({1 / robot.control_rate_hz:.4g} s at control_rate_hz {robot.control_rate_hz:g})")
    converted = [bag_episodes(p, robot, split_gap, keep_holds, success) for p in paths]
    eps = [ep for got, _ in converted for ep in got]
    counts = {k: sum(c[k] for _, c in converted) for k in STEP_COUNTS}
    if not eps:
        held, early = counts["held_steps_dropped"], counts["incomplete_steps_dropped"]
        raise BagError(f"no step is left in {', '.join(map(str, paths))} ({held} held, {early} before every "
                       "input arrived); nothing was written")
    try:
        write_episodes(out, eps, _meta(robot, paths, eps, success, counts))
    except OSError as err:
        raise RoboRLError(f"cannot write '{out}' ({err.strerror}); pass --out in a writable place") from None
    return {"out": str(out), "episodes": len(eps), "steps": sum(ep.length for ep in eps),
            "control_mode": robot.action_mode, "success": success or "unknown", **counts}
