"""The pFedGate cross-check's launcher (scripts/crosscheck_pfedgate.py) and its command line
(scripts/crosscheck_external.py), without a checkout of the official code: the resized official CNN is our cnn_fedavg,
the loaders serve a client's part of our export as the official ones (shuffled training batches in the same order in
every run, items (x, y, index)), the names newer NumPy / torch removed are restored as they were, and the command takes
its settings from our config and refuses a config that is not the official algorithm."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.core.models import build_model
from bench.experiment.crosscheck import load_spec
from tests.helpers import script


class _LeafCNN(nn.Module):  # the interface of the official AdaptedLeafCNN1 (LEAF's FEMNIST CNN) the launcher relies on
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv1, self.pool, self.conv2 = nn.Conv2d(1, 32, 5), nn.MaxPool2d(2, 2), nn.Conv2d(32, 64, 5)
        self.fc1, self.output = nn.Linear(64 * 4 * 4, 2048), nn.Linear(2048, num_classes)
        self.adapted_model_para = {name: None for name, _ in self.named_parameters()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv2(self.pool(F.relu(self.conv1(x))))))
        return self.output(F.relu(self.fc1(x.view(-1, 64 * 4 * 4))))


def _split(folder: Path, n_train: int = 25, n_test: int = 7) -> Path:
    for part, n in (("train", n_train), ("test", n_test)):
        (folder / part).mkdir(parents=True)
        for cid in (0, 1):
            data = {"x": np.arange(n * 784, dtype=np.float32).reshape(n, 1, 28, 28), "y": (np.arange(n) + cid) % 3}
            np.savez(folder / part / f"{cid}.npz", data=data)
    return folder


def test_resized_official_cnn_is_our_cnn_fedavg() -> None:
    net = script("crosscheck_pfedgate").resized_leaf_cnn(_LeafCNN, 512, 10)(num_classes=62)
    ours = build_model("cnn_fedavg", num_classes=10, in_channels=1, image_size=28)
    t_state, o_state = net.state_dict(), ours.state_dict()
    assert [v.shape for v in t_state.values()] == [v.shape for v in o_state.values()]
    assert list(net.adapted_model_para) == list(t_state)  # the official adapted forward looks its entries up by name
    net.load_state_dict(dict(zip(t_state, o_state.values(), strict=True)))
    x = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(net(x), ours(x))


def test_loaders_serve_the_export_as_the_official_loaders(tmp_path: Path) -> None:
    launcher = script("crosscheck_pfedgate")
    split = _split(tmp_path)
    train, val, test = launcher.exported_loaders(split, 10)
    again, _, _ = launcher.exported_loaders(split, 10)
    assert list(train) == list(test) == list(val) == ["0", "1"] and set(val.values()) == {None}
    batches = [(x, y, i) for x, y, i in train["1"]]
    assert [len(y) for _, y, _ in batches] == [10, 10, 5]  # no drop_last (the official 1-channel loaders)
    order = torch.cat([i for _, _, i in batches]).tolist()
    assert sorted(order) == list(range(25)) and order != list(range(25))  # shuffled, every sample once
    assert order == torch.cat([i for _, _, i in again["1"]]).tolist()  # generator seeded 1234: same in every run
    x, y, i = batches[0]
    data = np.load(split / "train" / "1.npz", allow_pickle=True)["data"].tolist()
    torch.testing.assert_close(x, torch.from_numpy(data["x"][i.numpy()]))  # images as exported, no normalisation
    assert y.tolist() == data["y"][i.numpy()].tolist()
    assert torch.cat([i for _, _, i in test["0"]]).tolist() == list(range(7))  # test: in order
    assert train["0"].dataset.data.shape[0] == 25  # what run_experiment.py counts


def test_removed_names_are_restored_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delitem(np.__dict__, "int", raising=False)
    monkeypatch.delitem(sys.modules, "torch._six", raising=False)
    script("crosscheck_pfedgate").restore_removed_names()
    assert np.int is int  # type: ignore[attr-defined]
    from torch._six import inf  # type: ignore[import-not-found]

    assert inf == math.inf
    monkeypatch.delitem(np.__dict__, "int")


def test_pfedgate_command_takes_settings_from_our_config_and_refuses_another_algorithm(tmp_path: Path) -> None:
    ext = script("crosscheck_external")
    spec = load_spec()
    s, block = spec["setting"], spec["methods"]["pfedgate"]
    split = _split(tmp_path)
    cmd = ext.pfedgate_command(spec, "pfedgate", "pat", "py", split, 1, Path("/o.json"))
    assert cmd[:3] == ["py", "-u", str(ext.PFEDGATE_LAUNCHER)] and cmd[cmd.index("--split") + 1] == str(split)
    assert cmd[cmd.index("--") + 1:cmd.index("--") + 3] == ["emnist", "pFedGate"]
    conf = ext.our_config(spec, "pfedgate", "pat")
    hp = conf["method"]
    assert [cmd[cmd.index(k) + 1] for k in ("--n_rounds", "--bz", "--local_steps", "--lr_model", "--seed")] == [
        str(s["rounds"] - 1), str(s["batch_size"]), str(s["epochs"]), str(s["lr"]), "1"]  # it trains n_rounds + 1
    assert [cmd[cmd.index(k) + 1] for k in ("--sparse_factor", "--fine_grained_block_split", "--lr_gating")] == [
        f"{hp['sparsity']:g}", str(hp["blocks_per_tensor"]), str(hp["gate_lr"])]
    for bad_override, match in (("train.momentum=0.0", "train.momentum"), ("method.gate_bias=4.0", "gate_bias"),
                                ("method.sparsity=null", "sparsity"), ("method.gate_pool=32", "gate_pool"),
                                ("capacity.setting=hetero", "capacity.setting"), ("model.options.norm=bn", "norm"),
                                ("participation=0.5", "participation"),
                                ("train.keep_optimizer_state=false", "train.keep_optimizer_state"),
                                ("method.gate_momentum=0.0", "gate_momentum")):
        bad = {**spec, "methods": {**spec["methods"], "pfedgate": {**block, "ours": [*block["ours"], bad_override]}}}
        with pytest.raises(SystemExit, match=match):
            ext.pfedgate_command(bad, "pfedgate", "pat", "py", split, 0, Path("/o.json"))
    for stage, match in (("post", "stage 'post'"), (None, "stage 'post'")):  # default: post
        other = {k: v for k, v in block.items() if k != "stage"} | ({"stage": stage} if stage else {})
        with pytest.raises(SystemExit, match=match):
            ext.pfedgate_command({**spec, "methods": {**spec["methods"], "pfedgate": other}}, "pfedgate", "pat", "py",
                                 split, 0, Path("/o.json"))


def test_pfedgate_curve_drops_the_initial_evaluation_and_checks_the_rounds() -> None:
    ext = script("crosscheck_external")
    assert ext.pfedgate_curve([[0, 9.5], [1, 40.0], [2, 55.25]], 2) == ([40.0, 55.25], 9.5)
    with pytest.raises(SystemExit, match="expected 0..3"):
        ext.pfedgate_curve([[0, 9.5], [1, 40.0], [2, 55.25]], 3)
