"""Ray rollout workers on a real local cluster (a head and two worker nodes on loopback, started with
the launch/ scripts): PPO trains through them, a SIGKILLed worker is replaced and the run finishes,
and bad cluster requests fail in one line before a run directory exists."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.maniskill
ray = pytest.importorskip("ray")

FAST = ["policy.hidden=[32,32]", "run.rollout_steps=16", "run.eval_every_steps=0", "run.final_eval_episodes=0",
        "run.progress=false", "run.video=false"]


# Ports `ray start` claims for itself by default (client server, dashboard, dashboard agent, worker range): a
# GCS port that lands on one of them makes `ray start` refuse ("used by other components"), as CI once drew 52365.
_RAY_DEFAULT_PORTS = {6379, 8265, 10001, 52365}


def _free_port() -> int:
    """A loopback port free now and outside Ray's default port set and worker range (10002-19999)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _RAY_DEFAULT_PORTS and not 10002 <= port <= 19999:
            return port


def _start(cmd: list[str], env: dict) -> None:
    """Run a launch/ script; on failure, fail with its stderr (the reason) rather than a bare exit status."""
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: " + " | ".join(tail))


@pytest.fixture(scope="module")
def cluster():
    """launch/ray_head.sh (no CPUs: the learner only) + two launch/ray_worker.sh nodes with 1 CPU each."""
    port = _free_port()
    env = {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}",
           "RAY_HEAD_EXTRA": "--node-ip-address=127.0.0.1 --object-store-memory=150000000",
           "RAY_WORKER_EXTRA": "--node-ip-address=127.0.0.1 --object-store-memory=150000000"}
    addr = f"127.0.0.1:{port}"
    try:
        _start([str(REPO / "launch" / "ray_head.sh"), str(port), "0"], env)
        for _ in range(2):
            _start([str(REPO / "launch" / "ray_worker.sh"), addr, "1"], env)
        yield addr
    finally:
        subprocess.run([str(REPO / ".venv" / "bin" / "ray"), "stop", "--force"], env=env, capture_output=True, timeout=120)


def _cfg(tmp_path, *overrides):
    from robo_rl.config import load
    from robo_rl.run_config import TrainConfig

    return load(TrainConfig, REPO / "configs" / "quickstart.yaml",
                       ["env.num_envs=4", *FAST, f"run.out_dir={tmp_path}", *overrides])


def _train_killing_at_iteration_3(cfg, victim, before_kill=None):
    """Train ``cfg`` on the cluster, SIGKILLing the process ``victim(trainer)`` once at iteration 3;
    (summary, killed pids)."""
    from robo_rl.runners.train import Trainer, make_run_dir

    killed: list[int] = []

    def kill(row):
        if row["iteration"] == 3 and not killed:
            if before_kill is not None:
                before_kill()
            pid = victim(trainer)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        return False

    trainer = Trainer(cfg, make_run_dir(cfg), on_iteration=kill)
    try:
        return trainer.run(), killed
    finally:
        ray.shutdown()


def test_ppo_on_two_worker_nodes_survives_a_killed_worker(need_maniskill, cluster, tmp_path):
    import csv

    from robo_rl.runners.train import resume

    cfg = _cfg(tmp_path, f"cluster.address={cluster}", "cluster.num_workers=2", "run.total_env_steps=640",
               "run.name=ray", "run.reward_norm=true")
    nodes: set[str] = set()

    def note_nodes():  # lose a node's worker process mid-run
        nodes.update(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU"))

    summary, killed = _train_killing_at_iteration_3(cfg, lambda t: t.env.worker_pids()[1], note_nodes)
    assert len(nodes) == 2  # two worker nodes (the head has no CPUs to host workers)
    assert killed and summary["env_steps"] >= 640 and summary["stop_reason"] == "total_env_steps"
    assert summary["worker_restarts"] == 1
    rows = list(csv.DictReader(open(tmp_path / "ray" / "metrics.csv")))
    assert len(rows) == summary["iterations"] >= 10
    assert all(float(r["loss/approx_kl"]) >= 0 for r in rows)
    # the learner's checkpoint is complete and loads
    assert (tmp_path / "ray" / "checkpoints").is_dir()
    proc = run_cli("eval", str(tmp_path / "ray"), "--episodes", "2", "--num-envs", "2", "--no-video")
    assert proc.returncode == 0, proc.stderr[-2000:]
    # each worker's reward scaler is in it, and a resumed run continues from those statistics
    scalers = _scalers(tmp_path / "ray")
    assert len(scalers) == 2 and not torch.equal(scalers[0]["var"], scalers[1]["var"])
    per_iter = int(rows[1]["env_steps"]) - int(rows[0]["env_steps"])
    try:
        resume(tmp_path / "ray", [f"run.total_env_steps={summary['env_steps'] + per_iter}"])
    finally:
        ray.shutdown()
    after = _scalers(tmp_path / "ray")
    steps_per_worker = per_iter // 2
    assert [int(a["count"]) - int(b["count"]) for a, b in zip(after, scalers)] == [steps_per_worker] * 2


def _scalers(run: Path) -> list[dict]:
    from robo_rl import checkpoint as ckpt_io

    return ckpt_io.load_trainer_state(ckpt_io.resolve(str(run)))["reward_scaler"]["workers"]


def test_ddp_learners_survive_a_killed_learner(need_maniskill, cluster, tmp_path):
    """Two DDP learner actors (gloo) train with the two rollout workers; one learner is SIGKILLed
    mid-run, the group restarts from the driver's weights and the run finishes; the checkpoint holds
    the gathered optimizer state and resumes."""
    from robo_rl import checkpoint as ckpt_io
    from robo_rl.runners.train import resume

    cfg = _cfg(tmp_path, f"cluster.address={cluster}", "cluster.num_workers=2", "cluster.num_learners=2",
               "cluster.cpus_per_learner=0", "run.total_env_steps=640", "run.name=ddp")
    summary, killed = _train_killing_at_iteration_3(cfg, lambda t: t.algo.pids()[1])
    assert killed and summary["learner_restarts"] == 1 and summary["stop_reason"] == "total_env_steps"
    assert summary["iterations"] >= 10
    ts = ckpt_io.load_trainer_state(ckpt_io.resolve(tmp_path / "ddp"))
    assert ts["algo"]["updates"] == summary["iterations"]  # counted on through the restart
    try:
        out = resume(tmp_path / "ddp", ["run.total_env_steps=800"])
    finally:
        ray.shutdown()
    assert out["env_steps"] >= 800 and out["learner_restarts"] == 0


def test_bad_cluster_requests_fail_before_the_run_starts(need_maniskill, cluster, tmp_path):
    proc = run_cli("train", "--json", "configs/quickstart.yaml", *FAST, f"run.out_dir={tmp_path}", "run.name=x",
                   "cluster.address=127.0.0.1:1", "cluster.connect_timeout_s=2")
    assert proc.returncode == 2 and "cannot reach the Ray head at 127.0.0.1:1" in proc.stderr, proc.stderr[-1500:]
    proc = run_cli("train", "--json", "configs/quickstart.yaml", *FAST, f"run.out_dir={tmp_path}", "run.name=x",
                   f"cluster.address={cluster}", "cluster.num_workers=3")
    assert proc.returncode == 2 and "need 3 CPUs" in proc.stderr and "has 2 CPUs" in proc.stderr, proc.stderr[-1500:]
    proc = run_cli("train", "--json", "configs/quickstart.yaml", *FAST, f"run.out_dir={tmp_path}", "run.name=x",
                   "env.num_envs=2", f"cluster.address={cluster}", "cluster.num_workers=3")
    assert proc.returncode == 2 and "more than env.num_envs=2" in proc.stderr
    proc = run_cli("train", "--json", "configs/quickstart.yaml", *FAST, f"run.out_dir={tmp_path}", "run.name=x",
                   "cluster.address=nowhere")
    assert proc.returncode == 2 and "use auto, local or HOST:PORT" in proc.stderr
    assert not (tmp_path / "x").exists()  # nothing started


def test_a_head_with_another_ray_version_is_one_line(monkeypatch):
    """Ray refuses to join a cluster of another version when it connects; the message becomes one line
    naming both sides (logic only: the refusal is Ray's, raised here by a stand-in ray.init)."""
    from robo_rl.distributed import cluster as cl

    def refuse(**kw):
        raise RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.40.0\n    Python: 3.11.2\n...")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        with pytest.raises(cl.ClusterError) as err:
            cl.connect(f"127.0.0.1:{port}", timeout_s=2)
    msg = str(err.value)
    assert "\n" not in msg and "another Ray/Python version" in msg and ray.__version__ in msg


def test_launch_scripts_refuse_bad_arguments_in_one_line():
    """The cluster scripts check their own arguments before calling `ray start`."""
    import subprocess

    from tests.conftest import REPO

    for script, args, fragment in (("ray_head.sh", ["abc"], "PORT 'abc' is not a port number"),
                                   ("ray_head.sh", ["6379", "two"], "NUM_CPUS 'two' is not a whole number"),
                                   ("ray_worker.sh", [], "expected 1 to 3 arguments, got 0"),
                                   ("ray_worker.sh", ["127.0.0.1"], "'127.0.0.1' is not HEAD_IP:PORT"),
                                   ("ray_worker.sh", ["127.0.0.1:6379", "1", "x"], "'x' is not a whole number")):
        proc = subprocess.run(["bash", str(REPO / "launch" / script), *args], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "RAY": "/bin/false"}, timeout=30)
        assert proc.returncode == 2 and fragment in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_grpo_group_rollouts_run_in_the_ray_workers(need_maniskill, cluster, tmp_path):
    """GRPO on two rollout workers: each worker's envs form whole groups; one round gives every group of the
    job its own initial state (shared by the group's envs, different between groups and workers); dynamic
    sampling reports over the joined rounds; a killed worker is replaced and the run finishes."""
    import csv

    from robo_rl.config import load
    from robo_rl.run_config import TrainConfig

    cfg = load(TrainConfig, REPO / "configs" / "grpo_pushcube_state.yaml",
               [*FAST, f"run.out_dir={tmp_path}", "run.init_from=null", "run.max_minutes=null", "algo.group_size=2",
                "algo.min_groups=2", "algo.max_rounds=2", "algo.max_episode_steps=10", "env.num_envs=8",
                f"cluster.address={cluster}", "cluster.num_workers=2", "run.total_env_steps=960", "run.name=grpo-ray"])
    seen = {}

    def check_a_round_then_pick_a_worker(trainer):
        traj, steps = trainer.env._group_round()
        seen["groups"] = sorted(set(traj.group.tolist()))
        first = traj.obs["state"][0]
        seen["shared"] = all(torch.equal(*first[traj.group == g]) for g in range(4))  # one state per group
        seen["distinct"] = len({tuple(first[traj.group == g][0].tolist()) for g in range(4)})
        seen["steps"] = (steps, int(traj.valid.sum()))
        return trainer.env.worker_pids()[0]

    summary, killed = _train_killing_at_iteration_3(cfg, check_a_round_then_pick_a_worker)
    assert seen["groups"] == [0, 1, 2, 3] and seen["shared"] and seen["distinct"] == 4
    assert seen["steps"][0] == seen["steps"][1]
    assert killed and summary["worker_restarts"] == 1 and summary["stop_reason"] == "total_env_steps"
    rows = list(csv.DictReader(open(tmp_path / "grpo-ray" / "metrics.csv")))
    assert len(rows) == summary["iterations"] >= 4
    assert all(float(r["rollout/groups"]) == 4 * float(r["rollout/rounds"]) > 0 for r in rows)
    proc = run_cli("train", "--json", "configs/grpo_pushcube_state.yaml", *FAST, f"run.out_dir={tmp_path}",
                   "run.name=x", "run.init_from=null", "algo.group_size=4", "env.num_envs=6",
                   f"cluster.address={cluster}", "cluster.num_workers=2")
    assert proc.returncode == 2 and "splits env.num_envs=6 into [3, 3]" in proc.stderr, proc.stderr[-1500:]
    assert "make env.num_envs a multiple of 8" in proc.stderr and not (tmp_path / "x").exists()
