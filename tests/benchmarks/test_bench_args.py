"""`robo-rl bench` sub-commands reject bad counts and unwritable output paths right after parsing
(exit code 2, one line), before any model or env is built, and write their result files atomically."""

from __future__ import annotations

import importlib
import json
import os
import sys
import types

import pytest

from benchmarks import output

# modules whose import or use means a bench got past its argument checks (models, envs, trainers)
HEAVY = ["vla.openvla.policy", "vla.pi0.policy", "sims.maniskill.env", "sims.libero.env", "policies.mlp",
         "robo_rl.rollout.collector", "robo_rl.runners.train", "stable_baselines3"]


class _Poison(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AssertionError(f"bench went on to use {self.__name__}.{name} despite bad arguments")


@pytest.fixture
def no_heavy(monkeypatch):
    """Any use of a model/env builder fails the test loudly."""
    for mod in HEAVY:
        monkeypatch.setitem(sys.modules, mod, _Poison(mod))

    def boom(*a, **k):
        raise AssertionError("bench went on to build models/envs despite bad arguments")

    decode = importlib.import_module("benchmarks.decode")
    monkeypatch.setattr(decode, "_build", boom)
    env = importlib.import_module("benchmarks.env_overhead")
    monkeypatch.setattr(env, "measure", boom)
    monkeypatch.setattr(env, "measure_libero", boom)
    chunks = importlib.import_module("benchmarks.chunks")
    monkeypatch.setattr(chunks, "measure", boom)
    ppo = importlib.import_module("benchmarks.ppo_vs_sb3")
    monkeypatch.setattr(ppo, "run_ours", boom)
    monkeypatch.setattr(ppo, "run_sb3", boom)
    import robo_rl.config

    monkeypatch.setattr(robo_rl.config, "load", boom)


def _fails(capsys, bench: str, argv: list[str], message: str) -> None:
    from benchmarks import run_bench

    with pytest.raises(SystemExit) as exc:
        run_bench(bench, argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: robo-rl bench ")
    assert f"error: {message}" in err, err
    assert "Traceback" not in err


BAD = [
    ("decode", ["--batch", "1", "--rounds", "0", "--threads", "1"], "--rounds 0 must be >= 1"),
    ("decode", ["--batch", "0", "--rounds", "1", "--threads", "1"], "--batch 0 must be >= 1"),
    ("decode", ["--batch", "1", "8", "-2"], "--batch -2 must be >= 1"),
    ("decode", ["--threads", "0"], "--threads 0 must be >= 1"),
    ("decode", ["--prompt-tokens", "0"], "--prompt-tokens 0 must be >= 1"),
    ("decode", ["--loop-max-batch", "-1"], "--loop-max-batch -1 must be >= 0"),
    ("env", ["--workers", "1", "--steps", "5", "--rounds", "0"], "--rounds 0 must be >= 1"),
    ("env", ["--workers", "1", "--steps", "0", "--rounds", "1"], "--steps 0 must be >= 1"),
    ("env", ["--workers", "0", "--steps", "5", "--rounds", "1"], "--workers 0 must be >= 1"),
    ("env", ["--sim", "libero", "--workers", "1", "--image-size", "0"], "--image-size 0 must be >= 1"),
    ("sample", ["--batch", "0"], "--batch 0 must be >= 1"),
    ("sample", ["--rounds", "0"], "--rounds 0 must be >= 1"),
    ("sample", ["--threads", "-1"], "--threads -1 must be >= 1"),
    ("sil", ["--transitions", "32", "0"], "--transitions 0 must be >= 1"),
    ("sil", ["--minibatches", "0"], "--minibatches 0 must be >= 1"),
    ("sil", ["--rounds", "0"], "--rounds 0 must be >= 1"),
    ("rollout", ["--steps", "0"], "--steps 0 must be >= 1"),
    ("rollout", ["--rounds", "0"], "--rounds 0 must be >= 1"),
    ("rollout", ["--hidden", "64", "0"], "--hidden 0 must be >= 1"),
    ("rollout", ["--envs-per-worker", "0"], "--envs-per-worker 0 must be >= 1"),
    ("rollout", ["--scene-workers", "-1"], "--scene-workers -1 must be >= 0"),
    ("rollout", ["--threads", "0"], "--threads 0 must be >= 1"),
    ("rollout", ["--env-cpus", "-1"], "--env-cpus -1 must be >= 0"),
    ("rollout", ["--num-envs", "1"], "--num-envs 1 must be >= 2"),
    ("scale", ["--num-envs", "4", "0"], "--num-envs 0 must be >= 1"),
    ("scale", ["--steps", "0"], "--steps 0 must be >= 1"),
    ("scale", ["--envs-per-worker", "0"], "--envs-per-worker 0 must be >= 1"),
    ("scale", ["--scene-workers", "-1"], "--scene-workers -1 must be >= 0"),
    ("chunks", ["--rounds", "0"], "--rounds 0 must be >= 1"),
    ("chunks", ["--chunk", "1", "0"], "--chunk 0 must be >= 1"),
    ("chunks", ["--image-size", "0"], "--image-size 0 must be >= 1"),
    ("ppo", ["--minutes", "0"], "--minutes 0.0 must be > 0"),
    ("ppo", ["--minutes", "nan"], "--minutes nan must be > 0"),
    ("ppo", ["--runs", "ours,sb4"], "--runs 'ours,sb4': unknown entries ['sb4']"),
    ("ppo", ["--runs", ","], "--runs ',': no entries"),
    ("ros", ["--rate", "0"], "--rate 0.0 must be > 0"),
    ("ros", ["--seconds", "-1"], "--seconds -1.0 must be > 0"),
    ("ros", ["--transport", "zenoh"], "argument --transport: invalid choice: 'zenoh'"),
    ("ros", ["--domain", "-1"], "--domain -1 must be >= 0"),
    ("ros", ["--domain", "233"], "--domain 233 must be <= 232"),
    ("ros", ["--peer"], "--peer needs one --transport"),
]


@pytest.mark.parametrize("bench,argv,message", BAD, ids=[f"{b}:{' '.join(a)}" for b, a, _ in BAD])
def test_bad_counts_fail_fast_with_one_line(no_heavy, capsys, bench, argv, message):
    _fails(capsys, bench, argv, message)


@pytest.fixture
def blocker(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    return f


@pytest.mark.parametrize("bench,flag", [("decode", "--json"), ("sample", "--json"), ("sil", "--json"), ("scale", "--json"),
                                        ("chunks", "--json"), ("ros", "--json"), ("ppo", "--out")])
def test_unwritable_output_fails_before_the_measurement(no_heavy, capsys, blocker, bench, flag):
    bad = blocker / "sub" / "r.json"  # a path under a regular file: its parent can never be created
    _fails(capsys, bench, [flag, str(bad)], f"{flag} {bad}: cannot create {bad.parent}: {blocker} is not a directory")
    _fails(capsys, bench, [flag, str(blocker.parent)], f"{flag} {blocker.parent}: {blocker.parent} is a directory")


def test_output_problem(tmp_path, blocker):
    assert output.output_problem(tmp_path / "new" / "deeper" / "r.json") is None
    assert output.output_problem(tmp_path / "r.json") is None
    assert output.output_problem(blocker) is None  # an existing file is replaced
    assert "is not a directory" in output.output_problem(blocker / "r.json")
    assert "is a directory" in output.output_problem(tmp_path)
    if os.geteuid() != 0:  # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            assert "is not writable" in output.output_problem(ro / "x" / "r.json")
        finally:
            ro.chmod(0o700)


def test_write_json_creates_the_directory_and_writes_atomically(tmp_path, monkeypatch):
    import robo_rl.files

    calls = []
    real = robo_rl.files.atomic_write_bytes

    def spy(path, data):
        calls.append(path)
        real(path, data)

    monkeypatch.setattr(robo_rl.files, "atomic_write_bytes", spy)
    target = tmp_path / "not" / "yet" / "r.json"
    output.write_json(target, {"rows": [1, 2]})
    assert json.loads(target.read_text()) == {"rows": [1, 2]}
    assert calls == [target]
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.json"]  # no temp file left behind
    output.write_json(target, [3])  # replaced, not appended
    assert json.loads(target.read_text()) == [3]


def test_bench_writes_its_result_through_the_atomic_helper(monkeypatch, tmp_path):
    """chunks end to end with the env side faked: its JSON lands in a directory created for it."""
    chunks = importlib.import_module("benchmarks.chunks")
    monkeypatch.setattr(chunks, "measure", lambda *a: {"blind": 2.0, "every-step": 1.0})
    written = []
    real = output.write_json
    monkeypatch.setattr(chunks, "write_json", lambda p, o: written.append(p) or real(p, o))
    target = tmp_path / "out" / "c.json"
    assert chunks.main(["--chunk", "4", "--json", str(target)]) == 0
    assert written == [str(target)]
    assert json.loads(target.read_text()) == [{"sim": "maniskill", "task": "PushCube-v1", "workers": 4, "chunk": 4,
                                               "blind": 2.0, "every-step": 1.0, "ratio": 2.0}]
