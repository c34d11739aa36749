"""scripts.pa3dfl.efficiency: FLOPs against an analytic count, width scaling, the memory measurement, FLANC's factored
form, the paper's numbers, the CLI's files and its refusals."""

from __future__ import annotations

import csv
import json
from fractions import Fraction

import pytest
import torch
from torch import nn

from methods._decomposed import Decomposed
from scripts.pa3dfl import efficiency as eff

CPU = torch.device("cpu")
SHAPE = eff.InputShape(num_classes=10, in_channels=3, image_size=32)
TRAIN = {"optimizer": "sgd", "lr": 0.05, "momentum": 0.0, "weight_decay": 0.0, "grad_clip": None}


def conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def resnet18_forward_flops(batch: int, image: int = 32, cin: int = 3, classes: int = 10,
                           widths: tuple[int, ...] = (64, 128, 256, 512)) -> tuple[int, int]:
    """(forward FLOPs, FLOPs of the first conv) of the torchvision-layout ResNet-18 from its layer shapes: a conv
    costs 2 Cin Cout k^2 Hout Wout per image, a linear layer 2 in out (a multiply-add = 2 FLOPs)."""
    h = conv_out(image, 7, 2, 3)
    first = 2 * cin * widths[0] * 7 * 7 * h * h * batch
    flops = first
    h = conv_out(h, 3, 2, 1)  # max pool
    c = widths[0]
    for stage, w in enumerate(widths):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            out = conv_out(h, 3, stride, 1)
            flops += 2 * c * w * 9 * out * out * batch + 2 * w * w * 9 * out * out * batch
            if stride != 1 or c != w:
                flops += 2 * c * w * out * out * batch  # 1x1 downsample
            c, h = w, out
    return flops + 2 * widths[-1] * classes * batch, first


@pytest.fixture(scope="module")
def fedavg_cfg():
    return eff.method_config("fedavg")


def test_resnet18_flops_match_the_analytic_count(fedavg_cfg):
    """Forward: the conv and linear layers' count; training step (what the tables report): forward + weight
    gradients (= forward) + input gradients (= forward, but the image needs none)."""
    (client,) = eff.client_models("fedavg", fedavg_cfg, [Fraction(1)], SHAPE, CPU)
    assert client.width == 1.0 and eff.parameter_count(client.module) == 11_181_642
    module = client.module.to("meta")
    x, y = torch.empty(128, 3, 32, 32, device="meta"), torch.zeros(128, dtype=torch.long, device="meta")
    forward, first = resnet18_forward_flops(128)
    measured_forward = eff.count_flops(module, x)
    measured_step = eff.count_flops(module, x, y)
    print(f"analytic forward {forward / 1e9:.3f} GFLOPs, measured {measured_forward / 1e9:.3f}; analytic step "
          f"{(3 * forward - first) / 1e9:.3f}, measured {measured_step / 1e9:.3f}")
    assert measured_forward == pytest.approx(forward, rel=0.05)
    assert measured_step == pytest.approx(3 * forward - first, rel=0.05)


def test_a_narrower_width_costs_fewer_flops_and_a_smaller_model_about_quadratically():
    opts = eff.Options(batch_sizes=(4,), size_ratios=(Fraction(1, 4), Fraction(1)))
    rows = {r["size_ratio"]: r for r in eff.measure_method("heterofl", opts)}
    half, full = rows["1/4"], rows["1"]
    assert half["width"] == 0.5 and full["width"] == 1.0
    flops = half["gflops_train_step"] / full["gflops_train_step"]
    size = half["model_size_mb"] / full["model_size_mb"]
    assert 0.25 * 0.9 < flops < 0.25 * 1.3  # p^2 plus the terms linear in p (the image's conv, the head)
    assert 0.25 * 0.9 < size < 0.25 * 1.1
    assert full["model_size_mb"] == pytest.approx(11_181_642 * 4 / 1e6)


def test_peak_memory_is_positive_and_grows_with_the_batch_size(fedavg_cfg):
    module = eff.plain_model(fedavg_cfg, 0.25, SHAPE, CPU)
    kw = {"train": TRAIN, "in_channels": 3, "image_size": 32, "num_classes": 10, "device": CPU}
    peaks = [eff.measure(module, b, **kw) for b in (2, 8, 32)]
    param_mb = eff.model_bytes(module) / 1e6
    for m in peaks:
        assert m.peak_memory_mb > m.start_memory_mb + param_mb  # the gradients and activations come on top
    assert peaks[0].peak_memory_mb < peaks[1].peak_memory_mb < peaks[2].peak_memory_mb


def test_peak_memory_of_a_linear_layer_is_parameters_gradients_batch_and_activations():
    layer = nn.Linear(256, 256)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    x, y = torch.randn(4, 256), torch.randint(256, (4,))
    peak, start = eff.peak_memory(layer, opt, x, y)
    params = (256 * 256 + 256) * 4
    assert start == params + x.nbytes + y.nbytes
    assert start + params <= peak <= start + params + 64 * 1024  # + gradients + a few small [4, 256] tensors


@pytest.mark.parametrize("layer", [nn.Conv2d(6, 8, 3, padding=1, stride=2), nn.Linear(10, 6)])
def test_flanc_factored_form_is_the_same_function(layer):
    torch.manual_seed(0)
    dec = Decomposed(layer, 3, 4)  # 6 or 10 inputs in groups of 4: the last group is padded
    x = torch.randn(2, 6, 7, 7) if isinstance(layer, nn.Conv2d) else torch.randn(2, 10)
    torch.testing.assert_close(eff.FactoredDecomposed(dec)(x), dec(x), rtol=1e-5, atol=1e-5)


def test_flanc_model_runs_factored_and_is_restored():
    cfg = eff.method_config("flanc")
    (client,) = eff.client_models("flanc", cfg, [Fraction(1, 256)], SHAPE, CPU)
    module, x = client.module, torch.randn(2, 3, 32, 32)
    layers = [m for m in module.modules() if isinstance(m, Decomposed)]
    composed = module(x)
    with eff.factored_flanc(module) as factored:
        assert not any(isinstance(m, Decomposed) and not isinstance(p, eff.FactoredDecomposed)
                       for p in factored.modules() for m in p.children())
        torch.testing.assert_close(factored(x), composed, rtol=1e-4, atol=1e-4)
    assert [m for m in module.modules() if isinstance(m, Decomposed)] == layers


def test_every_paper_method_has_a_row_of_ours_and_the_paper_values_are_found():
    paper = eff.load_paper()
    assert {m for m, *_ in paper} <= {p for p in eff.PAPER_ROW.values() if p}
    row = eff.base_row("fedavg", "", 128, Fraction(1))
    assert eff.paper_value(paper, row, "flops") == 188.0
    assert eff.paper_value(paper, row, "model_size_mb") == 30.4
    pw = eff.base_row("heterofl", "", 128, Fraction(1, 4))
    assert eff.paper_value(paper, pw, "flops") == 59.1  # Table 2 (Table 8 prints 59.0)
    assert eff.paper_value(paper, eff.base_row("flanc", "", 512, Fraction(1, 64)), "peak_memory_mb") == 84.0
    assert eff.paper_value(paper, eff.base_row("pfedhn", "", 128, Fraction(1)), "flops") is None


def test_cli_writes_markdown_csv_and_json_with_the_paper_columns(tmp_path):
    threads = torch.get_num_threads()
    try:
        code = eff.main(["--out", str(tmp_path), "--methods", "heterofl", "pa3dfl", "--batch-sizes", "2", "128",
                         "--size-ratios", "1/256", "--quiet"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    md = (tmp_path / "efficiency.md").read_text()
    assert "r=1/256 ours | r=1/256 paper" in md and "## Table 2 layout (batch size 128)" in md
    assert "## Table 8 layout" in md and "FlopCounterMode" in md and "**torch**" in md
    assert "### Peak memory per extra sample (MB per sample, between B=2 and B=128)" in md
    assert "| heterofl | p-width |" in md and "| 3.5 |" in md  # the paper's p-width FLOPs at r=1/256
    assert "| pa3dfl | Pa3dFL | 0.229 | 3.6 |" in md and "not built" not in md  # ours, then the paper's
    with open(tmp_path / "efficiency.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {"paper_flops", "paper_peak_memory_mb", "paper_model_size_mb"} <= set(rows[0])
    assert [(r["row"], r["batch_size"], r["status"]) for r in rows] == [
        ("heterofl", "2", "measured"), ("heterofl", "128", "measured"), ("pa3dfl", "2", "measured"),
        ("pa3dfl", "128", "measured"), ("pa3dfl (recover)", "2", "measured"), ("pa3dfl (recover)", "128", "measured")]
    pa3dfl, recover = rows[3], rows[5]
    assert float(pa3dfl["gflops_train_step"]) <= float(recover["gflops_train_step"])  # the same map, fewer products
    assert recover["model_size_mb"] == pa3dfl["model_size_mb"]
    assert float(pa3dfl["gflops_train_step"]) > float(rows[1]["gflops_train_step"])  # U at full rank on top
    assert float(pa3dfl["server_mb"]) > 100 * float(pa3dfl["model_size_mb"])  # the hypernetwork's decoders
    assert float(rows[1]["paper_flops"]) == 3.5 and float(rows[1]["gflops_train_step"]) > 0
    data = json.loads((tmp_path / "efficiency.json").read_text())
    assert {"device", "torch", "threads", "model", "input", "flops", "memory"} <= set(data["header"])
    assert len(data["rows"]) == 6 and not list(tmp_path.glob(".*.tmp"))
    assert data["result"]["title"].startswith("Pa3dFL Tables 2 and 8") and data["layout"]["batch_sizes"] == [2, 128]
    written = {name: (tmp_path / name).read_bytes() for name in ("efficiency.md", "efficiency.csv", "efficiency.json")}
    for name in ("efficiency.md", "efficiency.csv"):
        (tmp_path / name).write_text("old")
    assert eff.main(["--out", str(tmp_path), "--rerender"]) == 0  # from the JSON alone, measuring nothing
    assert {name: (tmp_path / name).read_bytes() for name in written} == written
    assert eff.main(["--out", str(tmp_path / "none"), "--rerender"]) == 2


@pytest.mark.parametrize("args, bad", [
    (["--methods", "fedavg", "fedavgx"], "'fedavgx'"),
    (["--batch-sizes", "16", "0"], "batch size 0"),
    (["--batch-sizes", "abc"], "'abc'"),
    (["--batch-sizes", "-4"], "batch size -4"),
    (["--size-ratios", "2"], "'2'"),
])
def test_a_bad_method_or_batch_size_is_refused_naming_it(tmp_path, capsys, args, bad):
    with pytest.raises(SystemExit) as exit_:
        eff.main(["--out", str(tmp_path), *args])
    assert exit_.value.code == 2
    assert bad in capsys.readouterr().err
    assert not (tmp_path / "efficiency.md").exists()
    with pytest.raises(ValueError, match="fedavgx"):
        eff.check_options(["fedavgx"], [16])
    with pytest.raises(ValueError, match="batch size 0"):
        eff.check_options(["fedavg"], [0])


@pytest.mark.parametrize("groups", [1, 4])
def test_a_convolution_training_step_costs_three_forward_passes_grouped_or_not(groups):
    """Forward, input gradient and weight gradient cost the same (torch's own formula counts the weight gradient of
    a grouped convolution ``groups`` times: scripts.pa3dfl.efficiency corrects it)."""
    conv = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1, groups=groups, bias=False), nn.Flatten())
    x = torch.randn(2, 16, 5, 5, requires_grad=True)
    forward = eff.count_flops(conv, x)
    assert forward == 2 * 2 * 5 * 5 * 32 * (16 // groups) * 9
    assert eff.count_flops(conv, x, torch.randint(10, (2,))) == 3 * forward
