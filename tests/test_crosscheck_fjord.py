"""The FjORD cross-check's launcher (scripts/crosscheck_fjord.py) and its command line (scripts/crosscheck_external.py),
without a checkout of Flower's baseline: the network it builds from ordered-dropout layers is our cnn_fedavg at every
width, each client's loaders hold its part of our export with the same batch order whenever built, and the command
takes widths and settings from our config and refuses a config that is not the baseline's algorithm."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.core.models import build_model
from bench.experiment.crosscheck import load_spec
from tests.helpers import script


class _ODConv(nn.Conv2d):  # ordered dropout as the baseline's layers expose it: forward(x, p) keeps a prefix
    def __init__(self, *args: Any, is_od: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.is_od = is_od

    def forward(self, x: torch.Tensor, p: float | None = None) -> torch.Tensor:  # type: ignore[override]
        out = math.ceil(self.out_channels * p) if p else self.out_channels
        return self._conv_forward(x, self.weight[:out, :x.size(1)], self.bias[:out])


class _ODLinear(nn.Linear):
    def __init__(self, *args: Any, is_od: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.is_od = is_od

    def forward(self, x: torch.Tensor, p: float | None = None) -> torch.Tensor:  # type: ignore[override]
        assert self.is_od or p is None
        out = math.ceil(self.out_features * p) if p else self.out_features
        return F.linear(x, self.weight[:out, :x.size(1)], self.bias[:out])


FAKE_OD = SimpleNamespace(create_conv_layer=lambda od, is_od, *a, **k: _ODConv(*a, is_od=is_od, **k),
                          create_linear_layer=lambda od, is_od, *a, **k: _ODLinear(*a, is_od=is_od, **k))


class _Sampler:  # the baseline's samplers hand one p to every OD layer of a forward pass
    def __init__(self, p: float | None) -> None:
        self.p = p

    def __call__(self) -> float | None:
        return self.p


def test_launcher_model_is_our_cnn_fedavg_and_its_ordered_dropout_submodels_our_narrow_workers() -> None:
    net = script("crosscheck_fjord").od_fedavg_cnn(FAKE_OD, SimpleNamespace(BaseSampler=lambda m: _Sampler(None)))
    ours = build_model("cnn_fedavg", num_classes=10, in_channels=1, image_size=28)
    t_state, o_state = net.state_dict(), ours.state_dict()
    assert [v.shape for v in t_state.values()] == [v.shape for v in o_state.values()]
    assert not net.fc.is_od and all(m.is_od for m in (net.conv1, net.conv2, net.fc1))  # classifier keeps 10 outputs
    net.load_state_dict(dict(zip(t_state, o_state.values(), strict=True)))
    x = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(net(x), ours(x))
    for p in (0.25, 0.5):
        narrow = build_model("cnn_fedavg", num_classes=10, in_channels=1, image_size=28, width=p)
        narrow.load_state_dict({k: v[tuple(slice(0, n) for n in narrow.state_dict()[k].shape)]
                                for k, v in ours.state_dict().items()})
        torch.testing.assert_close(net(x, sampler=_Sampler(p)), narrow(x))


def test_launcher_loaders_hold_the_clients_samples_in_the_same_batch_order_whenever_built(tmp_path: Path) -> None:
    launcher = script("crosscheck_fjord")
    for part, n in (("train", 30), ("test", 7)):
        (tmp_path / part).mkdir()
        data = {"x": np.arange(n * 4, dtype=np.float32).reshape(n, 1, 2, 2), "y": np.arange(n) % 3}
        np.savez(tmp_path / part / "0.npz", data=data)
    (train, test), (again, _) = launcher.client_loaders(tmp_path, 0, 10, 5), launcher.client_loaders(tmp_path, 0, 10, 5)
    first = [y.tolist() for _, y in train]
    assert first == [y.tolist() for _, y in again]  # the baseline builds its clients (and loaders) every round
    assert sorted(sum(first, [])) == sorted((np.arange(30) % 3).tolist())
    assert sum(first, []) != (np.arange(30) % 3).tolist()  # shuffled
    assert [len(y) for _, y in test] == [7]
    assert launcher.pooled([0.5, 1.0], [100, 300]) == 87.5
    with pytest.raises(SystemExit, match=r"\[0.3\].*--p-s"):
        launcher.check_widths([0.25, 0.3], [0.25, 0.5])


def test_fjord_command_takes_widths_and_settings_from_our_config_and_refuses_another_algorithm() -> None:
    ext = script("crosscheck_external")
    spec = load_spec()
    s = spec["setting"]
    cmd = ext.fjord_command(spec, "fjord", "pat", "py", Path("/d"), 1, Path("/o.json"))
    assert cmd[:3] == ["py", "-u", str(ext.FJORD_LAUNCHER)] and cmd[cmd.index("--split") + 1] == "/d"
    widths = [float(w) for w in cmd[cmd.index("--widths") + 1:cmd.index("--p-s")]]
    assert widths == ext.client_widths(ext.our_config(spec, "fjord", "pat"))
    assert len(widths) == s["num_clients"] and max(widths) == 1.0
    assert [float(p) for p in cmd[cmd.index("--p-s") + 1:cmd.index("--rounds")]] == sorted(set(widths))
    assert [cmd[cmd.index(k) + 1] for k in ("--rounds", "--lr", "--batch-size", "--epochs", "--seed")] == [
        str(s["rounds"]), str(s["lr"]), str(s["batch_size"]), str(s["epochs"]), "1"]
    assert "--no-distill" not in cmd
    fjord = spec["methods"]["fjord"]
    for extra, match in (("method.distill_weight=0.5", "distill_weight"), ("method.temperature=2", "temperature"),
                         ("model.options.norm=bn", "cnn_fedavg")):
        bad = {**spec, "methods": {**spec["methods"], "fjord": {**fjord, "ours": [*fjord["ours"], extra]}}}
        with pytest.raises(SystemExit, match=match):
            ext.fjord_command(bad, "fjord", "pat", "py", Path("/d"), 0, Path("/o.json"))
    off = {**spec, "methods": {**spec["methods"], "fjord": {**fjord, "ours": [*fjord["ours"], "method.distill=false"]}}}
    assert "--no-distill" in ext.fjord_command(off, "fjord", "pat", "py", Path("/d"), 0, Path("/o.json"))
