"""Models: shapes, exact parameter counts from layer formulas, body/head naming, widths, pretrained loading."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from bench.models import MODELS, build_model, load_pretrained, param_groups, scaled


def conv(k: int, cin: int, cout: int, bias: bool = False) -> int:
    return k * k * cin * cout + (cout if bias else 0)


def bn(c: int) -> int:
    return 2 * c


def linear(i: int, o: int) -> int:
    return i * o + o


def block(cin: int, cout: int) -> int:
    shortcut = conv(1, cin, cout) + bn(cout) if cin != cout else 0
    return conv(3, cin, cout) + bn(cout) + conv(3, cout, cout) + bn(cout) + shortcut


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


INPUTS = {  # name -> (in_channels, image_size, num_classes)
    "resnet8": (3, 32, 10), "resnet10": (3, 64, 200), "resnet18": (3, 32, 10), "cnn_cifar100": (3, 32, 100),
    "cnn_fmnist": (1, 28, 10), "lenet64": (3, 64, 10), "small_cnn": (1, 8, 10),
}


def make(name: str, width: float = 1.0, **options) -> nn.Module:
    c, s, k = INPUTS[name]
    return build_model(name, num_classes=k, in_channels=c, image_size=s, width=width, **options)


def test_every_registered_model_is_covered():
    assert set(MODELS.names()) == set(INPUTS)


@pytest.mark.parametrize("name", sorted(INPUTS))
@pytest.mark.parametrize("width", [1.0, 0.5, 0.25])
def test_output_and_feature_shapes(name, width):
    c, s, k = INPUTS[name]
    model = make(name, width).eval()
    x = torch.rand(3, c, s, s)
    assert model(x).shape == (3, k)
    assert model.features(x).shape == (3, model.feature_dim)
    assert model.head.in_features == model.feature_dim and model.head.out_features == k
    assert all(n.startswith(("body.", "head.")) for n, _ in model.named_parameters())


def test_exact_parameter_counts_at_full_width():
    resnet8 = conv(7, 3, 64) + bn(64) + block(64, 64) + block(64, 128) + block(128, 256) + linear(256, 10)
    assert count(make("resnet8")) == resnet8 == 1_235_274
    body10 = conv(7, 3, 64) + bn(64) + block(64, 64) + block(64, 128) + block(128, 256) + block(256, 512)
    assert count(make("resnet10")) == body10 + linear(512, 200)
    assert count(build_model("resnet10", num_classes=100, in_channels=3, image_size=32)) == body10 + linear(512, 100)
    cifar_cnn = conv(5, 3, 64, True) + conv(5, 64, 64, True) + linear(1600, 384) + linear(384, 192)
    assert count(make("cnn_cifar100")) == cifar_cnn + linear(192, 100)
    fm = conv(5, 1, 32, True) + conv(5, 32, 64, True) + linear(3136, 512) + linear(512, 128) + linear(128, 10)
    assert count(make("cnn_fmnist")) == fm
    lenet = conv(5, 3, 64, True) + conv(5, 64, 64, True) + linear(10816, 384) + linear(384, 192) + linear(192, 10)
    assert count(make("lenet64")) == lenet
    small = conv(3, 1, 32, True) + conv(3, 32, 64, True) + linear(64 * 4 * 4, 128) + linear(128, 10)
    assert count(make("small_cnn")) == small


def test_resnet18_matches_torchvision_count_in_bn_and_gn():
    reference = torchvision.models.resnet18(num_classes=10)
    assert count(make("resnet18")) == count(reference) == 11_181_642
    assert count(make("resnet18", norm="gn", gn_groups=2)) == count(reference)
    gn = make("resnet18", norm="gn")
    assert all(m.num_groups == 2 for m in gn.modules() if isinstance(m, nn.GroupNorm))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in gn.modules())


def test_half_width_counts():
    half = conv(7, 3, 32) + bn(32) + block(32, 32) + block(32, 64) + block(64, 128) + linear(128, 10)
    assert count(make("resnet8", 0.5)) == half
    cnn = conv(5, 3, 32, True) + conv(5, 32, 32, True) + linear(800, 192) + linear(192, 96) + linear(96, 100)
    assert count(make("cnn_cifar100", 0.5)) == cnn


def test_width_rule():
    assert scaled(64, 1.0) == 64 and scaled(64, 0.5) == 32 and scaled(384, 1 / 16) == 24
    assert scaled(3, 0.1) == 1 and scaled(10, 0.25) == 3
    with pytest.raises(ValueError, match="model.width=0"):
        make("small_cnn", 0.0)


def test_param_groups_find_norm_layers_by_type_including_buffers():
    groups = param_groups(make("resnet8"))
    assert "body.bn1.running_mean" in groups["norm"] and "body.layer2.0.downsample.1.weight" in groups["norm"]
    assert not any("conv" in k for k in groups["norm"])
    assert groups["head"] == ["head.weight", "head.bias"]

    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(2, 2)
            self.body = nn.Sequential(nn.Linear(2, 2), nn.GroupNorm(1, 2))
            self.conv_not_norm = nn.LayerNorm(2)  # misleading name, found by type

    odd = param_groups(Odd())
    assert set(odd["norm"]) == {"body.1.weight", "body.1.bias", "conv_not_norm.weight", "conv_not_norm.bias"}


def test_same_seed_same_parameters():
    torch.manual_seed(3)
    a = make("resnet8")
    torch.manual_seed(3)
    b = make("resnet8")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_load_pretrained_reproduces_torchvision_features(tmp_path):
    torch.manual_seed(0)
    reference = torchvision.models.resnet18(weights=None)
    with torch.no_grad():  # non-trivial BN statistics
        for m in reference.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    path = tmp_path / "resnet18.pth"
    torch.save(reference.state_dict(), path)
    ours = make("resnet18")
    load_pretrained(ours, path)
    reference.fc = nn.Identity()
    x = torch.rand(2, 3, 32, 32)
    assert torch.equal(ours.eval().features(x), reference.eval()(x))


def test_load_pretrained_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.pth"):
        load_pretrained(make("resnet18"), tmp_path / "missing.pth")
    path = tmp_path / "r8.pth"
    torch.save({k.removeprefix("body."): v for k, v in make("resnet8").state_dict().items()}, path)
    with pytest.raises(ValueError, match="do not fit"):
        load_pretrained(make("resnet18"), path)


def test_small_cnn_optional_batchnorm():
    plain, bn_model = make("small_cnn"), make("small_cnn", norm="bn")
    assert count(bn_model) == count(plain) + bn(32) + bn(64)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in bn_model.modules()) == 2
    with pytest.raises(ValueError, match="model.options.norm='gn'"):
        make("small_cnn", norm="gn")
