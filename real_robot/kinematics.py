"""Forward kinematics of one serial chain from a URDF, for the safety filter's workspace box.

Written here rather than taken from pytorch_kinematics / yourdfpy: the safety filter needs one chain's
end-effector position per control tick, in float64 numpy, in the deployment install (no torch, no
mesh loaders); that is a URDF parse (xml.etree) and a product of 4x4 transforms.

Supported joints: revolute, continuous, prismatic, fixed (URDF conventions: ``origin`` xyz + rpy as
fixed-axis roll-pitch-yaw, ``axis`` in the joint frame, default (1, 0, 0)).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robo_rl.errors import ConfigError

MOVABLE = ("revolute", "continuous", "prismatic")


def resolve_urdf(path: str | Path) -> Path:
    """A local path, or ``package://<python package>/<path inside it>`` (ROS's URDF convention, resolved
    against an installed Python package, e.g. ``package://mani_skill/assets/robots/panda/panda_v2.urdf``)."""
    text = str(path)
    if not text.startswith("package://"):
        return Path(text)
    import importlib.util

    pkg, _, rest = text[len("package://"):].partition("/")
    spec = importlib.util.find_spec(pkg) if pkg else None
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"robot config 'urdf' = {text!r}: no installed Python package {pkg!r}; "
                          f"use a local path or package://<installed package>/<file>")
    return Path(list(spec.submodule_search_locations)[0]) / rest


def _rpy(r: float, p: float, y: float) -> np.ndarray:
    """URDF rpy -> 3x3 rotation Rz(y) @ Ry(p) @ Rx(r)."""
    cr, sr, cp, sp, cy, sy = np.cos(r), np.sin(r), np.cos(p), np.sin(p), np.cos(y), np.sin(y)
    return np.array([[cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
                     [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
                     [-sp, cp * sr, cp * cr]])


def _axis_angle(axis: np.ndarray, q: float) -> np.ndarray:
    """Rodrigues: rotation by ``q`` about the unit ``axis``."""
    x, y, z = axis
    c, s, v = np.cos(q), np.sin(q), 1.0 - np.cos(q)
    return np.array([[x * x * v + c, x * y * v - z * s, x * z * v + y * s],
                     [y * x * v + z * s, y * y * v + c, y * z * v - x * s],
                     [z * x * v - y * s, z * y * v + x * s, z * z * v + c]])


@dataclass(frozen=True)
class _Joint:
    name: str
    kind: str
    origin: np.ndarray  # 4x4 parent -> joint frame at q = 0
    axis: np.ndarray  # (3,) unit
    index: int  # position in the command vector, -1 for fixed joints


class ChainFK:
    """End-effector position (3,) in the URDF root frame for a joint vector ordered as ``joint_names``.

    Joints of ``joint_names`` that are not on the root -> ``ee_link`` chain (e.g. a gripper finger) are
    ignored; a movable joint on the chain that ``joint_names`` lacks is a one-line ConfigError.
    """

    def __init__(self, urdf: str | Path, ee_link: str, joint_names: Sequence[str]) -> None:
        try:
            root = ET.parse(resolve_urdf(urdf)).getroot()
        except (OSError, ET.ParseError) as err:
            raise ConfigError(f"robot config 'urdf' = {str(urdf)!r} is not a readable URDF file: {err}") from None
        by_child: dict[str, ET.Element] = {}
        for j in root.iter("joint"):
            child = j.find("child")
            if child is not None:
                by_child[child.get("link", "")] = j
        links = {link.get("name") for link in root.iter("link")}
        if ee_link not in links:
            raise ConfigError(f"robot config 'ee_link' = {ee_link!r} is not a link of {urdf}; "
                              f"links: {', '.join(sorted(str(n) for n in links))}")
        chain: list[ET.Element] = []
        link = ee_link
        while link in by_child:
            chain.append(by_child[link])
            parent = by_child[link].find("parent")
            link = parent.get("link", "") if parent is not None else ""
        names = list(joint_names)
        joints = []
        for j in reversed(chain):
            kind, name = j.get("type", "fixed"), j.get("name", "")
            origin = j.find("origin")
            xyz = [float(v) for v in (origin.get("xyz", "0 0 0") if origin is not None else "0 0 0").split()]
            rpy = [float(v) for v in (origin.get("rpy", "0 0 0") if origin is not None else "0 0 0").split()]
            t = np.eye(4)
            t[:3, :3], t[:3, 3] = _rpy(*rpy), xyz
            axis_el = j.find("axis")
            axis = np.array([float(v) for v in (axis_el.get("xyz", "1 0 0") if axis_el is not None else "1 0 0").split()])
            if kind in MOVABLE and name not in names:
                raise ConfigError(f"URDF joint {name!r} moves the end effector {ee_link!r} but is not in the robot "
                                  f"config's joint_names {names}")
            if kind not in MOVABLE and kind != "fixed":
                raise ConfigError(f"URDF joint {name!r} has type {kind!r}; forward kinematics supports "
                                  f"{', '.join(MOVABLE)} and fixed")
            joints.append(_Joint(name, kind, t, axis / np.linalg.norm(axis),
                                 names.index(name) if kind in MOVABLE else -1))
        self.joints = tuple(joints)
        self.base_link = link
        self.ee_link = ee_link

    def __call__(self, q: np.ndarray) -> np.ndarray:
        """``q`` (J,) in joint_names order -> end-effector position (3,) in the base link's frame (m)."""
        t = np.eye(4)
        for j in self.joints:
            t = t @ j.origin
            if j.index >= 0:
                m = np.eye(4)
                if j.kind == "prismatic":
                    m[:3, 3] = j.axis * q[j.index]
                else:
                    m[:3, :3] = _axis_angle(j.axis, float(q[j.index]))
                t = t @ m
        return t[:3, 3].copy()
