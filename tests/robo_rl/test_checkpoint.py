import json

import pytest
import torch

from robo_rl import checkpoint as ck
from robo_rl.errors import CheckpointError
from robo_rl.files import atomic_write_text


def _model(width=4):
    return torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Linear(width, 2))


def _save(root, step, model, keep=2, **meta):
    meta = {"policy": "mlp", "config": {}, "obs_spec": {"state": [3]}, "action_spec": {"shape": [2]}, **meta}
    return ck.save(root, step, model.state_dict(), {"algo": {}, "x": step}, meta, keep=keep)


def test_roundtrip_latest_and_retention(tmp_path):
    m = _model()
    for step in (10, 20, 30):
        _save(tmp_path / "checkpoints", step, m)
    dirs = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert dirs == ["step_0000000020", "step_0000000030"]
    c = ck.resolve(tmp_path)
    assert c.name == "step_0000000030"
    assert ck.read_meta(c)["policy"] == "mlp"
    m2 = _model()
    ck.load_into(m2, ck.load_model_state(c), c)
    for a, b in zip(m.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    assert ck.load_trainer_state(c)["x"] == 30
    assert not list((tmp_path / "checkpoints").glob(".*tmp*"))


def test_corrupt_weights_meta_and_trainer_state(tmp_path):
    c = _save(tmp_path / "checkpoints", 1, _model())
    (c / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="corrupt"):
        ck.load_model_state(c)
    (c / "trainer.json").write_bytes(b"nope")
    with pytest.raises(CheckpointError, match="corrupt"):
        ck.load_trainer_state(c)
    (c / "meta.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        ck.read_meta(c)
    (c / "meta.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(CheckpointError, match="not a robo-rl checkpoint"):
        ck.read_meta(c)


def test_mismatched_model_is_named(tmp_path):
    c = _save(tmp_path / "checkpoints", 1, _model(width=4))
    with pytest.raises(CheckpointError, match=r"shape of '0.bias' is \(4,\) but the model has \(8,\)"):
        ck.load_into(_model(width=8), ck.load_model_state(c), c)


def test_missing_paths(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        ck.resolve(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        ck.resolve(tmp_path)


def test_interrupted_save_leaves_previous_checkpoint(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    _save(root, 1, _model())

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ck, "write_trainer_state", boom)
    with pytest.raises(OSError):
        _save(root, 2, _model())
    assert ck.resolve(tmp_path).name == "step_0000000001"
    ck.load_model_state(ck.resolve(tmp_path))
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_0000000001"]  # no half-written copy left


def test_save_below_a_left_over_higher_step_keeps_the_new_one(tmp_path):
    """A run that crashed after renaming step 300 into place but before moving `latest` resumes from
    200; its next save (250) must survive pruning and be what the following resume loads."""
    root = tmp_path / "checkpoints"
    _save(root, 200, _model(), keep=1)
    _save(root, 300, _model(), keep=1)
    atomic_write_text(root / "latest", "step_0000000200\n")  # the crash: `latest` never moved
    _save(root, 250, _model(), keep=1)
    assert ck.resolve(tmp_path).name == "step_0000000250"
    assert ck.load_trainer_state(ck.resolve(tmp_path))["x"] == 250
    assert sorted(p.name for p in root.glob("step_*")) == ["step_0000000250", "step_0000000300"]
    _save(root, 350, _model(), keep=2)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_0000000300", "step_0000000350"]


def test_crash_while_resaving_a_step_restores_the_moved_aside_copy(tmp_path):
    root = tmp_path / "checkpoints"
    c = _save(root, 100, _model())
    c.rename(root / ".step_0000000100.old-12345")  # crashed between moving it aside and the swap
    assert ck.resolve(tmp_path).name == ".step_0000000100.old-12345"  # readers read it where it lies
    assert ck.load_trainer_state(ck.resolve(tmp_path))["x"] == 100
    assert not (root / "step_0000000100").exists()
    _save(root, 200, _model())  # the run's writer puts it back first
    assert sorted(p.name for p in root.glob("*step_*")) == ["step_0000000100", "step_0000000200"]


def test_failed_swap_of_a_resaved_step_puts_the_old_copy_back(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    _save(root, 100, _model())
    real = ck.os.replace

    def fail_on_swap(src, dst):
        if ".tmp-" in str(src):
            raise OSError("disk gone")
        real(src, dst)

    monkeypatch.setattr(ck.os, "replace", fail_on_swap)
    with pytest.raises(OSError):
        _save(root, 100, _model())
    monkeypatch.undo()
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_0000000100"]
    assert ck.load_trainer_state(ck.resolve(tmp_path))["x"] == 100


def test_undecodable_pointer_and_meta_and_incomplete_meta(tmp_path):
    root = tmp_path / "checkpoints"
    c = _save(root, 5, _model())
    (root / "latest").write_bytes(b"\x9c\xff\x00")
    assert ck.resolve(tmp_path) == c  # unreadable pointer: the highest step
    meta = json.loads((c / "meta.json").read_text())
    (c / "meta.json").write_bytes(b"\x9c\xff")
    with pytest.raises(CheckpointError, match="unreadable meta.json.*corrupt"):
        ck.read_meta(c)
    del meta["config"]
    (c / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="lacks config"):
        ck.read_meta(c)


def test_wilson_interval():
    from robo_rl.eval.metrics import wilson_interval

    lo, hi = wilson_interval(45, 50)
    assert lo == pytest.approx(0.7864, abs=1e-3) and hi == pytest.approx(0.9565, abs=1e-3)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and 0.69 < lo < 0.73
