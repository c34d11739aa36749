"""Models of the four papers, each a :class:`SplitModel` = ``head(body(x))`` with a width multiplier.

Every parameter name starts with ``body.`` or ``head.``, which is how methods find the head (FedPer,
FedRep, ...). ``width`` scales every hidden width with :func:`scaled`; input channels and the number of
classes are never scaled (capacity-heterogeneous methods build narrower copies this way). Sizes that
depend on the input (flatten sizes) are computed from ``in_channels`` and ``image_size``.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.core.pool import MaxPool2d, _has_negative_zero  # noqa: F401 (re-exported: the zoo's max-pool)
from common.registry import Registry

MODELS: Registry[Callable[..., SplitModel]] = Registry("model")

# Normalisation layers, matched by type (BatchNorm*, SyncBatchNorm and InstanceNorm* derive from _NormBase).
NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.modules.instancenorm._InstanceNorm,
    nn.GroupNorm,
    nn.LayerNorm,
)


def scaled(channels: int, width: float) -> int:
    """Hidden width rule: ``max(1, ceil(channels * width))``.

    A tolerance of 1e-9 absorbs float error, so ``scaled(10, 0.3)`` is 3, not 4.
    """
    return max(1, math.ceil(channels * width - 1e-9))


class SplitModel(nn.Module):
    """``forward(x) = head(body(x))``; ``body`` maps images to flat features ``[B, feature_dim]``."""

    body: nn.Module
    head: nn.Linear
    feature_dim: int
    #: entry name -> block size of its input dimension, for a linear layer fed by a channel-major flatten of
    #: C channels x block values (so that a narrow model's slice takes whole channels)
    flatten_blocks: dict[str, int]

    def __init__(self, body: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(feature_dim, num_classes)
        self.feature_dim = feature_dim
        self.flatten_blocks = {}

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The body's output, ``[B, feature_dim]``."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, num_classes]``."""
        return self.head(self.body(x))


def build_model(name: str, *, num_classes: int, in_channels: int, image_size: int, width: float = 1.0,
                **options: Any) -> SplitModel:
    """Build the registered model ``name``; an unknown option raises ``TypeError`` listing the valid ones."""
    if not width > 0:
        raise ValueError(f"model.width={width} is invalid: it must be > 0")
    factory = MODELS.get(name)
    accepted = {n for n, p in inspect.signature(factory).parameters.items() if p.kind is p.KEYWORD_ONLY}
    unknown = sorted(set(options) - accepted)
    if unknown:
        valid = sorted(accepted - {"num_classes", "in_channels", "image_size", "width"})
        raise TypeError(f"model {name!r} has no option(s) {unknown}; its options are {valid or '(none)'}")
    return factory(num_classes=num_classes, in_channels=in_channels, image_size=image_size, width=width,
                   **options)


def _flat_size(body: nn.Module, in_channels: int, image_size: int) -> int:
    """Number of features ``body`` produces for one ``in_channels x image_size x image_size`` image."""
    was_training = body.training
    body.eval()  # eval mode: a probe pass must not touch BatchNorm running statistics
    try:
        with torch.no_grad():
            out = body(torch.zeros(1, in_channels, image_size, image_size))
    finally:
        body.train(was_training)
    return int(out.reshape(1, -1).shape[1])


# ----------------------------------------------------------------------------------------- ResNets
def _norm(kind: str, channels: int, groups: int) -> nn.Module:
    """BatchNorm or GroupNorm with ``groups`` groups at every width (widths are multiples of it, see
    :func:`_hidden_widths`), so a narrow client's GN normalises over groups of the same count."""
    if kind == "bn":
        return nn.BatchNorm2d(channels)
    if kind == "gn":
        if channels % groups:
            raise ValueError(f"GroupNorm over {channels} channels needs a channel count divisible by "
                             f"model.options.gn_groups={groups}")
        return nn.GroupNorm(groups, channels)
    raise ValueError(f"model.options.norm={kind!r} is invalid: use 'bn' or 'gn'")


def _hidden_widths(widths: Sequence[int], width: float, norm: str, groups: int) -> list[int]:
    """:func:`scaled` widths; with GroupNorm rounded up to a multiple of the group count (unchanged at width 1
    for the zoo's widths), so the group count does not depend on the width."""
    if norm == "gn" and groups < 1:
        raise ValueError(f"model.options.gn_groups={groups} is invalid: it must be >= 1")
    step = groups if norm == "gn" else 1
    return [step * math.ceil(scaled(w, width) / step) for w in widths]


class BasicBlock(nn.Module):
    """conv3x3-norm-ReLU-conv3x3-norm plus the shortcut (1x1 conv + norm when stride or width changes)."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = _norm(norm, cout, groups)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = _norm(norm, cout, groups)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            _norm(norm, cout, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual block output."""
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNetBody(nn.Module):
    """Torchvision-layout ResNet without ``fc``: submodule names mirror torchvision (conv1, bn1, layerN)."""

    def __init__(self, in_channels: int, widths: Sequence[int], blocks: Sequence[int], norm: str = "bn",
                 gn_groups: int = 2) -> None:
        super().__init__()
        if len(widths) != len(blocks):
            raise ValueError(f"ResNet needs one block count per stage: widths {widths}, blocks {blocks}")
        self.conv1 = nn.Conv2d(in_channels, widths[0], 7, 2, 3, bias=False)
        self.bn1 = _norm(norm, widths[0], gn_groups)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = MaxPool2d(3, 2, 1)
        cin = widths[0]
        for stage, (cout, count) in enumerate(zip(widths, blocks, strict=True)):
            first_stride = 1 if stage == 0 else 2
            stage_blocks = [BasicBlock(cin if j == 0 else cout, cout, first_stride if j == 0 else 1, norm,
                                       gn_groups) for j in range(count)]
            self.add_module(f"layer{stage + 1}", nn.Sequential(*stage_blocks))
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
        """Features after global average pooling, ``[B, widths[-1]]``."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in range(self.num_stages):
            x = getattr(self, f"layer{stage + 1}")(x)
        return torch.flatten(self.avgpool(x), 1)


def _resnet(widths: Sequence[int], blocks: Sequence[int], num_classes: int, in_channels: int, width: float,
            norm: str, gn_groups: int) -> SplitModel:
    hidden = _hidden_widths(widths, width, norm, gn_groups)
    return SplitModel(ResNetBody(in_channels, hidden, blocks, norm, gn_groups), hidden[-1], num_classes)


@MODELS.register("resnet8")
def resnet8(*, num_classes: int, in_channels: int = 3, image_size: int = 32, width: float = 1.0,
            norm: str = "bn", gn_groups: int = 2) -> SplitModel:
    """FedCAC's ResNet-8 (official code's resnet.py): 3 stages of one BasicBlock, widths 64/128/256, strides 1/2/2."""
    return _resnet((64, 128, 256), (1, 1, 1), num_classes, in_channels, width, norm, gn_groups)


@MODELS.register("resnet10")
def resnet10(*, num_classes: int, in_channels: int = 3, image_size: int = 32, width: float = 1.0,
             norm: str = "bn", gn_groups: int = 2) -> SplitModel:
    """FedCAC's ResNet-10 (official code's resnet.py): 4 stages of one BasicBlock, widths 64/128/256/512."""
    return _resnet((64, 128, 256, 512), (1, 1, 1, 1), num_classes, in_channels, width, norm, gn_groups)


@MODELS.register("resnet18")
def resnet18(*, num_classes: int, in_channels: int = 3, image_size: int = 32, width: float = 1.0,
             norm: str = "bn", gn_groups: int = 2) -> SplitModel:
    """Torchvision ResNet-18 layout; ``norm="gn"`` (2 groups) is Pa3dFL's ResNet-18-GN (Pa3dFL Sec. 6.1, App. D.2)."""
    return _resnet((64, 128, 256, 512), (2, 2, 2, 2), num_classes, in_channels, width, norm, gn_groups)


# ------------------------------------------------------------------------------- pretrained weights
def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, Mapping) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
        for key in ("state_dict", "model"):  # a checkpoint wrapping the weights
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path} does not hold a state dict of tensors (got {type(obj).__name__})")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def load_pretrained(model: SplitModel, path: str | os.PathLike, *, strict_body: bool = True,
                    skip_head: bool = True) -> None:
    """Load a torchvision-style ResNet state dict (``conv1.*``, ``bn1.*``, ``layer1.*``, ``fc.*``).

    ``X`` goes to ``body.X`` and ``fc.X`` to ``head.X`` (unless ``skip_head``). With ``strict_body`` every
    body key must be in the file (BN ``num_batches_tracked`` excepted, old files lack it) and every
    non-``fc`` key of the file must exist in the body. A shape mismatch is always an error.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"pretrained weights not found at {path}: this harness never downloads them. Download them "
            f"elsewhere (e.g. torchvision's ImageNet resnet18 .pth) and place the file at {path}")
    mapped: dict[str, torch.Tensor] = {}
    for key, value in _read_state_dict(path).items():
        if key.startswith("fc."):
            if not skip_head:
                mapped["head." + key.removeprefix("fc.")] = value
        else:
            mapped["body." + key] = value
    own = model.state_dict()
    wrong = [f"{k} (file {tuple(v.shape)}, model {tuple(own[k].shape)})" for k, v in mapped.items()
             if k in own and v.shape != own[k].shape]
    problems = [f"{len(wrong)} shape mismatch(es): {', '.join(wrong)}"] if wrong else []
    if strict_body:
        missing = [k for k in own if k.startswith("body.") and k not in mapped
                   and not k.endswith(".num_batches_tracked")]
        unexpected = [k for k in mapped if k not in own]
        if missing:
            problems.append(f"{len(missing)} model key(s) missing from the file: {', '.join(missing)}")
        if unexpected:
            problems.append(f"{len(unexpected)} file key(s) the model lacks: {', '.join(unexpected)}")
    if not skip_head and ("head.weight" not in mapped or "head.bias" not in mapped):
        problems.append("skip_head=False but the file has no fc.weight/fc.bias")
    if problems:
        raise ValueError(f"weights in {path} do not fit the model: " + "; ".join(problems))
    model.load_state_dict({k: v for k, v in mapped.items() if k in own}, strict=False)


# -------------------------------------------------------------------------------------------- CNNs
class Body(nn.Sequential):
    """``nn.Sequential`` that runs each ReLU followed by a :class:`MaxPool2d` as the max-pool first, then the ReLU
    on the pooled (smaller) tensor: a quarter of the ReLU's work forward and backward after a 2 x 2 pool.

    The numbers are the same bits. Forward: ReLU keeps positive values and maps everything else to +0.0, so a
    window's maximum after the ReLU is its maximum before it when that is positive, and +0.0 (what the ReLU makes
    of any maximum <= 0) otherwise; a NaN, the pool's choice either way, passes the ReLU unchanged. Backward: both
    orders send the output's gradient to the same position, the pool's first maximal position in window order
    (among positive values the ReLU changes nothing; a NaN is chosen in both orders), and nothing, +0.0, to every
    position of a window whose maximum is <= 0 (the ReLU's gradient there is 0 in both orders), so the input's
    gradient is the same. Only where a pair's modules carry hooks, under ``torch.compile`` or a symbolic trace do
    the layers run in their listed order."""

    def forward(self, x: Any) -> Any:  # noqa: D102
        layers = list(self._modules.values())
        if isinstance(x, torch.fx.Proxy) or torch.compiler.is_compiling() or _global_hooks():
            for layer in layers:
                x = layer(x)
            return x
        i = 0
        while i < len(layers):
            layer = layers[i]
            pool = layers[i + 1] if i + 1 < len(layers) else None
            if (type(layer) is nn.ReLU and isinstance(pool, MaxPool2d) and not pool.return_indices
                    and not _has_hooks(layer) and not _has_hooks(pool)):
                x = layer(pool(x))
                i += 2
                continue
            x = layer(x)
            i += 1
        return x


def _has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def _global_hooks() -> bool:
    from torch.nn.modules import module as mod

    return bool(mod._global_forward_hooks or mod._global_forward_pre_hooks or mod._global_backward_hooks
                or mod._global_backward_pre_hooks)


def _conv_mlp(convs: Sequence[nn.Module], hidden: Sequence[int], num_classes: int, in_channels: int,
              image_size: int, fc_norm: bool = False) -> SplitModel:
    """Body = conv stack, flatten (channel-major), hidden FC (+ BatchNorm1d if ``fc_norm``) + ReLU layers;
    head = Linear."""
    layers: list[nn.Module] = [*convs, nn.Flatten()]
    features = _flat_size(nn.Sequential(*layers), in_channels, image_size)
    channels = [m.out_channels for m in convs if isinstance(m, nn.Conv2d)][-1]
    block = features // channels  # channel-major flatten: C blocks of H*W inputs
    first_linear = f"body.{len(layers)}.weight" if hidden else "head.weight"
    for h in hidden:
        layers += [nn.Linear(features, h), *([nn.BatchNorm1d(h)] if fc_norm else []), nn.ReLU(inplace=True)]
        features = h
    model = SplitModel(Body(*layers), features, num_classes)
    model.flatten_blocks = {first_linear: block}
    return model


def _conv_relu_pool(cin: int, cout: int, kernel: int, padding: int = 0) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, padding=padding), nn.ReLU(inplace=True), MaxPool2d(2)]


@MODELS.register("cnn_cifar100")
def cnn_cifar100(*, num_classes: int, in_channels: int = 3, image_size: int = 32,
                 width: float = 1.0) -> SplitModel:
    """Pa3dFL's CIFAR-100 CNN (App. D.2): 2 x (conv5x5 64, ReLU, maxpool2), FC 384, FC 192, head."""
    c = scaled(64, width)
    convs = _conv_relu_pool(in_channels, c, 5) + _conv_relu_pool(c, c, 5)
    return _conv_mlp(convs, [scaled(384, width), scaled(192, width)], num_classes, in_channels, image_size)


@MODELS.register("cnn_fmnist")
def cnn_fmnist(*, num_classes: int, in_channels: int = 1, image_size: int = 28,
               width: float = 1.0) -> SplitModel:
    """Pa3dFL's FashionMNIST CNN (App. D.2): conv5x5 32 and 64 (pad 2) with maxpools, FC 512, FC 128."""
    c1, c2 = scaled(32, width), scaled(64, width)
    convs = _conv_relu_pool(in_channels, c1, 5, padding=2) + _conv_relu_pool(c1, c2, 5, padding=2)
    return _conv_mlp(convs, [scaled(512, width), scaled(128, width)], num_classes, in_channels, image_size)


@MODELS.register("cnn_fedavg")
def cnn_fedavg(*, num_classes: int, in_channels: int = 1, image_size: int = 28, width: float = 1.0,
               norm: str = "none") -> SplitModel:
    """The two-conv CNN of FedAvg's paper (McMahan et al. 2017, Sec. 3) as PFLlib's ``FedAvgCNN`` builds it for
    (Fashion-)MNIST: conv5x5 32 and conv5x5 64 (no padding), each + ReLU + maxpool2, FC 512 + ReLU, head.
    ``norm="bn"`` adds BatchNorm after each conv (so that FedBN has norm layers to keep local)."""
    if norm not in ("none", "bn"):
        raise ValueError(f"model.options.norm={norm!r} is invalid for cnn_fedavg: use 'none' or 'bn'")
    layers: list[nn.Module] = []
    cin = in_channels
    for c in (scaled(32, width), scaled(64, width)):
        layers += [nn.Conv2d(cin, c, 5), *([nn.BatchNorm2d(c)] if norm == "bn" else []), nn.ReLU(inplace=True),
                   MaxPool2d(2)]
        cin = c
    return _conv_mlp(layers, [scaled(512, width)], num_classes, in_channels, image_size)


@MODELS.register("cnn_pfedhn")
def cnn_pfedhn(*, num_classes: int, in_channels: int = 3, image_size: int = 32, width: float = 1.0,
               norm: str = "none", conv1_padding: int = 0) -> SplitModel:
    """pFedHN's target network (official code AvivSham/pFedHN, ``CNNTarget`` with ``n_kernels=16``), a LeNet-5:
    conv5x5 16 and conv5x5 32, each + ReLU + maxpool2, FC 120 + ReLU, FC 84 + ReLU, head. ``conv1_padding=2`` on
    28x28 inputs computes exactly what the same network computes on the inputs zero-padded to 32x32 (the classic
    LeNet-5 treatment of MNIST). ``norm`` exists only as ``none`` (the network has no norm layers)."""
    if norm != "none":
        raise ValueError(f"model.options.norm={norm!r} is invalid for cnn_pfedhn: it has no norm layers; use 'none'")
    if conv1_padding < 0:
        raise ValueError(f"model.options.conv1_padding={conv1_padding!r} is invalid: use 0 or more")
    c1, c2 = scaled(16, width), scaled(32, width)
    convs = _conv_relu_pool(in_channels, c1, 5, padding=conv1_padding) + _conv_relu_pool(c1, c2, 5)
    return _conv_mlp(convs, [scaled(120, width), scaled(84, width)], num_classes, in_channels, image_size)


@MODELS.register("lenet64")
def lenet64(*, num_classes: int, in_channels: int = 3, image_size: int = 64,
            width: float = 1.0) -> SplitModel:
    """FedC2I's LeNet for 64x64 inputs (Table 7): the same layers as ``cnn_cifar100`` (body up to
    FC 384->192 + ReLU, head FC 192->C), with the flatten size of 64x64 inputs."""
    return cnn_cifar100(num_classes=num_classes, in_channels=in_channels, image_size=image_size, width=width)


@MODELS.register("small_cnn")
def small_cnn(*, num_classes: int, in_channels: int = 1, image_size: int = 8, width: float = 1.0,
              channels: Sequence[int] = (32, 64), hidden: int = 128, norm: str = "none") -> SplitModel:
    """Small CNN for the embedded data: conv3x3 pad 1 (+ BatchNorm if ``norm`` is ``"bn"`` or ``"bn_all"``) +
    ReLU per entry of ``channels``; maxpool2 after the last conv, and after the first too when
    ``image_size >= 16``; flatten, FC ``hidden`` (+ BatchNorm1d if ``norm="bn_all"``: every body layer
    normalised, as in the papers' ResNets, which FedBN needs) + ReLU, head."""
    if norm not in ("none", "bn", "bn_all"):
        raise ValueError(f"model.options.norm={norm!r} is invalid for small_cnn: use 'none', 'bn' (after each "
                         "conv) or 'bn_all' (after each conv and the hidden FC)")
    if not channels:
        raise ValueError("model.options.channels must list at least one conv width")
    layers: list[nn.Module] = []
    cin = in_channels
    last = len(channels) - 1
    for i, c in enumerate(channels):
        cout = scaled(int(c), width)
        layers.append(nn.Conv2d(cin, cout, 3, padding=1))
        if norm != "none":
            layers.append(nn.BatchNorm2d(cout))
        layers.append(nn.ReLU(inplace=True))
        if i == last or (i == 0 and image_size >= 16):
            layers.append(MaxPool2d(2))
        cin = cout
    return _conv_mlp(layers, [scaled(int(hidden), width)], num_classes, in_channels, image_size,
                     fc_norm=norm == "bn_all")


@MODELS.register("cnn_heterofl")
def cnn_heterofl(*, num_classes: int, in_channels: int = 1, image_size: int = 28, width: float = 1.0,
                 channels: Sequence[int] = (64, 128, 256, 512), norm: str = "bn") -> SplitModel:
    """HeteroFL's ``Conv`` (the official code's ``models/conv.py``, also in FedRolex's): per entry of ``channels``
    conv3x3 pad 1 (+ BatchNorm if ``norm="bn"``) + ReLU, a 2x2 max-pool after each but the last, global average
    pooling, head. The head's bias starts at 0 (the official ``init_param``); a HeteroFL scaler goes between
    each conv and its norm (``methods/_nested.add_scalers``)."""
    if norm not in ("none", "bn"):
        raise ValueError(f"model.options.norm={norm!r} is invalid for cnn_heterofl: use 'none' or 'bn'")
    if not channels:
        raise ValueError("model.options.channels must list at least one conv width")
    layers: list[nn.Module] = []
    cin = in_channels
    for i, c in enumerate(channels):
        cout = scaled(int(c), width)
        layers += [nn.Conv2d(cin, cout, 3, padding=1), *([nn.BatchNorm2d(cout)] if norm == "bn" else []),
                   nn.ReLU(inplace=True), *([MaxPool2d(2)] if i < len(channels) - 1 else [])]
        cin = cout
    model = SplitModel(Body(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten()), cin, num_classes)
    nn.init.zeros_(model.head.bias)
    return model
