"""Connecting to a Ray cluster with one-line errors before anything starts.

Checked up front, so a run never starts half-way: Ray is installed; the head address is reachable
(a TCP connect, seconds instead of Ray's long retry loop); the head runs our Ray version (Ray
checks it when joining; we turn its message into one line); the
cluster has the CPUs/GPUs the requested rollout workers reserve.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from robo_rl.errors import ConfigError, RoboRLError

log = logging.getLogger(__name__)


class ClusterError(RoboRLError):
    """The Ray cluster cannot run this job (unreachable, other version, too few resources)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterError("cluster.address is set but Ray is not installed; pip install -e '.[ray]' "
                           "(or run without cluster.address)") from None
    return ray


def _host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"config key 'cluster.address' = {address!r}: use auto, local or HOST:PORT (e.g. 10.0.0.5:6379)")
    return host, int(port)


def _resolve_auto() -> str | None:
    """The address ``ray start`` recorded for this machine (None if no cluster runs here)."""
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env
    try:
        with open("/tmp/ray/ray_current_cluster") as f:
            return f.read().strip() or None
    except OSError:
        return None


def connect(address: str, timeout_s: float = 10.0) -> Any:
    """``ray.init`` for ``address`` (auto | local | HOST:PORT); returns the ``ray`` module."""
    ray = _ray()
    if ray.is_initialized():
        return ray
    if address == "local":
        ray.init(address="local", include_dashboard=False, log_to_driver=False, configure_logging=False)
        return ray
    target = _resolve_auto() if address == "auto" else address
    if target is None:
        raise ClusterError("cluster.address=auto but no Ray cluster runs on this machine; start one with "
                           "launch/ray_head.sh (or pass cluster.address=HOST:PORT, or cluster.address=local)")
    target = target.removeprefix("ray://")
    host, port = _host_port(target)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as err:
        raise ClusterError(f"cannot reach the Ray head at {host}:{port} ({err.strerror or err}); check "
                           "cluster.address and that 'ray start --head' runs there (launch/ray_head.sh)") from None
    try:
        ray.init(address=f"{host}:{port}", log_to_driver=False, configure_logging=False)
    except Exception as err:  # Ray raises RuntimeError / ConnectionError subclasses with long texts
        text = str(err)
        if "version" in text.lower():
            raise ClusterError(f"the Ray cluster at {host}:{port} runs another Ray/Python version than this "
                               f"process (ray {ray.__version__}); install the same version on every node "
                               f"(constraints.txt pins it): {text.splitlines()[0][:200]}") from None
        raise ClusterError(f"cannot join the Ray cluster at {host}:{port}: {text.splitlines()[0][:300]}") from None
    return ray


def check_resources(ray: Any, cc: Any) -> None:
    """Fail before any actor starts if the cluster cannot host the rollout workers and learners of
    ``cc`` (a ``ClusterConfig``): in total, and packed onto its alive nodes (an actor needs its
    CPUs and GPUs on one node; Ray would leave one that fits nowhere pending forever)."""
    have = ray.cluster_resources()
    need_cpu = cc.num_workers * cc.cpus_per_worker + cc.num_learners * cc.cpus_per_learner
    need_gpu = cc.num_workers * cc.gpus_per_worker + cc.num_learners * cc.gpus_per_learner
    asked = f"cluster.num_workers={cc.num_workers} workers x ({cc.cpus_per_worker:g} CPU, {cc.gpus_per_worker:g} GPU)"
    if cc.num_learners:
        asked += f" + cluster.num_learners={cc.num_learners} learners x ({cc.cpus_per_learner:g} CPU, {cc.gpus_per_learner:g} GPU)"
    if need_cpu > have.get("CPU", 0.0) + 1e-9 or need_gpu > have.get("GPU", 0.0) + 1e-9:
        raise ClusterError(f"{asked} need {need_cpu:g} CPUs and {need_gpu:g} GPUs; the cluster has "
                           f"{have.get('CPU', 0.0):g} CPUs and {have.get('GPU', 0.0):g} GPUs: lower the counts or "
                           "the per-actor reservations, or add nodes")
    nodes = [(float(n.get("Resources", {}).get("CPU", 0.0)), float(n.get("Resources", {}).get("GPU", 0.0)))
             for n in ray.nodes() if n.get("Alive", True)]
    actors = [(cc.cpus_per_worker, cc.gpus_per_worker)] * cc.num_workers + \
        [(cc.cpus_per_learner, cc.gpus_per_learner)] * cc.num_learners
    if nodes and not pack(actors, nodes):
        per_node = ", ".join(f"({c:g} CPU, {g:g} GPU)" for c, g in nodes)
        raise ClusterError(f"{asked} do not fit on the nodes {per_node}: each actor needs its CPUs and GPUs on "
                           "one node; lower the per-actor reservations or add larger nodes")


def pack(actors: list[tuple[float, float]], nodes: list[tuple[float, float]]) -> bool:
    """Whether ``actors`` (cpu, gpu) fit on ``nodes`` (cpu, gpu) free capacity. A config asks for at
    most two actor sizes (workers, learners): each size order is tried, each actor going to the node
    it fits most tightly (best fit), which finds a placement in the cases a config produces."""
    sizes = list(dict.fromkeys(actors))
    for order in (sizes, sizes[::-1]):
        free = [list(n) for n in nodes]
        ok = True
        for size in order:
            for _ in range(actors.count(size)):
                fits = [n for n in free if n[0] + 1e-9 >= size[0] and n[1] + 1e-9 >= size[1]]
                if not fits:
                    ok = False
                    break
                n = min(fits, key=lambda n: (n[1] - size[1], n[0] - size[0]))
                n[0] -= size[0]
                n[1] -= size[1]
            if not ok:
                break
        if ok:
            return True
    return False
