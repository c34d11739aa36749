"""HeteroFL, FjORD and FedRolex (methods/_nested.py and the three method modules): equal to FedAvg at full
width, nested averaging, the scaler, static BN, label masking, FedRolex's rolling window, FjORD's nested
sampled widths, and end-to-end runs with heterogeneous capacities that resume to identical records."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.builder import Experiment, build_experiment, method_class
from bench.core.engine import ClientRound
from bench.core.models import MODELS, NORM_TYPES, build_model
from bench.experiment.compose import to_container
from bench.experiment.run import execute, run_dir_for
from common.seeding import generator
from methods._nested import Scaler, recollect_bn
from methods.fjord import nested_views
from methods.heterofl import HeteroFL, HeteroFLHyper, mask_absent
from tests.helpers import config, records

GRID = ["capacity.setting=grid", "capacity.low=0.0625"]  # 4 clients: r = 0.0625, 0.375, 0.6875, 1
#: the options that change full-width training or evaluation, switched off (see the test below)
PLAIN = {"heterofl": ["method.static_bn=none", "method.label_mask=false"],
         "fedrolex": ["method.static_bn=none"],
         "fjord": ["method.static_bn=none"]}


def experiment(tmp_path: Path, *overrides: str) -> Experiment:
    exp = build_experiment(to_container(config(tmp_path, *overrides)))
    exp.method.setup(exp.fed.worker.read())
    return exp


def task(exp: Experiment, cid: int, round_: int = 1) -> ClientRound:
    return ClientRound(cid, round_, exp.data.client(cid), generator(0, "test", cid), exp.method.client_model(cid), 0.1)


@pytest.fixture(scope="module")
def fedavg_records(tmp_path_factory) -> str:
    cfg = config(tmp_path_factory.mktemp("fedavg"), "method=fedavg", "model.options.norm=bn")
    execute(cfg)
    return records(run_dir_for(to_container(cfg)))


@pytest.mark.parametrize("name", ["heterofl", "fedrolex", "fjord"])
def test_with_every_client_at_full_width_each_method_equals_fedavg(tmp_path, fedavg_records, name):
    # The scaler divides by p = 1 (exact), FedRolex's window and FjORD's sampling have nothing to choose at full
    # width, so only two options must be off: static BN (sbn recollects BatchNorm statistics before evaluation
    # instead of averaging the tracked ones) and HeteroFL's label masking (it changes the local loss and which
    # head rows each client's upload averages into).
    cfg = config(tmp_path, f"method={name}", "model.options.norm=bn", *PLAIN[name])
    execute(cfg)
    assert records(run_dir_for(to_container(cfg))) == fedavg_records
    if name == "heterofl":  # and those options do change the records
        masked = config(tmp_path / "masked", "method=heterofl", "model.options.norm=bn", "method.static_bn=none")
        execute(masked)
        assert records(run_dir_for(to_container(masked))) != fedavg_records


def test_a_narrow_upload_averages_its_entries_and_every_other_entry_keeps_its_value(tmp_path):
    exp = experiment(tmp_path, "method=heterofl", *GRID, "method.label_mask=false")
    method, old = exp.method, exp.method.state["global"].clone()
    assert method.widths == [0.25, 0.5, 0.5, 1.0]
    method.begin_round(1, [0])
    worker = method.client_worker(0, "train")
    worker.load(method.client_model(0) + 1.0)
    method.upload(task(exp, 0), worker)
    method.aggregate(1, [0])
    held = torch.zeros(exp.fed.size, dtype=torch.bool)
    held[method.positions(0.25, 1)] = True
    new = method.state["global"]
    assert 0 < int(held.sum()) < exp.fed.size
    assert torch.allclose(new[held], old[held] + 1.0)
    assert torch.equal(new[~held], old[~held])


def test_the_scaler_divides_each_normalised_layer_output_by_p_in_training_and_is_the_identity_at_eval(tmp_path):
    exp = experiment(tmp_path, "method=heterofl", *GRID, "model.options.norm=bn")
    worker = exp.fed.worker_for(0.5)
    layers = [m for m in worker.module.body.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    convs, fc = layers[:-1], layers[-1]
    assert len(convs) == 2 and all(isinstance(m.scaler, Scaler) and m.scaler.width == 0.5 for m in convs)
    assert not hasattr(fc, "scaler")  # no norm after the hidden FC (norm=bn), so nothing would absorb it
    assert not hasattr(worker.module.head, "scaler")  # the head's logits are not scaled
    torch.manual_seed(0)
    conv, x = convs[0], torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        raw_conv = conv._conv_forward(x, conv.weight, conv.bias)
        worker.module.train()
        assert torch.allclose(conv(x), raw_conv / 0.5)
        worker.module.eval()
        assert torch.equal(conv(x), raw_conv)
    assert [e.name for e in worker.entries] == [e.name for e in exp.fed.worker.entries]  # layout unchanged


def default_input(model: str) -> tuple[int, int, int]:
    """The input shape the zoo's ``model`` is built for by default (channels, height, width)."""
    options = inspect.signature(MODELS.get(model)).parameters
    size = int(options["image_size"].default)
    return int(options["in_channels"].default), size, size


def zoo(model: str, width: float = 1.0) -> nn.Module:
    channels, size, _ = default_input(model)
    return build_model(model, num_classes=10, in_channels=channels, image_size=size, width=width)


def norm_free_models() -> list[str]:
    """The zoo's models that have no normalisation layer with their default options."""
    return [name for name in MODELS.names() if not any(isinstance(m, NORM_TYPES) for m in zoo(name).modules())]


def test_the_zoo_has_norm_free_models_for_the_next_test():
    assert {"cnn_fmnist", "cnn_cifar100", "small_cnn"} <= set(norm_free_models())


@pytest.mark.parametrize("name", ["heterofl", "fedrolex", "fjord"])  # every method on methods/_nested.py
def test_on_norm_free_models_the_model_trained_is_the_model_evaluated_at_every_width(tmp_path, name):
    # Regression: a scaler with no norm after it divides by p in training only, so a width-1/4 cnn_fmnist predicted
    # other classes in training than at evaluation for every input. Dropout-free, norm-free models must give the
    # same logits in both modes.
    cls, hp = method_class(to_container(config(tmp_path, f"method={name}")))
    for model in norm_free_models():
        for width in (0.0625, 0.25, 0.5, 1.0):
            torch.manual_seed(0)
            module = cls.extend_model(zoo(model, width), hp, width)
            x = torch.randn(16, *default_input(model))
            with torch.no_grad():
                trained, evaluated = module.train()(x), module.eval()(x)
            assert torch.allclose(trained, evaluated), (model, width)


def test_static_bn_tracks_nothing_in_training_and_sbn_recollects_the_mean_of_batch_statistics(tmp_path):
    exp = experiment(tmp_path, "method=heterofl", *GRID, "model.options.norm=bn")
    worker = exp.fed.worker_for(0.5)
    bn = next(m for m in worker.module.modules() if isinstance(m, nn.BatchNorm2d))
    seen: list[torch.Tensor] = []
    bn.register_forward_hook(lambda m, inputs, out: seen.append(inputs[0].detach()))
    batches = list(exp.data.client(1).batches("train", 16, shuffle=False, augment=False))
    before = worker.read()
    worker.module.train()
    with torch.no_grad():
        worker.module(batches[0][0])
    assert torch.equal(worker.vector, before)  # training updates no statistic
    recollect_bn(worker, exp.data.client(0).batches("train", 16, shuffle=False, augment=False))
    seen.clear()
    recollect_bn(worker, batches)  # starts afresh, not from the first pass's statistics
    want = torch.stack([s.mean((0, 2, 3)) for s in seen]).mean(0)  # cumulative average of the batch means
    assert len(seen) == len(batches) > 1 and torch.allclose(bn.running_mean, want, atol=1e-6)
    assert not bn.track_running_stats and bn.momentum == 0.1  # restored
    hp = HeteroFLHyper(width_rule="levels", width_step=None, scaler=True, static_bn="batch", label_mask=True)
    plain = HeteroFL.extend_model(build_model("small_cnn", num_classes=4, in_channels=1, image_size=8, norm="bn"),
                                  hp, 1.0)
    assert not [n for n, _ in plain.named_buffers()]  # "batch": no statistics at all (batch statistics at eval)


@pytest.mark.parametrize("method", [["method=heterofl"], ["method=fedrolex", "method.label_mask=true"]])
def test_label_masking_masks_exactly_the_absent_labels_and_their_head_rows_keep_their_values(tmp_path, method):
    exp = experiment(tmp_path, *method, *GRID)
    method, cid = exp.method, 1
    data = exp.data.client(cid)
    present = set(data.pool.labels[data.train].tolist())
    owned = method.owned_labels(data)
    assert {c for c in range(owned.numel()) if owned[c]} == present and 0 < len(present) < owned.numel()
    logits = torch.randn(5, owned.numel())
    masked = mask_absent(logits, owned)
    assert torch.equal(masked[:, owned], logits[:, owned]) and torch.all(masked[:, ~owned] == 0)
    old = method.state["global"].clone()
    method.begin_round(1, [cid])
    worker = method.client_worker(cid, "train")
    worker.load(method.client_model(cid) + 1.0)
    method.upload(task(exp, cid), worker)
    method.aggregate(1, [cid])
    held, new = method._mean.held(), method.state["global"]
    expected = torch.zeros(exp.fed.size, dtype=torch.bool)
    expected[method.positions(method.widths[cid], 1)] = True
    for name in ("head.weight", "head.bias"):
        e = exp.fed.worker.entry(name)
        rows = held[e.slice].view(e.shape[0], -1)
        assert rows[owned].any(1).all() and not rows[~owned].any()  # only owned labels' rows were averaged
        expected[e.slice].view(e.shape[0], -1)[~owned] = False
    assert torch.equal(held, expected)
    assert torch.allclose(new[held], old[held] + 1.0) and torch.equal(new[~held], old[~held])


def test_fedrolex_windows_roll_by_one_channel_per_round_and_wrap_round(tmp_path):
    exp = experiment(tmp_path, "method=fedrolex", *GRID)
    method, full = exp.method, exp.fed.worker
    assert method.widths == [0.25, 0.5625, 0.8125, 1.0]  # multiples of 1/16 with p^2 <= r
    narrow = exp.fed.worker_for(0.5625)
    conv, full_conv = narrow.entry("body.0.bias"), full.entry("body.0.bias")  # 18 of the first conv's 32 channels
    for round_ in (30, 31, 32):
        at = method.positions(0.5625, round_)[conv.slice] - full_conv.offset
        assert at.tolist() == [(round_ + j) % 32 for j in range(18)]
    method.begin_round(30, [1])
    assert torch.equal(method.client_model(1), method.state["global"][method.positions(0.5625, 30)])
    for width in method.widths:  # the head's classes are never pruned
        assert exp.fed.worker_for(width).entry("head.weight").shape[0] == full.entry("head.weight").shape[0]
    assert method.positions(1.0, 30) is None  # full width: every entry, whatever the round


def test_fedrolex_backward_window_rolls_the_other_way_as_the_official_server_does(tmp_path):
    exp = experiment(tmp_path, "method=fedrolex", *GRID, "method.window=backward")
    method, full = exp.method, exp.fed.worker
    conv, full_conv = exp.fed.worker_for(0.5625).entry("body.0.bias"), full.entry("body.0.bias")
    for round_ in (30, 31, 32):  # torch.roll(arange(C), t)[:k]: channels (j - t) mod C
        at = method.positions(0.5625, round_)[conv.slice] - full_conv.offset
        assert at.tolist() == torch.roll(torch.arange(32), round_)[:18].tolist() == [(j - round_) % 32
                                                                                    for j in range(18)]


def test_fedrolex_update_counts_weights_plain_mean_for_matrices_and_update_counts_counted_up_in_the_round(tmp_path):
    exp = experiment(tmp_path, "method=fedrolex", *GRID, "method.weights=update_counts")
    method, full, old = exp.method, exp.fed.worker, exp.method.state["global"].clone()
    method.begin_round(1, [0, 3])
    for cid, shift in ((0, 1.0), (3, 3.0)):  # width 1/4, then full width
        worker = method.client_worker(cid, "train")
        worker.load(method.client_model(cid) + shift)
        method.upload(task(exp, cid), worker)
    method.aggregate(1, [0, 3])
    both = torch.zeros(exp.fed.size, dtype=torch.bool)
    both[method.positions(0.25, 1)] = True
    counted = full.mask(lambda e: len(e.shape) <= 1 or e.name == "head.weight")
    matrices = ~counted
    assert bool((both & counted).any()) and bool((both & matrices).any())
    delta = method.state["global"] - old
    # matrices: (1 + 3) / 2; counted entries: weights 1 (its count) and 1 + 1 (counted up by the first upload)
    assert torch.allclose(delta[both & matrices], torch.tensor(2.0))
    assert torch.allclose(delta[both & counted], torch.tensor((1 * 1.0 + 2 * 3.0) / 3))
    assert torch.allclose(delta[~both], torch.tensor(3.0))
    assert torch.equal(method.state["updates"], torch.where(both, 3.0, 2.0).double())
    with pytest.raises(ValueError, match="method.weights='nk'"):
        experiment(tmp_path / "bad", "method=fedrolex", "method.weights=nk")


def test_fjord_samples_nested_widths_never_wider_than_the_client(tmp_path):
    exp = experiment(tmp_path, "method=fjord", *GRID, "method.width_rule=multiple", "method.width_step=0.0625")
    method, full = exp.method, exp.fed.worker
    assert method.widths == [0.25, 0.5625, 0.8125, 1.0]
    assert method.allowed[0.8125] == [0.25, 0.5, 0.8125]  # levels below p_i, and p_i itself
    draw = generator(0, "fjord-test")
    for cid, width in enumerate(method.widths):
        drawn = {method.sample_width(cid, draw) for _ in range(200)}
        assert drawn == set(method.allowed[width]) and max(drawn) <= width
        sets = [set(exp.fed.worker_for(w).positions_in(full).tolist()) for w in method.allowed[width]]
        assert all(a < b for a, b in zip(sets, sets[1:], strict=False))  # each narrower one inside the wider
    wide, narrow = exp.fed.worker_for(0.8125), exp.fed.worker_for(0.25)
    wide.load(method.client_model(2))
    inside = narrow.positions_in(wide)
    views = nested_views(wide, narrow)
    for e in narrow.entries:  # the sampled submodel's tensors are exactly its entries of the client's model
        assert torch.equal(views[e.name].reshape(-1), wide.vector[inside[e.slice]])
    x, y = next(exp.data.client(2).batches("train", 8, shuffle=False, augment=False))
    wide.module.zero_grad()
    F.cross_entropy(method.forward_at(wide, 0.25, x), y).backward()
    grad = torch.zeros(wide.size)
    for p, where in wide.param_views():
        grad[where] = p.grad.reshape(-1)
    outside = torch.ones(wide.size, dtype=torch.bool)
    outside[inside] = False
    assert grad[~outside].abs().sum() > 0 and torch.all(grad[outside] == 0)  # only the submodel is trained


@pytest.mark.parametrize(("name", "widths"), [("heterofl", [0.25, 0.5, 0.5, 1.0]),
                                              ("fedrolex", [0.25, 0.5625, 0.8125, 1.0]),
                                              ("fjord", [0.25, 0.5, 0.5, 1.0])])
def test_each_method_records_the_widths_its_clients_train(tmp_path, name, widths):
    """(Resume to identical records: test_method_contract.)"""
    summary = execute(config(tmp_path / "run", f"method={name}", *GRID, "model.options.norm=bn", "rounds=1"))
    assert summary["capacity"]["width"] == widths
    assert {r["stage"] for r in summary["results"]} == {"pre", "post"}
