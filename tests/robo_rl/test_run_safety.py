"""Run directories and checkpoints from elsewhere: nothing loaded runs code (no pickle), one writer per run,
resumes that would change what the weights mean are refused, received files are bounded and confined, and
a crashed or disk-full save leaves the previous checkpoint intact."""

from __future__ import annotations

import csv
import errno
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from robo_rl import checkpoint as ck
from robo_rl.build import check_model_size
from robo_rl.errors import CheckpointError, RunDirError
from robo_rl.files import json_depth, parse_json
from robo_rl.runlock import RunLock
from robo_rl.safe_load import safe_torch_load
from tests.conftest import REPO, run_cli


class _Payload:
    """Unpickling this calls os.system, which creates the file ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def _model(width: int = 4) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Linear(width, 2))


def _meta(**extra) -> dict:
    return {"policy": "mlp", "config": {}, "obs_spec": {"state": [3]}, "action_spec": {"shape": [2]}, **extra}


def _trainer_state(model: torch.nn.Module) -> dict:
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    return {"algo": {"optimizer": opt.state_dict(), "updates": 7},
            "state": {"iteration": 3, "wall_time": 1.5}, "reward_scaler": None,
            "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
            "generator": torch.Generator().manual_seed(5).get_state()}


def _assert_same(a, b, where="state"):
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    else:
        assert a == b, where


def _make_legacy(ckpt: Path, obj) -> None:
    """Turn ``ckpt`` into a checkpoint of an older robo-rl: trainer state pickled in trainer.pt."""
    (ckpt / ck.TRAINER_JSON).unlink()
    (ckpt / ck.TRAINER_TENSORS).unlink()
    torch.save(obj, ckpt / ck.LEGACY_TRAINER)


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("robo-rl: error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[0]


# --- 1. no pickle -------------------------------------------------------------------------------------------

def test_trainer_state_round_trips_exactly_without_unpickling(tmp_path, monkeypatch):
    model = _model()
    state = _trainer_state(model)
    state["odd"] = {"$key": (1, "a"), 2: [None, True, float("inf")]}
    c = ck.save(tmp_path / "checkpoints", 5, model.state_dict(), state, _meta())
    names = sorted(p.name for p in c.iterdir())
    assert names == ["meta.json", "model.safetensors", "trainer.json", "trainer.safetensors"]

    def no_unpickling(*a, **k):
        raise AssertionError("a checkpoint load unpickled something")

    monkeypatch.setattr(pickle, "loads", no_unpickling)
    monkeypatch.setattr(pickle, "load", no_unpickling)
    monkeypatch.setattr(torch, "load", no_unpickling)
    loaded = ck.load_trainer_state(c)
    _assert_same(state, loaded)
    np.random.set_state(loaded["numpy_rng"])  # usable as saved
    torch.optim.Adam(model.parameters()).load_state_dict(loaded["algo"]["optimizer"])


@pytest.mark.parametrize("state", [
    {"x": {"$pickle": "t0"}},
    {"x": {"$ndarray": "t0", "dtype": "|O", "shape": [1]}},
    {"x": {"$tensor": "missing"}},
    None,
])
def test_foreign_trainer_json_is_one_line(tmp_path, state):
    c = ck.save(tmp_path / "checkpoints", 1, _model().state_dict(), {"x": torch.zeros(1)}, _meta())
    doc = {"format": "robo-rl-trainer-state", "version": 1, "state": state} if state else {"format": "other"}
    (c / ck.TRAINER_JSON).write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="corrupt") as err:
        ck.load_trainer_state(c)
    assert "\n" not in str(err.value)


def test_pickled_trainer_pt_is_refused_and_upgrade_runs_nothing(tmp_path):
    marker = tmp_path / "PWNED"
    c = ck.save(tmp_path / "run" / "checkpoints", 64, _model().state_dict(), {"x": 1}, _meta())
    _make_legacy(c, {"algo": _Payload(marker)})
    with pytest.raises(CheckpointError, match=r"robo-rl checkpoint upgrade .*run'$"):
        ck.load_trainer_state(c)
    with pytest.raises(CheckpointError, match="posix.system.*nothing in it ran"):
        ck.upgrade(tmp_path / "run")
    msg = _one_line_error(run_cli("checkpoint", "upgrade", str(tmp_path / "run")))
    assert "posix.system" in msg
    assert not marker.exists()
    assert (c / ck.LEGACY_TRAINER).is_file() and not (c / ck.TRAINER_JSON).exists()  # left as it was


def test_upgrade_converts_an_older_run_once_and_exactly(tmp_path):
    model = _model()
    state = _trainer_state(model)
    root = tmp_path / "run" / "checkpoints"
    for step in (32, 64):
        _make_legacy(ck.save(root, step, model.state_dict(), {}, _meta()), state)
    proc = run_cli("checkpoint", "upgrade", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(json.loads(proc.stdout)["upgraded"]) == 2
    for step in (32, 64):
        c = root / f"step_{step:010d}"
        assert not (c / ck.LEGACY_TRAINER).exists()
        _assert_same(state, ck.load_trainer_state(c))
    assert ck.upgrade(tmp_path / "run")["upgraded"] == []  # a second run has nothing left to do


_UNPICKLING = ("weights_only=False", "allow_pickle=True", "pickle.load(", "pickle.loads(", "cloudpickle.load")
LEFT_FOR_ITS_OWNER: set[str] = set()


def test_no_loader_in_the_project_unpickles():
    """Every torch.load is weights_only=True, no np.load allows pickles, nothing calls pickle.load(s)."""
    found = set()
    for top in ("robo_rl", "vla", "policies", "real_robot", "sims", "scripts"):
        for path in (REPO / top).rglob("*.py"):
            text = path.read_text()
            found |= {f"{path.relative_to(REPO)}: {needle}" for needle in _UNPICKLING if needle in text}
    assert found <= LEFT_FOR_ITS_OWNER, found


def test_libero_init_states_load_with_the_allowlist():
    import importlib.util

    spec = importlib.util.find_spec("libero")  # located, not imported (importing it asks for a dataset path)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("LIBERO is not installed")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("libero/init_files/*/*.pruned_init"))
    if not files:
        pytest.skip("no LIBERO init files installed")
    states = safe_torch_load(files[0])
    assert isinstance(states, np.ndarray) and states.dtype == np.float64 and states.ndim == 2


# --- 2. one writer per run directory ---------------------------------------------------------------------

_HOLD = textwrap.dedent("""
    import sys, time
    from robo_rl.runlock import RunLock
    lock = RunLock(sys.argv[1]).acquire()
    print("locked", flush=True)
    time.sleep(60)
""")


def _hold_lock(run: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(run)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_writer_is_refused_naming_the_pid_and_a_killed_holder_frees_the_lock(tmp_path, caplog):
    holder = _hold_lock(tmp_path)
    try:
        with pytest.raises(RunDirError, match=rf"being written by process {holder.pid} ") as err:
            RunLock(tmp_path).acquire()
        assert "\n" not in str(err.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with caplog.at_level("WARNING"), RunLock(tmp_path):  # the kernel dropped it; the stale PID is reported
        assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())
    assert str(holder.pid) in caplog.text
    assert (tmp_path / ".lock").read_text() == ""  # a clean release leaves no PID


def test_readers_load_a_locked_run(tmp_path):
    """Teacher/eval/steer loading (policy_from_checkpoint) never takes the writer lock."""
    from robo_rl.build import build_policy, policy_from_checkpoint
    from robo_rl.config import load, to_dict
    from robo_rl.contracts import ArraySpec
    from robo_rl.run_config import TrainConfig

    cfg = load(TrainConfig, REPO / "configs/quickstart.yaml", ["policy.hidden=[8,8]"])
    policy = build_policy(cfg.policy, {"state": ArraySpec((5,), "float32")},
                          ArraySpec((2,), "float32", -1.0, 1.0))
    meta = _meta(config=to_dict(cfg), obs_spec={"state": [5]},
                 action_spec={"shape": [2], "low": -1.0, "high": 1.0})
    ck.save(tmp_path / "checkpoints", 1, policy.state_dict(), {}, meta)
    holder = _hold_lock(tmp_path)
    try:
        loaded, _, _ = policy_from_checkpoint(str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    _assert_same(policy.state_dict(), loaded.state_dict())


def test_forked_children_do_not_keep_the_lock(tmp_path):
    lock = RunLock(tmp_path).acquire()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only sleeps
        time.sleep(5)
        os._exit(0)
    try:
        lock.release()
        holder = _hold_lock(tmp_path)  # the lock is free while the forked child still runs
        holder.kill()
        holder.wait()
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


# --- 3. resume compares the config with the checkpoint ----------------------------------------------------

def test_resume_config_check_names_binding_changes_and_allows_safe_ones(caplog):
    from robo_rl.config import load, to_dict
    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.checks import check_resume_config

    base = load(TrainConfig, REPO / "configs/quickstart.yaml", ["policy.hidden=[8,8]"])
    meta = {"config": json.loads(json.dumps(to_dict(base)))}
    safe = load(TrainConfig, REPO / "configs/quickstart.yaml",
                ["policy.hidden=[8,8]", "run.total_env_steps=5000", "algo.lr=1e-5", "run.eval_episodes=3"])
    with caplog.at_level("INFO"):
        check_resume_config(safe, meta, Path("ck"))
    assert "algo.lr" in caplog.text and "run.total_env_steps" in caplog.text
    bad = load(TrainConfig, REPO / "configs/quickstart.yaml",
               ["policy.hidden=[8,8]", "env.control_mode=pd_joint_pos", "env.task=PickCube-v1",
                "env.extra.robot_uids=panda_wristcam", "policy.activation=relu"])
    with pytest.raises(CheckpointError) as err:
        check_resume_config(bad, meta, Path("ck"))
    msg = str(err.value)
    for key in ("env.control_mode 'pd_joint_delta_pos' -> 'pd_joint_pos'", "env.task", "env.extra.robot_uids",
                "policy.activation"):
        assert key in msg
    assert "\n" not in msg


# --- 4. received files: bounded and confined ---------------------------------------------------------------

def _timed(fn, *args):
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(CheckpointError) as err:
            fn(*args)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.monotonic() - t0 < 1.0 and "\n" not in str(err.value)
    return str(err.value), peak


def test_deeply_nested_and_huge_meta_json_are_refused_fast(tmp_path):
    c = ck.save(tmp_path / "checkpoints", 1, _model().state_dict(), {}, _meta())
    (c / "meta.json").write_text("[" * 200_000 + "]" * 200_000)
    msg, peak = _timed(ck.read_meta, c)
    assert "nested more than 64 levels" in msg and peak < 16 * 2**20
    with open(c / "meta.json", "wb") as fh:
        fh.write(b'{"pad": "' + b" " * (17 * 2**20) + b'"}')
    msg, peak = _timed(ck.read_meta, c)
    assert "more than 16 MiB" in msg and peak < 40 * 2**20
    (c / "trainer.json").write_text('{"state": ' + "{\"a\": " * 100_000 + "1" + "}" * 100_001)
    msg, _ = _timed(ck.load_trainer_state, c)
    assert "nested more than 64 levels" in msg


def test_strings_with_brackets_do_not_count_as_nesting():
    text = json.dumps({"a": "[[[[{{{{" * 100, "b": ['\\"[[[', [1, [2]]]}).encode()
    assert json_depth(text) == 4
    assert parse_json(text)["b"][1] == [1, [2]]


def test_a_huge_model_described_by_meta_is_refused_before_it_is_built(tmp_path):
    from policies.mlp import MLPConfig

    c = ck.save(tmp_path / "checkpoints", 1, _model().state_dict(), {}, _meta(obs_spec={"state": [42]},
                                                                             action_spec={"shape": [8]}))
    meta = ck.read_meta(c)
    obs, act = ck.specs_from_meta(meta, c)
    msg, peak = _timed(check_model_size, MLPConfig(hidden=(12000, 12000)), obs, act, f"checkpoint '{c}'")
    assert "289M parameters" in msg and "--allow-large" in msg and peak < 64 * 2**20
    check_model_size(MLPConfig(hidden=(64, 64)), obs, act, "small")  # a usual model passes
    ck.allow_large_models()
    try:
        check_model_size(MLPConfig(hidden=(12000, 12000)), obs, act, "allowed")
    finally:
        ck.allow_large_models(False)


def test_latest_pointer_and_step_links_must_stay_inside_the_run(tmp_path):
    outside = tmp_path / "elsewhere"
    ck.save(outside / "checkpoints", 9, _model().state_dict(), {}, _meta())
    run = tmp_path / "run"
    root = run / "checkpoints"
    ck.save(root, 1, _model().state_dict(), {}, _meta())
    (root / "latest").write_text("../../elsewhere/checkpoints/step_0000000009\n")
    msg, _ = _timed(ck.resolve, run)
    assert "not a step_N directory" in msg
    (root / "latest").write_text("step_0000000009\n")
    (root / "step_0000000009").symlink_to(outside / "checkpoints" / "step_0000000009")
    msg, _ = _timed(ck.resolve, run)
    assert "outside" in msg
    (root / "step_0000000009").unlink()
    (root / "step_0000000002").symlink_to(outside / "checkpoints" / "step_0000000009")
    (root / "latest").unlink()  # the highest step: a link out is refused as well
    assert "outside" in _timed(ck.resolve, run)[0]
    (root / "step_0000000002").unlink()
    weights = root / "step_0000000001" / "model.safetensors"
    weights.unlink()
    weights.symlink_to(outside / "checkpoints" / "step_0000000009" / "model.safetensors")
    assert "outside the checkpoint directory" in _timed(ck.load_model_state, root / "step_0000000001")[0]
    shutil.rmtree(root)
    root.symlink_to(outside / "checkpoints")
    assert "outside" in _timed(ck.resolve, run)[0]


@pytest.mark.parametrize("shard", ["../secret.safetensors", "/etc/passwd", "sub/../../x.safetensors",
                                   "link.safetensors"])
def test_shard_paths_of_an_index_stay_in_the_checkpoint(tmp_path, shard):
    from vla.openvla.checkpoint import read_state_dict

    ckpt = tmp_path / "vla"
    ckpt.mkdir()
    (tmp_path / "secret.safetensors").write_bytes(b"")
    (ckpt / "link.safetensors").symlink_to(tmp_path / "secret.safetensors")
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    msg, _ = _timed(read_state_dict, ckpt)
    assert "not inside" in msg and repr(shard) in msg
    from vla.pi0.checkpoint import _from_pretrained  # checked before transformers reads the shards

    assert "not inside" in _timed(_from_pretrained, ckpt)[0]


def test_non_finite_weights_name_the_tensor(tmp_path):
    model = _model()
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    c = ck.save(tmp_path / "checkpoints", 1, model.state_dict(), {}, _meta())
    msg, _ = _timed(ck.load_model_state, c)
    assert "NaN in tensor '1.weight'" in msg
    with torch.no_grad():
        model[1].weight[0, 0] = float("inf")
    c = ck.save(tmp_path / "checkpoints", 2, model.state_dict(), {}, _meta())
    assert "inf in tensor '1.weight'" in _timed(ck.load_model_state, c)[0]


# --- 5. crash hygiene ---------------------------------------------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temp_dirs_of_dead_writers_are_removed_by_the_next_save(tmp_path):
    root = tmp_path / "checkpoints"
    ck.save(root, 1, _model().state_dict(), {}, _meta())
    dead = _dead_pid()
    (root / f".step_0000000002.tmp-{dead}").mkdir()
    (root / f".step_0000000002.tmp-{dead}" / "model.safetensors").write_bytes(b"half")
    (root / f".latest.tmp-{dead}").write_text("step_0000000002")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (root / f".step_0000000003.tmp-{live.pid}").mkdir()
        ck.save(root, 4, _model().state_dict(), {}, _meta())
        left = sorted(p.name for p in root.iterdir() if p.name.startswith("."))
        assert left == [f".step_0000000003.tmp-{live.pid}"]
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize("failure", ["oserror", "safetensors"])
@pytest.mark.parametrize("which", ["model", "trainer"])
def test_disk_full_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, failure, which):
    import safetensors.torch
    from safetensors import SafetensorError

    root = tmp_path / "checkpoints"
    model = _model()
    ck.save(root, 1, model.state_dict(), {"x": torch.ones(2)}, _meta())
    real = safetensors.torch.save_file

    def full(tensors, filename, metadata=None):
        if (which == "model") == filename.endswith("model.safetensors"):
            if failure == "oserror":
                raise OSError(errno.ENOSPC, "No space left on device", filename)
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                  'message: "No space left on device" })')
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(CheckpointError) as err:
        ck.save(root, 2, model.state_dict(), {"x": torch.ones(2)}, _meta())
    msg = str(err.value)
    assert msg.startswith("disk full") and "\n" not in msg and ".step_0000000002.tmp-" in msg
    assert "step_0000000001' is intact" in msg
    monkeypatch.undo()
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_0000000001"]
    c = ck.resolve(tmp_path)
    ck.load_model_state(c)
    assert torch.equal(ck.load_trainer_state(c)["x"], torch.ones(2))


# --- end to end on ManiSkill: resume, eval, upgrade, two writers ------------------------------------------

SMALL = ["env.task=PickCube-v1", "env.num_envs=2", "run.rollout_steps=16", "run.eval_every_steps=0",
         "run.final_eval_episodes=0", "run.progress=false", "env.max_episode_steps=20",
         "policy.hidden=[64,64]", "run.checkpoint_every_steps=32", "run.video=false", "run.tensorboard=false"]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    proc = run_cli("train", "--json", "configs/quickstart.yaml", *SMALL, "run.total_env_steps=64", f"run.out_dir={out}",
                   "run.name=base")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "base"


def _copy(run: Path, tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(run, dst)
    return dst


def _lock_holder(run: Path) -> str:
    lock = run / ".lock"
    return lock.read_text().strip() if lock.exists() else ""


def _steps(run: Path) -> list[int]:
    return [int(r["env_steps"]) for r in csv.DictReader(open(run / "metrics.csv"))]


def test_malicious_trainer_pt_runs_nothing_on_resume_eval_or_upgrade(small_run, need_maniskill, tmp_path):
    run = _copy(small_run, tmp_path, "evil")
    marker = tmp_path / "PWNED"
    _make_legacy(ck.resolve(run), {"algo": _Payload(marker)})
    assert "robo-rl checkpoint upgrade" in _one_line_error(run_cli("train", "--json", "--resume", str(run)))
    proc = run_cli("eval", str(run), "--episodes", "1", "--num-envs", "1", "--no-video")
    assert proc.returncode == 0, proc.stderr[-2000:]  # evaluation reads weights and meta only
    assert "posix.system" in _one_line_error(run_cli("checkpoint", "upgrade", str(run)))
    assert not marker.exists()


def test_resume_refuses_another_control_mode(small_run, need_maniskill, tmp_path):
    run = _copy(small_run, tmp_path, "cm")
    cfg = run / "config.yaml"
    cfg.write_text(cfg.read_text().replace("control_mode: pd_joint_delta_pos", "control_mode: pd_joint_pos"))
    msg = _one_line_error(run_cli("train", "--json", "--resume", str(run), "run.total_env_steps=96"))
    assert "env.control_mode 'pd_joint_delta_pos' -> 'pd_joint_pos'" in msg
    assert _steps(run) == [32, 64]


def test_second_concurrent_resume_is_refused_and_the_first_runs_intact(small_run, need_maniskill, tmp_path):
    run = _copy(small_run, tmp_path, "two")
    before = list(csv.DictReader(open(run / "metrics.csv")))
    first = subprocess.Popen([sys.executable, "-m", "robo_rl.cli", "train", "--json", "--resume", str(run),
                              "run.total_env_steps=320"], cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while _lock_holder(run) != str(first.pid):
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()[-2000:]
            time.sleep(0.05)
        msg = _one_line_error(run_cli("train", "--json", "--resume", str(run), "run.total_env_steps=320"))
        assert f"being written by process {first.pid}" in msg
        assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    finally:
        first.kill()
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert rows[:2] == before and [int(r["env_steps"]) for r in rows] == list(range(32, 321, 32))


def test_resuming_the_same_checkpoint_twice_trains_the_same(small_run, need_maniskill, tmp_path):
    """The restored optimizer, RNG and counters fully determine the continued training."""
    weights = []
    for name in ("a", "b"):
        run = _copy(small_run, tmp_path, name)
        proc = run_cli("train", "--json", "--resume", str(run), "run.total_env_steps=128")
        assert proc.returncode == 0, proc.stderr[-2000:]
        weights.append(ck.load_model_state(ck.resolve(run)))
        assert _steps(run) == [32, 64, 96, 128]
    _assert_same(weights[0], weights[1])


def test_a_rollout_that_fails_for_good_keeps_the_last_update_and_the_run_resumes(fake_env, tmp_path, caplog):
    """An env that breaks mid-run (a worker that cannot be restarted) ends the run with its error, but the
    state after the last completed update is saved first and ``resume`` continues from it."""
    import logging

    from robo_rl.config import from_dict
    from robo_rl.errors import SimulatorUnavailable
    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.train import Trainer, make_run_dir, resume

    cfg = from_dict(TrainConfig, {
        "env": {"name": fake_env, "num_envs": 4, "max_episode_steps": 8},
        "policy": {"name": "mlp", "hidden": [16]},
        "algo": {"name": "ppo", "minibatches": 2, "epochs": 1},
        "run": {"total_env_steps": 320, "rollout_steps": 16, "eval_every_steps": 0, "final_eval_episodes": 0,
                "video": False, "progress": False, "tensorboard": False, "out_dir": str(tmp_path), "name": "f"}})
    trainer: list = []
    weights: dict = {}

    def break_env(row):  # after the 2nd update every step fails, as a worker that will not start again
        if row["iteration"] == 2:
            weights.update({k: v.clone() for k, v in trainer[0].policy.state_dict().items()})

            def fail(actions):
                raise SimulatorUnavailable("env worker 0 did not start within 180s")
            trainer[0].env.step = fail
        return False

    trainer.append(Trainer(cfg, make_run_dir(cfg), on_iteration=break_env))
    with caplog.at_level(logging.ERROR, logger="robo_rl.runners.train"):
        with pytest.raises(SimulatorUnavailable, match="did not start"):
            trainer[0].run()
    assert "robo-rl train --resume" in caplog.text
    run = tmp_path / "f"
    ckpt = ck.resolve(run)
    meta = ck.read_meta(ckpt)
    assert (meta["env_steps"], meta["iteration"]) == (128, 2)  # 2 updates of 16 x 4 steps, none after
    saved = ck.load_model_state(ckpt)
    _assert_same({k: saved[k] for k in weights}, weights, "weights after the 2nd update")
    summary = resume(run)
    assert summary["env_steps"] >= 320 and summary["stop_reason"] == "total_env_steps"
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [int(r["iteration"]) for r in rows] == list(range(1, summary["iterations"] + 1))
