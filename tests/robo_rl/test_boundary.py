"""The env <-> policy boundary: per-dimension action bounds, kept through a checkpoint's meta.json."""

import json

import numpy as np
import pytest
import torch

from robo_rl import checkpoint as ck
from robo_rl.boundary import to_env_actions
from robo_rl.contracts import ArraySpec
from robo_rl.errors import CheckpointError


def test_per_dimension_bounds_clip_each_dimension_and_chunks():
    spec = ArraySpec((3,), "float32", [-0.1, -1.0, 0.0], [0.1, 1.0, 0.04])
    assert spec.low == (-0.1, -1.0, 0.0)  # stored hashable
    a = torch.tensor([[0.5, 0.5, 0.5], [-0.5, -2.0, -0.5]])
    out = to_env_actions(a, spec)
    np.testing.assert_allclose(out, [[0.1, 0.5, 0.04], [-0.1, -1.0, 0.0]], rtol=0, atol=1e-7)
    chunk = to_env_actions(a[:, None].expand(2, 4, 3), spec)  # (B, T, A)
    np.testing.assert_allclose(chunk[:, 2], out)
    scalar = ArraySpec((3,), "float32", -1.0, 1.0)
    np.testing.assert_allclose(scalar.bounds()[0], [-1.0, -1.0, -1.0])
    assert ArraySpec((3,), "float32", None, 1.0).bounds() is None
    np.testing.assert_allclose(to_env_actions(a, ArraySpec((3,), "float32")), a.numpy())  # unbounded: as is


def test_bounds_of_the_wrong_length_are_refused():
    with pytest.raises(ValueError, match=r"ArraySpec.high has 2 bounds for shape \(3,\).*one per element"):
        ArraySpec((3,), "float32", -1.0, [1.0, 1.0])


def _meta_with(tmp_path, action_spec):
    c = tmp_path / "step_1"
    c.mkdir()
    meta = {"obs_spec": {"state": [5]}, "action_spec": action_spec}
    (c / "meta.json").write_text(json.dumps(meta))
    return meta, c


def test_per_dimension_bounds_survive_meta_json(tmp_path):
    spec = ArraySpec((2,), "float32", [-0.5, -1.0], [0.5, 1.0])
    meta, c = _meta_with(tmp_path, {"shape": list(spec.shape), "low": spec.low, "high": spec.high})
    _, act = ck.specs_from_meta(json.loads(json.dumps(meta)), c)
    assert act == spec
    (tmp_path / "old").mkdir()
    meta, c2 = _meta_with(tmp_path / "old", {"shape": [2], "low": -1.0, "high": 1.0})
    assert ck.specs_from_meta(meta, c2)[1].bounds()[1].tolist() == [1.0, 1.0]  # scalar bounds (older runs) load


@pytest.mark.parametrize("bad", [[1.0], "1.0", [1.0, "x"], [True, False]])
def test_bad_bounds_in_meta_json_are_one_line_errors(tmp_path, bad):
    meta, c = _meta_with(tmp_path, {"shape": [2], "low": -1.0, "high": bad})
    with pytest.raises(CheckpointError, match=r"action_spec.high is .*expected a number or a list of 2 numbers"):
        ck.specs_from_meta(meta, c)
