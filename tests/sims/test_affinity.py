"""CPU pinning of env workers and the trainer (``env.worker_cpus``, ``run.policy_cpus``): real ManiSkill
workers run on the cores they were given, and so does a worker that replaces a killed one; the trainer
process pins every one of its threads; bad ids are one-line errors before a run directory exists."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from robo_rl.affinity import check_cpus
from robo_rl.errors import ConfigError

ALLOWED = sorted(os.sched_getaffinity(0))


def test_check_cpus_names_the_key_the_bad_ids_and_the_allowed_ones():
    assert check_cpus([ALLOWED[0], ALLOWED[0]], "env.worker_cpus") == (ALLOWED[0],)
    bad = max(ALLOWED) + 100
    with pytest.raises(ConfigError, match=rf"'env.worker_cpus' = \[{bad}\] names CPUs \[{bad}\] .*allowed CPU ids: "):
        check_cpus([bad], "env.worker_cpus")
    with pytest.raises(ConfigError, match="'run.policy_cpus' = \\[\\] is empty"):
        check_cpus([], "run.policy_cpus")


def test_pin_process_pins_threads_started_before_it_and_leaves_children_the_rest():
    """In a fresh interpreter: a thread already running is pinned too (sched_setaffinity(0) alone pins
    only the calling thread), and ids outside the pinned mask stay valid for env workers."""
    code = textwrap.dedent(f"""
        import os, threading, time
        from robo_rl.affinity import available_cpus, check_cpus, pin_process
        stop = threading.Event()
        t = threading.Thread(target=stop.wait); t.start()
        pin_process([{ALLOWED[-1]}])
        masks = {{int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")}}
        stop.set(); t.join()
        assert len(masks) >= 2 and all(m == {{{ALLOWED[-1]}}} for m in masks.values()), masks
        assert available_cpus() == tuple({ALLOWED}), available_cpus()
        assert check_cpus({ALLOWED}, "env.worker_cpus") == tuple({ALLOWED})
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.maniskill
def test_maniskill_workers_run_on_their_cpus_and_so_does_a_replacement(need_maniskill):
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    cpu = ALLOWED[0]
    env = ManiSkillVecEnv(ManiSkillConfig(task="PushCube-v1", num_envs=2, backend="cpu", max_episode_steps=50,
                                          worker_cpus=(cpu,)))
    try:
        env.reset(seed=0)
        act = np.zeros((2, *env.action_spec.shape), np.float32)
        env.step(act)
        assert [os.sched_getaffinity(p) for p in env.worker_pids] == [{cpu}, {cpu}]
        assert os.sched_getaffinity(0) == set(ALLOWED)  # the parent is left as it was
        victim = env.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        res = env.step(act)
        assert res.info["worker_restarted"].tolist() == [False, True]
        assert env.worker_pids[1] != victim and os.sched_getaffinity(env.worker_pids[1]) == {cpu}
    finally:
        env.close()


def test_bad_cpu_ids_fail_in_one_line_before_a_run_directory_exists(tmp_path):
    from tests.conftest import cli_in_process

    out = tmp_path / "runs"
    bad = max(ALLOWED) + 100
    proc = cli_in_process("train", "--json", "configs/quickstart.yaml", f"run.out_dir={out}", f"env.worker_cpus=[{bad}]")
    assert proc.returncode != 0
    assert f"config key 'env.worker_cpus' = [{bad}] names CPUs [{bad}]" in proc.stderr
    proc = cli_in_process("train", "--json", "configs/quickstart.yaml", f"run.out_dir={out}", f"run.policy_cpus=[{ALLOWED[0]}]")
    assert proc.returncode != 0 and "'run.policy_cpus' needs 'env.worker_cpus' as well" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()
