"""Models of the four papers, each a :class:`SplitModel` = ``head(body(x))`` with a width multiplier.

Every parameter name starts with ``body.`` or ``head.``, which is how methods find the head (FedPer,
FedRep, ...). ``width`` scales every hidden width with :func:`scaled`; input channels and the number of
classes are never scaled (capacity-heterogeneous methods build narrower copies this way).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.registry import Registry

MODELS: Registry[Callable[..., SplitModel]] = Registry("model")
NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def scaled(channels: int, width: float) -> int:
    """Hidden width rule: ``max(1, ceil(channels * width))``."""
    return max(1, math.ceil(channels * width - 1e-9))


class SplitModel(nn.Module):
    """``forward(x) = head(body(x))``; ``body`` maps images to features ``[B, feature_dim]``."""

    def __init__(self, body: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(feature_dim, num_classes)
        self.feature_dim = feature_dim

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def build_model(name: str, *, num_classes: int, in_channels: int, image_size: int, width: float = 1.0,
                **options: Any) -> SplitModel:
    """Build the registered model ``name``; unknown options raise ``TypeError`` naming them."""
    if width <= 0:
        raise ValueError(f"model.width={width} is invalid: it must be > 0")
    return MODELS.get(name)(num_classes=num_classes, in_channels=in_channels, image_size=image_size,
                            width=width, **options)


def param_groups(model: nn.Module) -> dict[str, list[str]]:
    """State-dict keys by role: ``head``, ``body`` and ``norm`` (norm layers found by module type)."""
    keys = list(model.state_dict())
    norm = []
    for mod_name, module in model.named_modules():
        if isinstance(module, NORM_TYPES):
            prefix = f"{mod_name}." if mod_name else ""
            norm += [f"{prefix}{k}" for k in module.state_dict()]
    return {"head": [k for k in keys if k.startswith("head.")],
            "body": [k for k in keys if k.startswith("body.")],
            "norm": norm}


def _flat_size(body: nn.Module, in_channels: int, image_size: int) -> int:
    with torch.no_grad():
        return int(body(torch.zeros(1, in_channels, image_size, image_size)).shape[1])


# ----------------------------------------------------------------------------------------- ResNets
def _norm(kind: str, channels: int, groups: int) -> nn.Module:
    if kind == "bn":
        return nn.BatchNorm2d(channels)
    if kind == "gn":
        return nn.GroupNorm(min(groups, channels), channels)
    raise ValueError(f"model.options.norm={kind!r} is invalid: use 'bn' or 'gn'")


class BasicBlock(nn.Module):
    """3x3 conv-norm-relu-3x3 conv-norm plus identity (1x1 conv + norm when shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = _norm(norm, cout, groups)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = _norm(norm, cout, groups)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(norm, cout, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class ResNetBody(nn.Module):
    """Torchvision-layout ResNet body (names mirror torchvision: conv1, bn1, layer1..., no fc)."""

    def __init__(self, in_channels: int, widths: Sequence[int], blocks: Sequence[int], norm: str = "bn",
                 gn_groups: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 7, 2, 3, bias=False)
        self.bn1 = _norm(norm, widths[0], gn_groups)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = widths[0]
        for i, (cout, n) in enumerate(zip(widths, blocks, strict=True)):
            stride = 1 if i == 0 else 2
            layer = [BasicBlock(cin if j == 0 else cout, cout, stride if j == 0 else 1, norm, gn_groups)
                     for j in range(n)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
            cin = cout
        self.num_stages = len(widths)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d | nn.GroupNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(self.num_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return torch.flatten(self.avgpool(x), 1)


def _resnet(widths: Sequence[int], blocks: Sequence[int], num_classes: int, in_channels: int, width: float,
            norm: str = "bn", gn_groups: int = 2) -> SplitModel:
    ws = [scaled(w, width) for w in widths]
    return SplitModel(ResNetBody(in_channels, ws, blocks, norm, gn_groups), ws[-1], num_classes)


@MODELS.register("resnet8")
def resnet8(*, num_classes: int, in_channels: int = 3, image_size: int = 32, width: float = 1.0,
            norm: str = "bn") -> SplitModel:
    """FedCAC's ResNet-8 (spec 1.3): 3 stages of one BasicBlock, widths 64/128/256."""
    return _resnet((64, 128, 256), (1, 1, 1), num_classes, in_channels, width, norm)


@MODELS.register("resnet10")
def resnet10(*, num_classes: int, in_channels: int = 3, image_size: int = 32, width: float = 1.0,
             norm: str = "bn") -> SplitModel:
    """FedCAC's ResNet-10 (spec 1.3): 4 stages of one BasicBlock, widths 64/128/256/512."""
    return _resnet((64, 128, 256, 512), (1, 1, 1, 1), num_classes, in_channels, width, norm)


@MODELS.register("resnet18")
def resnet18(*, num_classes: int, in_channels: int = 3, image_size: int = 32, width: float = 1.0,
             norm: str = "bn", gn_groups: int = 2) -> SplitModel:
    """Torchvision ResNet-18 layout; ``norm="gn"`` with 2 groups is Pa3dFL's ResNet-18-GN (spec 2.7)."""
    return _resnet((64, 128, 256, 512), (2, 2, 2, 2), num_classes, in_channels, width, norm, gn_groups)


def load_pretrained(model: SplitModel, path: str | os.PathLike, *, skip_head: bool = True) -> None:
    """Load a torchvision-style ResNet state dict (``conv1.*``, ``layer1.*``, ``fc.*``) into the model."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"pretrained weights not found at {path}: download them where a network exists (e.g. torchvision's "
            "resnet18 ImageNet weights) and set model.pretrained to the local .pth file")
    state = torch.load(path, map_location="cpu", weights_only=True)
    mapped = {}
    for key, value in state.items():
        if key.startswith("fc."):
            if not skip_head:
                mapped["head." + key[3:]] = value
        else:
            mapped["body." + key] = value
    own = model.state_dict()
    missing = [k for k in own if k.startswith("body.") and k not in mapped]
    unexpected = [k for k in mapped if k not in own]
    wrong = [f"{k}: file {tuple(v.shape)} vs model {tuple(own[k].shape)}" for k, v in mapped.items()
             if k in own and v.shape != own[k].shape]
    if missing or unexpected or wrong:
        raise ValueError(f"weights in {path} do not fit the model: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]}, shape mismatches {wrong[:5]}")
    model.load_state_dict(mapped, strict=False)


# -------------------------------------------------------------------------------------------- CNNs
def _conv_mlp(convs: nn.Sequential, hidden: Sequence[int], num_classes: int, in_channels: int,
              image_size: int) -> SplitModel:
    """Conv feature stack, flatten, hidden FC+ReLU layers as the body; a linear head."""
    layers: list[nn.Module] = [*convs, nn.Flatten()]
    features = _flat_size(nn.Sequential(*layers), in_channels, image_size)
    for h in hidden:
        layers += [nn.Linear(features, h), nn.ReLU(inplace=True)]
        features = h
    return SplitModel(nn.Sequential(*layers), features, num_classes)


@MODELS.register("cnn_cifar100")
def cnn_cifar100(*, num_classes: int, in_channels: int = 3, image_size: int = 32,
                 width: float = 1.0) -> SplitModel:
    """Pa3dFL's CIFAR-100 CNN (spec 2.7): 2x(conv5x5 64, ReLU, maxpool2), FC 384, FC 192, head."""
    c = scaled(64, width)
    convs = nn.Sequential(nn.Conv2d(in_channels, c, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                          nn.Conv2d(c, c, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2))
    return _conv_mlp(convs, [scaled(384, width), scaled(192, width)], num_classes, in_channels, image_size)


@MODELS.register("cnn_fmnist")
def cnn_fmnist(*, num_classes: int, in_channels: int = 1, image_size: int = 28, width: float = 1.0) -> SplitModel:
    """Pa3dFL's FashionMNIST CNN (spec 2.7): conv5x5 32 / 64 pad 2 with maxpools, FC 512, FC 128, head."""
    c1, c2 = scaled(32, width), scaled(64, width)
    convs = nn.Sequential(nn.Conv2d(in_channels, c1, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                          nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(2))
    return _conv_mlp(convs, [scaled(512, width), scaled(128, width)], num_classes, in_channels, image_size)


@MODELS.register("lenet64")
def lenet64(*, num_classes: int, in_channels: int = 3, image_size: int = 64, width: float = 1.0) -> SplitModel:
    """FedC2I's LeNet for 64x64 inputs (spec 3.2): body up to FC 384->192 + ReLU, head FC 192->C."""
    c = scaled(64, width)
    convs = nn.Sequential(nn.Conv2d(in_channels, c, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                          nn.Conv2d(c, c, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2))
    return _conv_mlp(convs, [scaled(384, width), scaled(192, width)], num_classes, in_channels, image_size)


@MODELS.register("small_cnn")
def small_cnn(*, num_classes: int, in_channels: int = 1, image_size: int = 8, width: float = 1.0,
              channels: Sequence[int] = (32, 64), hidden: int = 128, norm: str = "none") -> SplitModel:
    """Small CNN for embedded data: 3x3 convs (+ BatchNorm if ``norm="bn"``, ReLU), a maxpool after the
    last (and after the first when the input is at least 16 px), FC ``hidden`` + ReLU, head."""
    if norm not in ("none", "bn"):
        raise ValueError(f"model.options.norm={norm!r} is invalid for small_cnn: use 'none' or 'bn'")
    layers: list[nn.Module] = []
    cin = in_channels
    for i, c in enumerate(channels):
        cout = scaled(c, width)
        layers += [nn.Conv2d(cin, cout, 3, padding=1), *([nn.BatchNorm2d(cout)] if norm == "bn" else []),
                   nn.ReLU(inplace=True)]
        if i == len(channels) - 1 or (i == 0 and image_size >= 16):
            layers.append(nn.MaxPool2d(2))
        cin = cout
    return _conv_mlp(nn.Sequential(*layers), [scaled(hidden, width)], num_classes, in_channels, image_size)
