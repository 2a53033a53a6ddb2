"""Random-shift image augmentation: every image moves by its own offset within the pad, edge pixels fill in,
and the draw is seeded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from robo_rl.data.augment import random_shift


def _shifted(img: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """(H, W, C) image moved by (dy, dx) pixels with edge replication: out[i, j] = img[clip(i - dy), clip(j - dx)]."""
    h, w = img.shape[:2]
    rows = np.clip(np.arange(h) - dy, 0, h - 1)
    cols = np.clip(np.arange(w) - dx, 0, w - 1)
    return img[rows][:, cols]


def _offset(src: np.ndarray, out: np.ndarray, pad: int) -> tuple[int, int] | None:
    hits = [(dy, dx) for dy in range(-pad, pad + 1) for dx in range(-pad, pad + 1)
            if np.array_equal(_shifted(src, dy, dx), out)]
    return hits[0] if len(hits) == 1 else None


def test_each_image_is_its_own_edge_padded_shift_within_the_pad():
    b, v, h, w, pad = 150, 2, 9, 11, 2
    rgb = torch.randint(0, 256, (b, v, h, w, 3), dtype=torch.uint8)
    out = random_shift(rgb, pad, torch.Generator().manual_seed(0))
    assert out.shape == rgb.shape and out.dtype == torch.uint8
    offsets = [_offset(rgb[i, k].numpy(), out[i, k].numpy(), pad) for i in range(b) for k in range(v)]
    assert None not in offsets  # every output is exactly one shift of its own input
    assert len(set(offsets)) == (2 * pad + 1) ** 2  # 300 draws cover all 25 offsets
    assert len({offsets[2 * i] for i in range(b)}) > 1 and any(offsets[2 * i] != offsets[2 * i + 1] for i in range(b))


def test_seeded_draws_repeat_and_pad_zero_is_the_input():
    rgb = torch.randint(0, 256, (4, 1, 16, 16, 3), dtype=torch.uint8)
    a = random_shift(rgb, 3, torch.Generator().manual_seed(7))
    b = random_shift(rgb, 3, torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and not torch.equal(a, random_shift(rgb, 3, torch.Generator().manual_seed(8)))
    assert random_shift(rgb, 0) is rgb


def test_bad_pad_or_layout_is_refused():
    with pytest.raises(ValueError, match="pad must be >= 0"):
        random_shift(torch.zeros(1, 1, 4, 4, 3, dtype=torch.uint8), -1)
    with pytest.raises(ValueError, match=r"\(B, V, H, W, C\)"):
        random_shift(torch.zeros(1, 4, 4, 3, dtype=torch.uint8), 1)


def test_negative_image_shift_config_is_one_line():
    from robo_rl.algorithms.bc import BCConfig
    from robo_rl.errors import ConfigError

    with pytest.raises(ConfigError, match="algo.image_shift"):
        BCConfig(dataset="d.h5", image_shift=-2)
