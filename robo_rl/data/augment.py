"""Image augmentation for learning from demonstrations.

Random shift (DrQ, Kostrikov et al. 2020; the random crop of robomimic and Diffusion Policy): each image is
padded by ``pad`` pixels of its own edge and cropped back to its size at a uniformly random offset, so the
scene moves by up to ``pad`` pixels in each direction. A policy cloned from a few hundred demonstrations
otherwise ties its actions to exact pixel positions of the cube in those frames. Written here rather than
taken from torchvision/kornia: neither is a dependency (torchvision does not fit our torch build), and the
operation is one padded gather over uint8 images in the contract's (B, V, H, W, 3) layout.
"""

from __future__ import annotations

import torch


def random_shift(rgb: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift every image of ``rgb`` (B, V, H, W, C) uint8 by its own random integer offset in
    [-pad, pad] along H and W (edge pixels fill what comes in); returns a new (B, V, H, W, C) tensor of
    the same dtype. ``pad`` 0 returns ``rgb`` itself. Offsets are drawn from ``generator``."""
    if pad < 0:
        raise ValueError(f"random_shift pad must be >= 0; got {pad}")
    if pad == 0:
        return rgb
    if rgb.dim() != 5:
        raise ValueError(f"random_shift takes images (B, V, H, W, C); got shape {tuple(rgb.shape)}")
    b, v, h, w, c = rgb.shape
    flat = rgb.reshape(b * v, h, w, c)
    rows = torch.arange(h + 2 * pad).clamp(pad, pad + h - 1) - pad  # edge-replicating index into the image
    cols = torch.arange(w + 2 * pad).clamp(pad, pad + w - 1) - pad
    oy = torch.randint(0, 2 * pad + 1, (b * v,), generator=generator)
    ox = torch.randint(0, 2 * pad + 1, (b * v,), generator=generator)
    r = rows[oy[:, None] + torch.arange(h)[None]]  # (BV, H) source rows
    q = cols[ox[:, None] + torch.arange(w)[None]]  # (BV, W) source columns
    img = torch.arange(b * v)[:, None, None]
    return flat[img, r[:, :, None], q[:, None, :]].reshape(b, v, h, w, c)
