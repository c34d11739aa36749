"""Models: shapes, parameter counts from layer formulas, naming, widths, norm groups, pretrained loading."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from bench.core.models import MODELS, NORM_TYPES, SplitModel, build_model, load_pretrained, scaled


# Parameter counts of single layers, written out from the layer formulas.
def conv(k: int, cin: int, cout: int, bias: bool = False) -> int:
    return k * k * cin * cout + (cout if bias else 0)


def norm(c: int) -> int:  # BN or GN affine: weight + bias
    return 2 * c


def linear(i: int, o: int) -> int:
    return i * o + o


def block(cin: int, cout: int) -> int:
    """BasicBlock: two 3x3 convs + two norms, plus a 1x1 conv + norm shortcut when the shape changes."""
    shortcut = conv(1, cin, cout) + norm(cout) if cin != cout else 0
    return conv(3, cin, cout) + norm(cout) + conv(3, cout, cout) + norm(cout) + shortcut


def stem(c: int) -> int:
    return conv(7, 3, c) + norm(c)


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


INPUTS = {  # name -> (in_channels, image_size, num_classes) at the intended input
    "resnet8": (3, 32, 10), "resnet10": (3, 64, 200), "resnet18": (3, 32, 10), "cnn_cifar100": (3, 32, 100),
    "cnn_fmnist": (1, 28, 10), "lenet64": (3, 64, 10), "small_cnn": (1, 8, 10), "cnn_fedavg": (1, 28, 10),
    "cnn_heterofl": (1, 28, 10),
    "cnn_pfedhn": (3, 32, 10),
}


def make(name: str, width: float = 1.0, **options) -> SplitModel:
    c, s, k = INPUTS[name]
    return build_model(name, num_classes=k, in_channels=c, image_size=s, width=width, **options)


def test_every_registered_model_is_covered():
    assert set(MODELS.names()) == set(INPUTS)


@pytest.mark.parametrize("name", sorted(INPUTS))
@pytest.mark.parametrize("width", [1.0, 0.5, 0.25])
def test_output_and_feature_shapes(name, width):
    c, s, k = INPUTS[name]
    model = make(name, width)
    x = torch.rand(3, c, s, s)
    assert model(x).shape == (3, k)
    assert model.features(x).shape == (3, model.feature_dim)
    assert model.body(x).shape == (3, model.feature_dim)
    assert isinstance(model.head, nn.Linear)
    assert model.head.in_features == model.feature_dim and model.head.out_features == k
    assert all(n.startswith(("body.", "head.")) for n in model.state_dict())


def test_exact_parameter_counts_at_full_width():
    resnet8 = stem(64) + block(64, 64) + block(64, 128) + block(128, 256) + linear(256, 10)
    assert count(make("resnet8")) == resnet8 == 1_235_274

    body10 = stem(64) + block(64, 64) + block(64, 128) + block(128, 256) + block(256, 512)
    assert count(make("resnet10")) == body10 + linear(512, 200) == 5_008_392
    r10_100 = build_model("resnet10", num_classes=100, in_channels=3, image_size=32)
    assert count(r10_100) == body10 + linear(512, 100) == 4_957_092

    cifar_cnn = conv(5, 3, 64, True) + conv(5, 64, 64, True) + linear(1600, 384) + linear(384, 192)
    assert count(make("cnn_cifar100")) == cifar_cnn + linear(192, 100) == 815_332

    fm = conv(5, 1, 32, True) + conv(5, 32, 64, True) + linear(3136, 512) + linear(512, 128) + linear(128, 10)
    assert count(make("cnn_fmnist")) == fm == 1_725_194

    lenet = (conv(5, 3, 64, True) + conv(5, 64, 64, True) + linear(10816, 384) + linear(384, 192)
             + linear(192, 10))
    assert count(make("lenet64")) == lenet == 4_336_906

    fedavg = conv(5, 1, 32, True) + conv(5, 32, 64, True) + linear(64 * 4 * 4, 512) + linear(512, 10)
    assert count(make("cnn_fedavg")) == fedavg == 582_026  # PFLlib's FedAvgCNN for MNIST (dim=1024)
    assert count(make("cnn_fedavg", norm="bn")) == fedavg + norm(32) + norm(64)

    small = conv(3, 1, 32, True) + conv(3, 32, 64, True) + linear(64 * 4 * 4, 128) + linear(128, 10)
    assert count(make("small_cnn")) == small == 151_306


def resnet18_count(c: int, classes: int) -> int:
    widths = [c, 2 * c, 4 * c, 8 * c]
    total, cin = stem(c), c
    for w in widths:
        total += block(cin, w) + block(w, w)
        cin = w
    return total + linear(8 * c, classes)


def test_resnet18_matches_torchvision_count_in_bn_and_gn():
    reference = torchvision.models.resnet18(weights=None, num_classes=10)
    assert count(make("resnet18")) == count(reference) == resnet18_count(64, 10) == 11_181_642
    gn = make("resnet18", norm="gn", gn_groups=2)
    assert count(gn) == count(reference)
    assert all(m.num_groups == 2 for m in gn.modules() if isinstance(m, nn.GroupNorm))
    assert sum(isinstance(m, nn.GroupNorm) for m in gn.modules()) == 20  # 1 stem + 16 in blocks + 3 shortcuts
    assert not any(isinstance(m, nn.BatchNorm2d) for m in gn.modules())


def test_resnet18_state_dict_keys_mirror_torchvision():
    reference = torchvision.models.resnet18(weights=None).state_dict()
    ours = make("resnet18").state_dict()
    expected = {("head." + k[3:]) if k.startswith("fc.") else "body." + k for k in reference}
    assert set(ours) == expected
    assert "body.layer2.0.downsample.0.weight" in ours and "body.layer1.0.conv1.weight" in ours
    stats = ("running_mean", "running_var", "num_batches_tracked")
    gn_expected = {k for k in expected if not k.endswith(stats)}
    assert set(make("resnet18", norm="gn").state_dict()) == gn_expected


def test_reduced_width_counts():
    r8 = stem(32) + block(32, 32) + block(32, 64) + block(64, 128) + linear(128, 10)
    assert count(make("resnet8", 0.5)) == r8 == 312_490
    assert count(make("resnet18", 0.5)) == resnet18_count(32, 10) == 2_801_450
    cnn = conv(5, 3, 32, True) + conv(5, 32, 32, True) + linear(800, 192) + linear(192, 96) + linear(96, 100)
    assert count(make("cnn_cifar100", 0.5)) == cnn == 210_084
    fm = conv(5, 1, 16, True) + conv(5, 16, 32, True) + linear(1568, 256) + linear(256, 64) + linear(64, 10)
    assert count(make("cnn_fmnist", 0.5)) == fm == 432_010
    lenet = (conv(5, 3, 32, True) + conv(5, 32, 32, True) + linear(5408, 192) + linear(192, 96)
             + linear(96, 10))
    assert count(make("lenet64", 0.5)) == lenet == 1_086_090
    quarter = conv(5, 1, 8, True) + conv(5, 8, 16, True) + linear(784, 128) + linear(128, 32) + linear(32, 10)
    assert count(make("cnn_fmnist", 0.25)) == quarter == 108_362


def test_resnet_structure():
    r8, r10 = make("resnet8"), make("resnet10")
    assert r8.feature_dim == 256 and r10.feature_dim == 512
    c1 = r8.body.conv1
    assert (c1.kernel_size, c1.stride, c1.padding, c1.bias) == ((7, 7), (2, 2), (3, 3), None)
    pool = r8.body.maxpool
    assert isinstance(pool, nn.MaxPool2d) and (pool.kernel_size, pool.stride, pool.padding) == (3, 2, 1)
    assert not hasattr(r8.body, "layer4") and len(r10.body.layer4) == 1
    assert r8.body.layer1[0].downsample is None
    for layer in (r10.body.layer2, r10.body.layer3, r10.body.layer4):
        assert layer[0].conv1.stride == (2, 2) and layer[0].downsample[0].stride == (2, 2)
    assert not any(m.bias is not None for m in r10.modules() if isinstance(m, nn.Conv2d))
    bns = [m for m in r10.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(torch.all(m.weight == 1) and torch.all(m.bias == 0) for m in bns)
    std = r10.body.layer4[0].conv2.weight.std().item()  # kaiming fan_out: sqrt(2 / (9 * 512))
    assert abs(std - (2 / (9 * 512)) ** 0.5) < 0.05 * std


def test_flatten_sizes_follow_the_input():
    assert make("cnn_cifar100").body[7].in_features == 1600
    assert make("cnn_fmnist").body[7].in_features == 3136
    assert make("lenet64").body[7].in_features == 10816
    odd = build_model("cnn_cifar100", num_classes=5, in_channels=1, image_size=28)  # 28-4=24/2=12-4=8/2=4
    assert odd.body[7].in_features == 64 * 4 * 4 and odd(torch.rand(2, 1, 28, 28)).shape == (2, 5)
    mnist_cnn = build_model("small_cnn", num_classes=10, in_channels=1, image_size=28)  # two pools: 7x7
    assert mnist_cnn.body[-2].in_features == 64 * 7 * 7
    custom = build_model("small_cnn", num_classes=4, in_channels=3, image_size=8, channels=(8, 16, 24),
                         hidden=20)
    assert custom.feature_dim == 20 and custom.body[-2].in_features == 24 * 4 * 4


def test_width_rule():
    assert scaled(64, 1.0) == 64 and scaled(64, 0.5) == 32 and scaled(384, 1 / 16) == 24
    assert scaled(3, 0.1) == 1 and scaled(10, 0.25) == 3 and scaled(10, 0.3) == 3 and scaled(1, 0.01) == 1
    model = make("resnet8", 0.1)  # ceil(6.4) = 7 stem channels; input channels and classes untouched
    assert model.body.conv1.weight.shape == (7, 3, 7, 7) and model.head.out_features == 10


def test_build_model_errors():
    with pytest.raises(ValueError, match="model.width=0"):
        make("small_cnn", 0.0)
    with pytest.raises(TypeError, match="'bogus'.*norm"):
        make("resnet8", bogus=1)
    with pytest.raises(KeyError, match="resnet8"):
        build_model("resnet9", num_classes=10, in_channels=3, image_size=32)
    with pytest.raises(ValueError, match="model.options.norm='ln'"):
        make("resnet18", norm="ln")


@pytest.mark.parametrize("name", ["resnet8", "resnet18", "lenet64", "small_cnn"])
def test_same_seed_same_parameters(name):
    torch.manual_seed(3)
    a = make(name).state_dict()
    torch.manual_seed(3)
    b = make(name).state_dict()
    torch.manual_seed(4)
    c = make(name).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["head.weight"], c["head.weight"])


def test_building_does_not_touch_norm_statistics():
    model = make("small_cnn", norm="bn")
    assert model.training
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.all(m.running_mean == 0) and torch.all(m.running_var == 1)
            assert m.num_batches_tracked.item() == 0


def test_gn_keeps_its_group_count_at_a_width_whose_channels_it_does_not_divide():
    model = make("resnet18", width=0.35, norm="gn")  # ceil(64 * 0.35) = 23 channels, rounded up to 24 for 2 groups
    assert model.body.bn1.num_channels == 24 and model.body.bn1.num_groups == 2
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def random_torchvision_resnet18(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    reference = torchvision.models.resnet18(weights=None)
    with torch.no_grad():  # non-trivial BN affine parameters and statistics
        for m in reference.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return reference


def test_load_pretrained_reproduces_torchvision_features(tmp_path):
    reference = random_torchvision_resnet18()
    path = tmp_path / "resnet18.pth"
    torch.save(reference.state_dict(), path)
    torch.manual_seed(1)
    ours = make("resnet18")
    head_before = ours.head.weight.clone()
    load_pretrained(ours, path)
    assert torch.equal(ours.head.weight, head_before)  # skip_head: the 10-class head is kept
    reference.fc = nn.Linear(512, 10)
    reference.fc.load_state_dict(ours.head.state_dict())
    x = torch.rand(2, 3, 32, 32)
    ours.eval(), reference.eval()
    with torch.no_grad():
        assert torch.equal(ours(x), reference(x))
        reference.fc = nn.Identity()
        assert torch.equal(ours.features(x), reference(x))


def test_load_pretrained_with_head_and_old_file_format(tmp_path):
    reference = random_torchvision_resnet18(seed=2)
    state = {k: v for k, v in reference.state_dict().items() if not k.endswith("num_batches_tracked")}
    path = tmp_path / "old.pth"
    torch.save(state, path)  # old torchvision files have no num_batches_tracked
    ours = build_model("resnet18", num_classes=1000, in_channels=3, image_size=32)
    load_pretrained(ours, path, skip_head=False)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(ours.eval()(x), reference.eval()(x))
    with pytest.raises(ValueError, match=r"head\.weight \(file \(1000, 512\), model \(10, 512\)\)"):
        load_pretrained(make("resnet18"), path, skip_head=False)


def test_load_pretrained_missing_file(tmp_path):
    missing = tmp_path / "nowhere" / "resnet18-imagenet.pth"
    with pytest.raises(FileNotFoundError, match="resnet18-imagenet.pth") as info:
        load_pretrained(make("resnet18"), missing)
    assert str(missing) in str(info.value) and "download" in str(info.value).lower()


def test_load_pretrained_shape_mismatch_names_the_keys(tmp_path):
    path = tmp_path / "r18.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    expected = r"do not fit.*body\.conv1\.weight \(file \(64, 3, 7, 7\), model \(32, 3, 7, 7\)\)"
    with pytest.raises(ValueError, match=expected):
        load_pretrained(make("resnet18", 0.5), path)
    gray = build_model("resnet18", num_classes=10, in_channels=1, image_size=32)
    with pytest.raises(ValueError, match="1 shape mismatch"):
        load_pretrained(gray, path)


def test_load_pretrained_missing_and_unexpected_keys_and_lenient_mode(tmp_path):
    source = make("resnet8")
    r8_path, r18_path = tmp_path / "r8.pth", tmp_path / "r18.pth"
    torch.save({k.removeprefix("body."): v for k, v in source.state_dict().items() if k.startswith("body.")},
               r8_path)
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), r18_path)
    with pytest.raises(ValueError, match=r"missing from the file: .*body\.layer4\.0\.conv1\.weight"):
        load_pretrained(make("resnet10"), r8_path)
    with pytest.raises(ValueError, match=r"the model lacks: .*body\.layer1\.1\.conv1\.weight"):
        load_pretrained(make("resnet10"), r18_path)
    # lenient: resnet8's three stages fit resnet10's first three exactly; layer4 keeps its initialisation
    target = make("resnet10")
    layer4 = target.body.layer4[0].conv1.weight.clone()
    load_pretrained(target, r8_path, strict_body=False)
    assert torch.equal(target.body.layer3[0].conv1.weight, source.body.layer3[0].conv1.weight)
    assert torch.equal(target.body.bn1.running_var, source.body.bn1.running_var)
    assert torch.equal(target.body.layer4[0].conv1.weight, layer4)
    with pytest.raises(ValueError, match="shape mismatch"):  # shapes are checked even when lenient
        load_pretrained(make("resnet10", 0.5), r8_path, strict_body=False)


def test_small_cnn_optional_batchnorm():
    plain, bn_model = make("small_cnn"), make("small_cnn", norm="bn")
    assert count(bn_model) == count(plain) + norm(32) + norm(64)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in bn_model.modules()) == 2
    with pytest.raises(ValueError, match="model.options.norm='gn'"):
        make("small_cnn", norm="gn")


def test_cnn_pfedhn_is_the_official_target_and_pads_28x28_like_32x32():
    """pFedHN's CNNTarget (n_kernels 16): 121,182 parameters on CIFAR-10; with conv1_padding=2 a 28x28 input gives
    the logits the same weights give on the input zero-padded to 32x32."""
    conv1, conv2 = 3 * 16 * 25 + 16, 16 * 32 * 25 + 32
    assert count(make("cnn_pfedhn")) == conv1 + conv2 + (800 * 120 + 120) + (120 * 84 + 84) + (84 * 10 + 10) == 121_182
    padded = build_model("cnn_pfedhn", num_classes=10, in_channels=1, image_size=28, conv1_padding=2)
    plain = build_model("cnn_pfedhn", num_classes=10, in_channels=1, image_size=32)
    assert [p.shape for p in padded.parameters()] == [p.shape for p in plain.parameters()]
    plain.load_state_dict(padded.state_dict())
    x = torch.randn(4, 1, 28, 28)
    torch.testing.assert_close(padded(x), plain(nn.functional.pad(x, (2, 2, 2, 2))), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="model.options.norm='bn' is invalid for cnn_pfedhn"):
        make("cnn_pfedhn", norm="bn")
    with pytest.raises(ValueError, match="conv1_padding=-1 is invalid"):
        make("cnn_pfedhn", conv1_padding=-1)


def test_cnn_fedavg_batchnorm_option_and_bad_norm():
    bn = make("cnn_fedavg", norm="bn")
    assert sum(isinstance(m, nn.BatchNorm2d) for m in bn.modules()) == 2
    assert not any(isinstance(m, nn.BatchNorm2d) for m in make("cnn_fedavg").modules())
    with pytest.raises(ValueError, match="model.options.norm='gn' is invalid for cnn_fedavg"):
        make("cnn_fedavg", norm="gn")


def test_small_cnn_bn_all_normalises_every_body_layer():
    """norm=bn_all: BatchNorm after each conv and after the hidden FC (what FedBN keeps local); norm=bn: convs only."""
    kinds = {norm: [type(m).__name__ for m in make("small_cnn", norm=norm).body]
             for norm in ("none", "bn", "bn_all")}
    assert kinds["none"].count("BatchNorm2d") == 0 and "BatchNorm1d" not in kinds["none"]
    assert kinds["bn"].count("BatchNorm2d") == 2 and "BatchNorm1d" not in kinds["bn"]
    assert kinds["bn_all"].count("BatchNorm2d") == 2
    assert kinds["bn_all"][kinds["bn_all"].index("Linear") + 1] == "BatchNorm1d"
    model = make("small_cnn", norm="bn_all")
    assert sum(isinstance(m, NORM_TYPES) for m in model.modules()) == 3  # one per conv and one on the hidden FC
    out = model(torch.randn(5, 1, 8, 8))
    assert out.shape == (5, 10)
    with pytest.raises(ValueError, match="model.options.norm='gn'.*bn_all"):
        make("small_cnn", norm="gn")


def _stock_pool(pool: nn.MaxPool2d) -> nn.MaxPool2d:
    return nn.MaxPool2d(pool.kernel_size, pool.stride, pool.padding)


def with_stock_pools(model: nn.Module) -> int:
    """Replace each of the models' MaxPool2d layers in ``model`` by torch's nn.MaxPool2d; how many it replaced."""
    from bench.core.models import MaxPool2d

    swapped = 0
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, MaxPool2d):
                setattr(parent, child_name, _stock_pool(child))
                swapped += 1
    return swapped


@pytest.mark.parametrize("shape", [(6, 5, 9, 11), (20, 16, 16, 16)])  # odd sizes; the vectorised kernels' sizes
@pytest.mark.parametrize("settings", [(2,), (3, 2, 1)])
@pytest.mark.parametrize("kind", ["ties", "relu", "signed_zeros", "nan"])
def test_max_pool_computes_the_stock_kernels_bits_and_gradients(shape, settings, kind):
    """The models' MaxPool2d (channels-last kernel with autograd, running maximum of strided views without) gives
    the values, signs of zeros, NaNs and input gradients of torch's own nn.MaxPool2d, odd sizes and ties
    included: swapping it in changes no record."""
    from bench.core.models import MaxPool2d

    torch.manual_seed(0)
    x = {"ties": torch.randint(-2, 3, shape).float(), "relu": torch.relu(torch.randn(shape)),
         "signed_zeros": torch.where(torch.rand(shape) < 0.5, -0.0, 0.0), "nan": torch.randn(shape)}[kind]
    if kind == "nan":
        x[torch.rand(shape) < 0.1] = float("nan")
    ours, stock = MaxPool2d(*settings), _stock_pool(MaxPool2d(*settings))
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    layouts = []
    inner = a * 1  # the gradient the layer before the pool receives (a ReLU's backward, in the models)
    inner.register_hook(lambda g: layouts.append((g.is_contiguous(), g.stride())))
    out_ours, out_stock = ours(inner), stock(b)
    assert out_ours.is_contiguous() and out_ours.shape == out_stock.shape
    assert torch.equal(out_ours.view(torch.int32), out_stock.view(torch.int32))  # bit patterns, NaN and -0 too
    grad = torch.randn(out_stock.shape)
    out_ours.backward(grad)
    out_stock.backward(grad)
    assert torch.equal(a.grad, b.grad)
    assert layouts == [(True, x.stride())]  # contiguous, as torch's pool returns it: no mixed-layout backward
    with torch.no_grad():  # the evaluation path: a NaN stays a NaN (its sign bit may differ), all else bitwise
        fast, ref = ours(x), stock(x)
        assert fast.is_contiguous() and torch.equal(fast.isnan(), ref.isnan())
        assert torch.equal(fast.nan_to_num(7.0).view(torch.int32), ref.nan_to_num(7.0).view(torch.int32))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({torch.float64: torch.int64, torch.float32: torch.int32}[t.dtype])


@pytest.mark.parametrize("shape", [(6, 5, 9, 11), (50, 32, 24, 24)])  # odd sizes; the FedAvg CNN's first pool
@pytest.mark.parametrize("settings", [(2,), (3, 2, 1), (2, 1), (3, 2, 0, 1, False, True)])
@pytest.mark.parametrize("kind", ["ties", "signed_zeros", "nan", "float64"])
def test_training_pool_gives_both_kernels_bits_and_gradient_bits(shape, settings, kind):
    """With autograd recording, the models' MaxPool2d gives the bit patterns (NaNs and signs of zeros included)
    of the output and of the input's gradient that torch's pool gives, both on the contiguous tensor (the
    contiguous kernel) and on a channels-last copy (the channels-last kernel, which the layer's forward pass
    runs): ties, signed zeros, NaNs, gradients of -0.0, overlapping windows (a position that receives several
    gradients), padding, dilation and ceil mode."""
    from bench.core.models import MaxPool2d

    torch.manual_seed(0)
    x = {"ties": torch.randint(-2, 3, shape).float(), "signed_zeros": torch.where(torch.rand(shape) < 0.5, -0.0, 0.0),
         "nan": torch.randn(shape), "float64": torch.randint(-2, 3, shape).double()}[kind]
    if kind == "nan":
        x[torch.rand(shape) < 0.1] = float("nan")
    results = []
    for layout in ("ours", "contiguous", "channels_last"):
        leaf = x.clone().requires_grad_()
        inner = leaf * 1  # a non-leaf input, as a conv's output is
        if layout == "ours":
            out = MaxPool2d(*settings)(inner)
        else:
            memory_format = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            out = nn.MaxPool2d(*settings)(inner.contiguous(memory_format=memory_format))
        if not results:
            grad = torch.randn(out.shape, dtype=x.dtype)
            grad[grad.abs() < 0.3] = -0.0
            grad[0, 0, 0, 0] = float("nan")
        out.backward(grad)
        results.append((_bits(out.detach()), _bits(leaf.grad)))
    for ref in results[1:]:
        for ours, theirs in zip(results[0], ref, strict=True):
            assert torch.equal(ours, theirs)


def test_training_pool_copies_no_gradient_between_layouts():
    """Backward through the models' MaxPool2d is one contiguous max-pool backward: no copy of a gradient to
    channels-last and back (the forward pass copies the input to channels-last and its output and indices
    back, three copies)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from bench.core.models import MaxPool2d

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            self.seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 3, 8, 8, requires_grad=True)
    with Ops() as forward:
        out = MaxPool2d(2)(x)
    grad = torch.randn(out.shape)
    with Ops() as backward:
        out.backward(grad)
    copies = [op for op in forward.seen if op.split(".")[0] in ("clone", "copy_", "_to_copy", "contiguous")]
    assert len(copies) == 3, forward.seen
    assert [op.split(".")[0] for op in backward.seen if op != "detach.default"] == [
        "max_pool2d_with_indices_backward"], backward.seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_evaluation_pool_keeps_the_first_of_two_signed_zeros_in_any_window_order(dtype):
    """The evaluation path pools rows before columns only when the input holds no -0.0; a window whose maximum is
    a zero of either sign, in every order of its four entries, gets the kernel's sign (the first zero's): here
    -0.0 at (0, 1) before 0.0 at (1, 0), which the maximum of rows first would turn into 0.0."""
    from itertools import permutations

    from bench.core.models import MaxPool2d, _has_negative_zero

    windows = sorted(set(permutations([-1.0, -0.0, 0.0, -2.0]))) + sorted(set(permutations([-0.0, -0.0, 0.0, 0.0])))
    x = torch.tensor(windows, dtype=dtype).view(-1, 1, 2, 2)
    x = torch.cat([x, torch.full_like(x, 3.0)], dim=1)  # a second channel without zeros
    with torch.no_grad():
        fast, ref = MaxPool2d(2)(x), nn.MaxPool2d(2)(x)
    assert torch.equal(torch.signbit(fast), torch.signbit(ref)) and torch.equal(fast, ref)
    assert _has_negative_zero(x) and not _has_negative_zero(x.abs()) and not _has_negative_zero(x[:0])
    assert not _has_negative_zero(torch.tensor([float("nan"), -float("nan"), -1e-45, -float("inf")]))
    assert _has_negative_zero(torch.tensor([1, 2]))  # no floating type: the exact path


def test_every_pooling_model_trains_to_the_same_bits_as_with_torchs_max_pool():
    """Two SGD steps and an evaluation of each model with a max-pool: the same parameters and logits, bit for
    bit, as the same model with its pools replaced by torch's nn.MaxPool2d."""
    torch.set_num_threads(1)
    for name in ("small_cnn", "cnn_fmnist", "cnn_cifar100", "cnn_fedavg", "lenet64", "resnet8"):
        ours = make(name) if name != "small_cnn" else make("small_cnn", norm="bn_all")
        stock = make(name) if name != "small_cnn" else make("small_cnn", norm="bn_all")
        stock.load_state_dict(ours.state_dict())
        assert with_stock_pools(stock), name
        c, s, k = INPUTS[name]
        torch.manual_seed(1)
        x, y = torch.rand(8, c, s, s), torch.randint(0, k, (8,))
        for model in (ours, stock):
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for _ in range(2):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            model.eval()
        for p, q in zip(ours.parameters(), stock.parameters(), strict=True):
            assert torch.equal(p, q), name
        with torch.no_grad():
            assert torch.equal(ours(x), stock(x)), name


@pytest.mark.parametrize("kind", ["ties", "signed_zeros", "nan", "negative"])
@pytest.mark.parametrize("settings", [(2,), (3, 2, 1)])
def test_body_pools_before_the_relu_with_the_same_bits_and_gradients(kind, settings):
    """Body runs a ReLU followed by a MaxPool2d as pool then ReLU: values, signs of zeros, NaNs and the input's
    gradient are those of the layers in their listed order (windows of ties, of signed zeros only, with NaNs, of
    non-positive values only); a hook on either layer keeps the listed order."""
    from bench.core.models import Body, MaxPool2d

    torch.manual_seed(0)
    shape = (4, 3, 9, 10)
    x = {"ties": torch.randint(-2, 3, shape).float(), "signed_zeros": torch.where(torch.rand(shape) < 0.5, -0.0, 0.0),
         "nan": torch.randn(shape), "negative": -torch.rand(shape)}[kind]
    if kind == "nan":
        x[torch.rand(shape) < 0.1] = float("nan")
    grad = torch.randn(x.shape[0], x.shape[1], *MaxPool2d(*settings)(x[:1]).shape[2:])
    grad[grad.abs() < 0.3] = -0.0  # gradients of -0.0 too
    body, listed = Body(nn.ReLU(inplace=True), MaxPool2d(*settings)), nn.Sequential(nn.ReLU(), MaxPool2d(*settings))
    results = []
    for model in (body, listed):
        a = x.clone().requires_grad_()
        out = model(a * 1)
        out.backward(grad)
        results.append((out.detach(), a.grad))
    for ours, ref in zip(*results, strict=True):
        assert torch.equal(ours.view(torch.int32), ref.view(torch.int32))  # bit patterns, NaN and -0.0 too
    seen = []
    body[0].register_forward_hook(lambda module, args, out: seen.append(args[0].shape))
    body(x.clone())
    assert seen == [x.shape]  # the ReLU saw the pool's input: the listed order


def test_cnn_heterofl_is_the_official_conv_net():
    """HeteroFL's Conv: conv3x3 + BN + ReLU per width (max-pool between blocks), global average pool, head with
    zero bias; at a width every hidden layer has ceil(p C) channels."""
    model = make("cnn_heterofl")
    body = conv(3, 1, 64, True) + norm(64) + conv(3, 64, 128, True) + norm(128) + conv(3, 128, 256, True) + norm(256)
    assert count(model) == body + conv(3, 256, 512, True) + norm(512) + linear(512, 10)
    assert torch.all(model.head.bias == 0)
    assert [m.kernel_size for m in model.modules() if isinstance(m, nn.MaxPool2d)] == [2, 2, 2]
    small = make("cnn_heterofl", 0.375, channels=[32, 64, 128])
    assert [m.out_channels for m in small.modules() if isinstance(m, nn.Conv2d)] == [12, 24, 48]
    assert small.feature_dim == 48
    plain = make("cnn_heterofl", norm="none")
    assert not any(isinstance(m, NORM_TYPES) for m in plain.modules())
    with pytest.raises(ValueError, match="norm='gn' is invalid"):
        make("cnn_heterofl", norm="gn")
