"""Clients of different widths and method-owned modules: width slicing of the zoo's models, the scattered
weighted mean, a HeteroFL-style method at full width equal to FedAvg, a two-width method that trains,
evaluates and resumes identically, and a method with a second head and a checkpointed server module."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bench.builder import build_experiment
from bench.core import engine
from bench.core.aggregate import WeightedMean
from bench.core.flat import FlatModel
from bench.core.models import build_model
from bench.experiment.compose import to_container
from bench.experiment.run import execute, run_dir_for
from tests.helpers import config, federation, interrupted_then_resumed, records

TOY = ["imports=[tests.toy_methods]", "method=fedavg"]


def flat(name: str, width: float, **kw) -> FlatModel:
    torch.manual_seed(0)
    return FlatModel(build_model(name, num_classes=5, width=width, **kw))


@pytest.mark.parametrize(("name", "kw"), [("small_cnn", {"in_channels": 1, "image_size": 8}),
                                          ("cnn_fmnist", {"in_channels": 1, "image_size": 28}),
                                          ("resnet8", {"in_channels": 3, "image_size": 32, "norm": "gn"})])
def test_a_narrow_model_is_the_prefix_slice_of_every_full_tensor(name, kw):
    full, narrow = flat(name, 1.0, **kw), flat(name, 0.5, **kw)
    positions = narrow.positions_in(full)
    assert positions.unique().numel() == narrow.size  # no full entry is used twice
    full_state = full.module.state_dict()
    for e in narrow.entries:
        got = full.vector[positions[e.slice]].view(e.shape)
        # a prefix of a channel-major flatten is whole channels, so prefixes hold for every tensor
        want = full_state[e.name][tuple(slice(0, n) for n in e.shape)]
        assert torch.equal(got, want), e.name


def test_a_rolling_window_wraps_round_the_channels():
    full, narrow = flat("small_cnn", 1.0, in_channels=1, image_size=8), flat("small_cnn", 0.5, in_channels=1,
                                                                             image_size=8)
    conv = narrow.entry("body.0.bias")  # 16 of the 32 channels of the first conv
    full_conv = full.entry("body.0.bias")
    at = narrow.positions_in(full, roll=24)[conv.slice] - full_conv.offset
    assert at.tolist() == [24, 25, 26, 27, 28, 29, 30, 31, 0, 1, 2, 3, 4, 5, 6, 7]
    # a full turn of every layer (32, 64 and 128 channels) is the prefix again
    assert torch.equal(narrow.positions_in(full, roll=128), narrow.positions_in(full, roll=0))
    # the linear layer after the flatten takes whole channels (blocks of H*W inputs), wrapped the same way
    fc = narrow.entry("body.6.weight")
    block = full.module.flatten_blocks["body.6.weight"]
    assert block > 1 and fc.shape[1] == 32 * block  # 32 of the last conv's 64 channels
    cols = (narrow.positions_in(full, roll=48)[fc.slice] - full.entry("body.6.weight").offset).view(fc.shape)[0]
    full_columns = full.entry("body.6.weight").shape[1]
    assert ((cols % full_columns) // block).unique_consecutive().tolist() == [(48 + j) % 64 for j in range(32)]


def test_group_norm_keeps_its_group_count_at_every_width():
    for width in (0.1, 0.3, 0.5, 1.0):
        model = build_model("resnet18", num_classes=10, in_channels=3, image_size=32, norm="gn", gn_groups=2,
                            width=width)
        norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
        assert norms and all(m.num_groups == 2 and m.num_channels % 2 == 0 for m in norms), width


def test_the_scattered_mean_averages_entries_over_their_holders_and_keeps_the_rest():
    mean = WeightedMean()
    mean.add(torch.tensor([1.0, 2.0]), 1.0, index=torch.tensor([0, 1]), size=4)
    mean.add(torch.tensor([3.0]), 3.0, index=torch.tensor([0]), size=4)
    mean.add(torch.tensor([5.0]), 1.0, index=torch.tensor([2]), size=4)
    old = torch.tensor([9.0, 9.0, 9.0, 9.0])
    assert mean.result(torch.float32, fallback=old).tolist() == [(1 + 9) / 4, 2.0, 5.0, 9.0]
    with pytest.raises(ValueError, match="fallback"):
        mean.result(torch.float32)


def test_heterofl_style_training_with_every_client_at_full_width_equals_fedavg(tmp_path):
    fedavg = config(tmp_path / "a", "method=fedavg", "model.options.norm=bn")
    toy = config(tmp_path / "b", *TOY, "method.name=toy_widths", "+method.widths=[1.0]", "model.options.norm=bn")
    execute(fedavg), execute(toy)
    assert records(run_dir_for(to_container(fedavg))) == records(run_dir_for(to_container(toy)))


@pytest.mark.parametrize("rolling", ["false", "true"])
def test_a_two_width_method_trains_evaluates_and_resumes_to_identical_records(tmp_path, rolling):
    whole, resumed = interrupted_then_resumed(tmp_path, *TOY, "method.name=toy_widths", "+method.widths=[1.0,0.5]",
                                              f"+method.rolling={rolling}", "model.options.norm=bn")
    assert whole == resumed
    assert '"stage": "post"' in whole and '"stage": "pre"' in whole


def test_two_widths_train_both_slices_and_evaluate_each_client_on_its_width(tmp_path, monkeypatch):
    cfg = to_container(config(tmp_path, *TOY, "method.name=toy_widths", "+method.widths=[1.0,0.25]", "rounds=1"))
    experiment = build_experiment(cfg)
    method = experiment.method
    seen: list[tuple[int, int]] = []
    trained: dict[int, torch.Tensor] = {}
    evaluated: list[tuple[int, int, torch.Tensor]] = []  # (client, worker size, model evaluated), in order
    real_evaluate = engine.evaluate

    def evaluate(method_, worker, data, split, batch_size):
        evaluated.append((data.cid, worker.size, worker.vector.clone()))
        return real_evaluate(method_, worker, data, split, batch_size)

    def on_client(task, worker):
        seen.append((task.cid, worker.size))
        trained[task.cid] = worker.vector.clone()

    monkeypatch.setattr(engine, "evaluate", evaluate)
    method.setup(experiment.fed.worker.read())
    records = experiment.engine().round(1, on_client=on_client, evaluate=True)
    full, quarter = experiment.fed.worker.size, experiment.fed.worker_for(0.25).size
    assert quarter < full and seen == [(0, full), (1, quarter), (2, full), (3, quarter)]
    assert experiment.fed.worker_for(0.25) is experiment.fed.worker_for(0.25)  # built once, cached
    # pre: each client's trained model on its own width, right after its upload; post: each client's slice of the
    # aggregated model, again on its own width
    pre, post = evaluated[:4], evaluated[4:]
    assert [(cid, size) for cid, size, _ in pre] == seen
    assert all(torch.equal(vector, trained[cid]) for cid, _, vector in pre)
    assert [(cid, size) for cid, size, _ in post] == seen
    for cid, _, vector in post:
        assert torch.equal(vector, method.state["global"][method.positions(cid, 1)])
    stages = {(r["stage"], r["split"]): r for r in records if r["kind"] == "eval"}
    assert set(stages) == {("pre", "test"), ("post", "test")} and stages[("post", "test")]["clients"] == [0, 1, 2, 3]


def test_a_method_adds_a_head_and_checkpoints_a_server_module_with_its_optimizer(tmp_path):
    overrides = (*TOY, "method.name=toy_server")
    cfg = to_container(config(tmp_path, *overrides))
    experiment = build_experiment(cfg)
    names = [e.name for e in experiment.fed.worker.entries]
    assert "aux.weight" in names and "aux.bias" in names  # the second head is in the flat model
    whole, resumed = interrupted_then_resumed(tmp_path, *overrides)
    assert whole == resumed and '"gate_weight"' in whole
    state = experiment.method.state_dict()
    assert set(state["server"]["opt"]) == {"state", "param_groups"}  # the optimizer's own state dict


def test_a_federation_built_without_a_worker_factory_says_how_to_get_one():
    fed = federation(nn.Linear(3, 2), num_clients=2)
    assert fed.worker_for(1.0) is fed.worker  # the full worker needs no factory
    for ask in (lambda: fed.worker_for(0.5), lambda: fed.initial_model(0.5, "flanc")):
        with pytest.raises(ValueError, match="no worker factory: build it with bench.builder"):
            ask()
