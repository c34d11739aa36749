"""FedSelect (workshop and CVPR), its baselines (LG-FedAvg, LotteryFL, Ditto, FedBABU, FedAlt) and the
torchvision-cache pretrained weights, on tiny hand-checkable cases plus end-to-end runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

import methods
from bench import builder
from bench.core.data import FederatedData
from bench.core.engine import ClientRound, Federation, hyperparameters
from bench.core.flat import FlatModel
from bench.core.models import build_model
from bench.core.pretrained import load_pretrained_source, resolve_pretrained, torch_home
from bench.experiment.run import to_container
from datasets.augment import build_transform
from datasets.sources import load_source
from methods._masked import select_top, top_count
from methods.fedselect_cvpr import grow, is_growth_round
from methods.lgfedavg import local_layers_mask
from tests.helpers import SETUP, config

TRAIN = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "epochs": 1, "batch_size": 4}
SELECT = dict(maskable="weights", ranking="per_tensor", alt_epochs=1, alt_schedule="interleaved", weighting="uniform",
              bn_stats="local", unsampled="shared")
DEFAULTS = {
    "fedselect": {**SELECT, "p": 0.5, "ltn_iters": 3, "ltn_epochs": 1, "fraction": "compounding",
                  "ltn_return": "start"},
    "fedselect_cvpr": {**SELECT, "grow_every": 3, "grow_rate": 0.25, "target": 0.8},
    "lotteryfl": dict(acc_threshold=0.5, prune_step=0.2, prune_target=0.5, rewind=True, prune_split="val",
                      maskable="dense", ranking="per_tensor"),
    "ditto": dict(lam=2.0, personal_epochs=None),
    "fedbabu": dict(finetune_epochs=0, finetune_part="all"),
    "fedalt": dict(alt_epochs=2, alt_schedule="interleaved"),
    "lgfedavg": dict(global_layers=1),
}


def tiny_data(num_clients: int = 1, n: int = 16) -> FederatedData:
    src = load_source("synthetic", "train", num_train=n * num_clients, num_classes=4)
    splits = tuple({"train": torch.arange(c * n, (c + 1) * n), "val": torch.arange(0), "test": torch.arange(4)}
                   for c in range(num_clients))
    return FederatedData(src.images, src.labels, splits, src.classes, build_transform(None), build_transform(None),
                         None, src.labels)  # type: ignore[arg-type]


def federation(module: nn.Module, num_clients: int, sizes: list[float] | None = None, train: dict | None = None,
               data: FederatedData | None = None) -> Federation:
    sizes_t = torch.tensor(sizes or [1.0] * num_clients, dtype=torch.float64)
    return Federation(num_clients, sizes_t, FlatModel(module), train or TRAIN, torch.device("cpu"), 0, data)


def method(name: str, fed: Federation, init: torch.Tensor | None = None, **hp):
    cls = methods.load(name)
    m = cls(fed, hyperparameters(cls, {**DEFAULTS[name], **hp}))
    m.setup(fed.worker.read() if init is None else init)
    return m


def task(cid: int, start: torch.Tensor, round_: int = 1, data: FederatedData | None = None) -> ClientRound:
    client = data.client(cid) if data is not None else None
    return ClientRound(cid, round_, client, torch.Generator().manual_seed(cid), start, 0.1)  # type: ignore[arg-type]


def upload(m, vectors: dict[int, torch.Tensor], masks: dict[int, torch.Tensor] | None = None, round_: int = 1) -> None:
    """Simulate a round in which client c trained to vectors[c] (with personal/kept mask masks[c])."""
    m.begin_round(round_, sorted(vectors))
    for cid, vec in sorted(vectors.items()):
        if masks is not None:
            m.state["masks"][cid] = masks[cid]
        start = m.client_model(cid).clone()
        m.fed.worker.load(vec)
        m.upload(task(cid, start, round_), m.fed.worker)
    m.aggregate(round_, sorted(vectors))


class Spy:
    """Stands in for ``masked_sgd``: records (mask, model at the call, epochs), then moves every masked
    entry by ``speed`` (so the change a GradLTN iteration makes is known)."""

    def __init__(self, speed: torch.Tensor | float = 1.0) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor, int | None]] = []
        self.speed = speed

    def __call__(self, task, model, mask, epochs=None) -> float:
        self.calls.append((mask.clone(), model.read(), epochs))
        model.vector.add_(mask.float() * self.speed)
        return 0.0


def two_linears() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))  # weights 16 and 8 entries, biases 4 and 2


def per_tensor_counts(fed: Federation, mask: torch.Tensor) -> dict[str, int]:
    return {e.name: int(mask[e.slice].sum()) for e in fed.worker.entries}


# ------------------------------------------------------------------------------------------ selection
def test_top_count_and_select_top_per_group_with_stable_ties():
    assert [top_count(0.5, n) for n in (16, 8, 3, 1, 0)] == [8, 4, 2, 1, 0]  # halves round up
    assert [top_count(0.25, n) for n in (64, 16, 4, 1)] == [16, 4, 1, 0]
    score = torch.tensor([0.1, 0.9, 0.5, 0.5, 0.3, 0.2, 0.8, 0.7])
    groups = [torch.arange(0, 4), torch.arange(4, 8)]
    everything = torch.ones(8, dtype=torch.bool)
    assert select_top(score, everything, groups, 0.5).int().tolist() == [0, 1, 1, 0, 0, 0, 1, 1]  # tie: lower first
    fewer = torch.tensor([True, False, True, True, True, True, True, True])
    assert select_top(score, fewer, groups, 0.5).int().tolist() == [0, 0, 1, 1, 0, 0, 1, 1]  # 2 of 3, 2 of 4
    assert select_top(score, fewer, groups, 0.5, of_remaining=False).int().tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert select_top(score, everything, [torch.arange(8)], 0.25).int().tolist() == [0, 1, 0, 0, 0, 0, 1, 0]


# ------------------------------------------------------------------------------------------- GradLTN
@pytest.mark.parametrize("ltn_return", ["start", "last"])
def test_gradltn_mask_sizes_compound_and_every_iteration_rewinds_to_the_rounds_start(ltn_return):
    fed = federation(two_linears(), 1)
    m = method("fedselect", fed, p=0.5, ltn_iters=3, ltn_return=ltn_return)
    speed = torch.rand(fed.size, generator=torch.Generator().manual_seed(1)) + 0.1  # distinct changes
    m.masked_sgd = spy = Spy(speed)
    theta_0 = fed.worker.read()
    mask = m.grad_ltn(task(0, theta_0), fed.worker)
    sizes = [per_tensor_counts(fed, c[0]) for c in spy.calls] + [per_tensor_counts(fed, mask)]
    names = ["0.weight", "0.bias", "1.weight", "1.bias"]
    # i = 0 trains everything; then each iteration keeps p of the remaining weights (p^i), biases never masked
    expected = [[16, 4, 8, 2], [8, 0, 4, 0], [4, 0, 2, 0], [2, 0, 1, 0]]
    assert [[s[n] for n in names] for s in sizes[:3]] == expected[:3]
    assert [sizes[-1][n] for n in names] == expected[3]
    assert len(spy.calls) == (3 if ltn_return == "start" else 4)  # iteration L only trains for theta_L
    for _, at_call, epochs in spy.calls:
        assert torch.equal(at_call, theta_0) and epochs == 1  # rewind: every iteration starts from theta_0
    for (earlier, _, _), later in zip(spy.calls[1:], [c[0] for c in spy.calls[2:]] + [mask], strict=True):
        assert not (later & ~earlier).any()  # nested
    for e in fed.worker.entries:  # m_L = the fastest-changing weights of each tensor
        if e.name.endswith("weight"):
            k = int(mask[e.slice].sum())
            assert set(mask[e.slice].nonzero().flatten().tolist()) == set(speed[e.slice].topk(k).indices.tolist())
    after = fed.worker.read()
    if ltn_return == "start":
        assert torch.equal(after, theta_0)  # u and v are theta_0's values
    else:
        torch.testing.assert_close(after, theta_0 + speed * mask)  # theta_L


def test_gradltn_fixed_fraction_and_global_ranking_readings():
    fed = federation(two_linears(), 1)
    speed = torch.rand(fed.size, generator=torch.Generator().manual_seed(2)) + 0.1
    fixed = method("fedselect", fed, p=0.5, ltn_iters=3, fraction="fixed")
    fixed.masked_sgd = Spy(speed)
    mask = fixed.grad_ltn(task(0, fed.worker.read()), fed.worker)
    assert per_tensor_counts(fed, mask) == {"0.weight": 8, "0.bias": 0, "1.weight": 4, "1.bias": 0}  # p of each
    flat = method("fedselect", fed, p=0.5, ltn_iters=3, ranking="global", maskable="all")
    flat.masked_sgd = Spy(speed)
    mask = flat.grad_ltn(task(0, fed.worker.read()), fed.worker)
    params = fed.worker.param_mask
    assert int(mask.sum()) == 4  # 30 -> 15 -> 8 -> 4 over all parameters together
    assert set(mask.nonzero().flatten().tolist()) == set(speed.masked_fill(~params, -1).topk(4).indices.tolist())


def test_fedselect_client_runs_localalt_from_theta_0_on_the_found_split():
    fed = federation(two_linears(), 1)
    m = method("fedselect", fed, p=0.5, ltn_iters=2, alt_epochs=2)
    m.masked_sgd = spy = Spy(torch.rand(fed.size, generator=torch.Generator().manual_seed(3)) + 0.1)
    theta_0 = fed.worker.read()
    m.train_client(task(0, theta_0), fed.worker)
    ltn, alt = spy.calls[:2], spy.calls[2:]
    personal = m.state["masks"][0]
    assert per_tensor_counts(fed, personal) == {"0.weight": 4, "0.bias": 0, "1.weight": 2, "1.bias": 0}
    assert torch.equal(alt[0][1], theta_0)  # LocalAlt starts from theta_0
    params = fed.worker.param_mask
    assert [c[0].tolist() for c in alt] == [(personal & params).tolist(), (params & ~personal).tolist()] * 2
    assert len(ltn) == 2


# -------------------------------------------------------------------------------- masked step, LocalAlt
@pytest.mark.parametrize("optimizer", [dict(momentum=0.9, weight_decay=0.1), dict(momentum=0.9, nesterov=True,
                                                                                   weight_decay=0.05)])
def test_masked_step_freezes_entries_outside_the_mask_under_momentum_and_weight_decay(optimizer):
    data = tiny_data()
    train = {**TRAIN, **optimizer, "epochs": 2}
    fed = federation(build_model("small_cnn", num_classes=4, in_channels=1, image_size=8), 1, train=train, data=data)
    m = method("fedselect", fed)
    start = fed.worker.read()
    mask = torch.rand(fed.size, generator=torch.Generator().manual_seed(0)) < 0.3
    m.masked_sgd(task(0, start, data=data), fed.worker, mask)
    after = fed.worker.read()
    assert torch.equal(after[~mask], start[~mask])  # bit for bit, weight decay and momentum included
    assert (after[mask] != start[mask]).float().mean() > 0.9
    # the whole mask is the ordinary optimizer: weight decay moved into the gradient changes nothing
    fed.worker.load(start)
    m.masked_sgd(task(0, start, data=data), fed.worker, torch.ones_like(mask))
    masked_all = fed.worker.read()
    fed.worker.load(start)
    m.local_sgd(task(0, start, data=data), fed.worker)
    torch.testing.assert_close(masked_all, fed.worker.read())
    assert all(p.requires_grad for p in fed.worker.parameters())


@pytest.mark.parametrize("schedule,expected", [("interleaved", ["v", "u"] * 3), ("blocked", ["v", "u"])])
def test_localalt_alternates_full_passes_over_personal_then_shared_entries(schedule, expected):
    module = build_model("small_cnn", num_classes=4, in_channels=1, image_size=8, norm="bn")
    fed = federation(module, 1)
    m = method("fedselect", fed)
    m.masked_sgd = spy = Spy()
    personal = torch.rand(fed.size, generator=torch.Generator().manual_seed(0)) < 0.2
    m.local_alt(task(0, fed.worker.read()), fed.worker, personal, 3, schedule)
    params = fed.worker.param_mask
    v, u = personal & params, ~personal & params
    assert [("v" if torch.equal(c[0], v) else "u" if torch.equal(c[0], u) else "?") for c in spy.calls] == expected
    assert [c[2] for c in spy.calls] == ([1] * 6 if schedule == "interleaved" else [3, 3])
    assert not any(c[0][~params].any() for c in spy.calls)  # BN statistics are trained by neither pass


# -------------------------------------------------------------------------------- server (FedSelect)
def linear_bn() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))  # 0.weight 4, 0.bias 2, 1.weight 2, 1.bias 2, stats 4


def positions(fed: Federation, name: str, *at: int) -> torch.Tensor:
    mask = torch.zeros(fed.size, dtype=torch.bool)
    mask[[fed.worker.entry(name).offset + i for i in at]] = True
    return mask


@pytest.mark.parametrize("name", ["fedselect", "fedselect_cvpr"])
def test_masked_server_average_personal_entries_stay_shared_entries_are_their_clients_mean(name):
    fed = federation(linear_bn(), 3, sizes=[1.0, 2.0, 5.0])
    init = fed.worker.read()
    m = method(name, fed, init)
    w = lambda *at: positions(fed, "0.weight", *at)  # noqa: E731
    masks = {0: w(0) | w(2), 1: w(0), 2: w(0) | w(1)}  # entry 0 personal everywhere, 1 at client 2, 2 at client 0
    vecs = {c: torch.full((fed.size,), float(10 * (c + 1))) for c in range(3)}  # 10, 20, 30
    upload(m, vecs, masks)
    got = {c: m.client_model(c) for c in range(3)}
    off = fed.worker.entry("0.weight").offset
    assert [float(got[c][off]) for c in range(3)] == [10.0, 20.0, 30.0]  # personal on every client: kept
    assert float(m.state["global"][off]) == float(init[off])  # ... and the global model keeps its old value
    assert [float(got[c][off + 1]) for c in range(3)] == [15.0, 15.0, 30.0]  # shared by 0, 1: their mean
    assert [float(got[c][off + 2]) for c in range(3)] == [10.0, 25.0, 25.0]  # shared by 1, 2
    everyone = fed.worker.mask(lambda e: e.kind == "param") & ~(w(0) | w(1) | w(2))
    assert all(torch.equal(got[c][everyone], torch.full_like(got[c][everyone], 20.0)) for c in range(3))
    stats = ~fed.worker.param_mask
    assert all(torch.equal(got[c][stats], vecs[c][stats]) for c in range(3))  # BN statistics local


def test_masked_average_weighting_bn_stats_and_clients_outside_the_round():
    fed = federation(linear_bn(), 3, sizes=[1.0, 3.0, 1.0])
    stats, params = ~fed.worker.param_mask, fed.worker.param_mask
    m = method("fedselect", fed, weighting="samples", bn_stats="shared")
    vecs = {0: torch.zeros(fed.size), 1: torch.full((fed.size,), 4.0)}
    none = torch.zeros(fed.size, dtype=torch.bool)
    upload(m, vecs, {0: none, 1: none})
    assert torch.equal(m.client_model(0), torch.full((fed.size,), 3.0))  # (1 * 0 + 3 * 4) / 4, statistics too
    own = positions(fed, "0.weight", 0, 1)
    for unsampled in ("shared", "written", "none"):
        m = method("fedselect", fed, unsampled=unsampled)
        m.state["masks"][2] = own  # client 2's personal mask from an earlier round
        m.state["models"][2] = torch.full((fed.size,), -1.0)
        upload(m, vecs, {0: positions(fed, "0.bias", 0), 1: none})  # client 2 is not in this round
        took = m.client_model(2) != -1.0
        if unsampled == "shared":  # theta_G on its own shared parameters
            assert torch.equal(took, params & ~own)
        elif unsampled == "written":  # Alg. 2 as written: theta_G on m_G, the OR of the participants' masks
            assert torch.equal(took, positions(fed, "0.bias", 0))
        else:
            assert not took.any()
        assert not took[stats].any()  # never its BN statistics


# ------------------------------------------------------------------------------------- FedSelect-CVPR
def test_cvpr_growth_rounds_and_mask_only_grows_until_the_target():
    assert [t for t in range(1, 12) if is_growth_round(t, 3)] == [4, 7, 10]  # code: 0-based 3, 6, 9
    assert [t for t in range(1, 5) if is_growth_round(t, 1)] == [2, 3, 4]
    score = torch.rand(100, generator=torch.Generator().manual_seed(0))
    mask, sizes = torch.zeros(100, dtype=torch.bool), []
    for _ in range(8):
        new = grow(mask, score, [torch.arange(100)], 0.25, 0.8)
        assert not (mask & ~new).any()  # only grows
        added = new & ~mask
        if added.any():  # the added entries are the highest scores among the previously shared ones
            assert float(score[added].min()) >= float(score[~new].max())
        mask = new
        sizes.append(int(mask.sum()))
    assert sizes == [25, 44, 58, 69, 77, 83, 83, 83]  # 25% of the shared each time; stops once above 80%


def test_cvpr_masks_start_empty_grow_after_training_and_average_with_the_rounds_mask():
    fed = federation(two_linears(), 2)
    m = method("fedselect_cvpr", fed, grow_every=2, grow_rate=0.5, target=0.8)
    speed = torch.rand(fed.size, generator=torch.Generator().manual_seed(4)) + 0.1
    params = fed.worker.param_mask
    init = fed.worker.read()
    trained: dict[int, torch.Tensor] = {}

    def fake_alt(t, model, personal, *args) -> float:
        model.vector.add_(speed * params * (t.cid + 1))
        trained[t.cid] = model.read()
        return 0.0

    m.local_alt = fake_alt
    for round_ in (1, 2, 3):
        m.begin_round(round_, [0, 1])
        for cid in (0, 1):
            start = m.client_model(cid).clone()
            fed.worker.load(start)
            m.train_client(task(cid, start, round_), fed.worker)
            m.upload(task(cid, start, round_), fed.worker)
        m.aggregate(round_, [0, 1])
        # every round so far was averaged with empty masks: both clients hold the same parameters
        torch.testing.assert_close(m.client_model(0)[params], m.client_model(1)[params])
        if round_ < 3:  # no growth before round 1 + grow_every = 3
            assert not m.state["masks"].any() and torch.equal(m.state["anchor"][0], init)
    counts = per_tensor_counts(fed, m.state["masks"][0])
    assert counts == {"0.weight": 8, "0.bias": 0, "1.weight": 4, "1.bias": 0}  # half of each weight tensor
    for cid in (0, 1):
        assert torch.equal(m.state["anchor"][cid], trained[cid])  # theta at this growth, before the broadcast
        delta = (trained[cid] - init).abs()
        for e in fed.worker.entries:
            if e.name.endswith("weight"):
                top = delta[e.slice].topk(counts[e.name]).indices
                assert set(m.state["masks"][cid][e.slice].nonzero().flatten().tolist()) == set(top.tolist())


# ------------------------------------------------------------------------------------------- LotteryFL
def test_lotteryfl_prunes_on_accuracy_until_the_target_and_rewinds_to_init():
    torch.manual_seed(0)
    fed = federation(nn.Linear(10, 1), 1)
    weight = fed.worker.entry("weight")
    init = fed.worker.read()
    init[weight.slice] = torch.tensor([0.5, -1.0, 0.1, 0.9, -0.3, 0.7, -0.2, 0.05, 0.6, -0.8])
    m = method("lotteryfl", fed, init)
    accuracies = iter([0.4, 0.6, 0.5, 0.6, 0.6, 0.9, 0.9])
    m.accuracy = lambda t, model: next(accuracies)
    m.masked_sgd = Spy(0.0)  # no training: the global model stays the initial one
    pruned = []
    for round_ in range(1, 8):
        upload_start = m.client_model(0)
        fed.worker.load(upload_start)
        m.begin_round(round_, [0])
        m.train_client(task(0, upload_start, round_), fed.worker)
        m.upload(task(0, upload_start, round_), fed.worker)
        m.aggregate(round_, [0])
        pruned.append(round(float(m.state["pruned"][0]), 6))
    # acc 0.4 and 0.5 (not above 0.5) do not prune; 10 -> 8 -> 6 -> 5 kept weights, then r = 0.5 >= target
    assert pruned == [0.0, 0.2, 0.2, 0.4, 0.5, 0.5, 0.5]
    kept = m.state["masks"][0][weight.slice]
    assert kept.int().tolist() == [0, 1, 0, 1, 0, 1, 0, 0, 1, 1]  # the 5 largest |w| of the initial model
    assert torch.equal(m.state["masks"][0][~fed.worker.mask(lambda e: e.name == "weight")], torch.ones(1).bool())
    ticket = m.client_model(0)
    assert torch.equal(ticket[weight.slice][~kept], torch.zeros(5))  # pruned entries are zero


@pytest.mark.parametrize("rewind", [True, False])
def test_lotteryfl_prune_rewinds_the_ticket_to_the_initial_model(rewind):
    torch.manual_seed(0)
    fed = federation(nn.Linear(10, 1), 1)
    init = fed.worker.read()
    m = method("lotteryfl", fed, rewind=rewind)
    accuracies = iter([0.1, 0.9])  # round 1: no prune (the global model moves); round 2: prune
    m.accuracy = lambda t, model: next(accuracies)
    m.masked_sgd = spy = Spy(1.0)
    for round_ in (1, 2):
        start = m.client_model(0).clone()
        fed.worker.load(start)
        m.begin_round(round_, [0])
        m.train_client(task(0, start, round_), fed.worker)
        m.upload(task(0, start, round_), fed.worker)
        m.aggregate(round_, [0])
    mask = m.state["masks"][0]
    assert int((~mask).sum()) == 2  # 20% of the 10 weights
    assert torch.equal(spy.calls[0][1], init)
    assert torch.equal(spy.calls[1][1], torch.where(mask, init if rewind else init + 1.0, 0.0))
    assert torch.equal(spy.calls[1][0], mask)  # trained on its ticket only: pruned entries stay 0


def test_lotteryfl_rewind_and_per_entry_average_over_the_clients_keeping_it():
    fed = federation(nn.Linear(2, 1), 2, sizes=[1.0, 3.0])
    m = method("lotteryfl", fed)
    keep0 = torch.tensor([True, False, True])  # weight[1] pruned by client 0
    upload(m, {0: torch.tensor([1.0, 0.0, 1.0]), 1: torch.tensor([5.0, 5.0, 5.0])},
           {0: keep0, 1: torch.ones(3, dtype=torch.bool)})
    assert m.state["global"].tolist() == [4.0, 5.0, 4.0]  # (1 + 3 * 5) / 4; weight[1]: only client 1
    assert m.client_model(0).tolist() == [4.0, 0.0, 4.0]


# ----------------------------------------------------------------------------------------------- Ditto
def test_ditto_proximal_gradient_and_personal_model_evaluated():
    fed = federation(nn.Linear(2, 1), 1)
    m = method("ditto", fed, lam=2.0)
    v, w = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, -1.0, 3.0])
    fed.worker.load(v)
    for p in fed.worker.parameters():
        p.grad = torch.ones_like(p)
    m._anchor = w
    m.before_step(task(0, w), fed.worker)
    grads = torch.cat([p.grad.flatten() for p in fed.worker.parameters()])
    torch.testing.assert_close(grads, 1.0 + 2.0 * (v - w))  # dF + lambda (v - w)
    m._anchor = None
    m.before_step(task(0, w), fed.worker)  # the global model's training has no proximal term
    torch.testing.assert_close(torch.cat([p.grad.flatten() for p in fed.worker.parameters()]), 1.0 + 2.0 * (v - w))


def test_ditto_trains_personal_towards_the_round_start_then_global_and_averages_only_global():
    fed = federation(nn.Linear(2, 1), 1)
    m = method("ditto", fed, personal_epochs=3)
    w = m.state["global"].clone()
    m.state["personal"][0] = torch.tensor([7.0, 8.0, 9.0])
    calls = []

    def fake_sgd(t, model, epochs=None, **_):
        calls.append((model.read(), None if m._anchor is None else m._anchor.clone(), epochs))
        model.vector.add_(1.0)
        return 0.0

    m.local_sgd = fake_sgd
    m.begin_round(1, [0])
    fed.worker.load(m.client_model(0))
    m.train_client(task(0, m.client_model(0)), fed.worker)
    assert torch.equal(calls[0][0], torch.tensor([7.0, 8.0, 9.0])) and torch.equal(calls[0][1], w)
    assert calls[0][2] == 3 and calls[1][1] is None and calls[1][2] is None and torch.equal(calls[1][0], w)
    m.upload(task(0, w), fed.worker)
    m.aggregate(1, [0])
    assert torch.equal(m.state["global"], w + 1) and torch.equal(m.state["personal"][0], torch.tensor([8.0, 9.0, 10.0]))
    for stage in ("pre", "post"):
        assert torch.equal(m.eval_model(0, stage, fed.worker, 1, 0.1), m.state["personal"][0])


# --------------------------------------------------------------------------------------------- FedBABU
def test_fedbabu_head_never_moves_during_federation_and_post_fine_tunes(tmp_path):
    cfg = to_container(config(tmp_path, "method=fedbabu", "method.finetune_epochs=1"))
    exp = builder.build_experiment(cfg)
    init = exp.fed.worker.read()
    exp.method.setup(init)
    engine = exp.engine()
    for round_ in (1, 2):
        engine.round(round_, evaluate=False)
    head = exp.fed.worker.mask(lambda e: e.name.startswith("head."))
    final = exp.method.state["global"]
    assert torch.equal(final[head], init[head]) and not torch.equal(final[~head], init[~head])
    tuned = exp.method.eval_model(0, "post", exp.fed.worker, 2, 0.1).clone()
    assert not torch.equal(tuned[head], init[head])  # fine-tuning (all parameters) personalizes the head
    assert torch.equal(exp.method.state["global"], final)


# ------------------------------------------------------------------------------------- LG-FedAvg, FedAlt
def test_lgfedavg_split_point_and_aggregation():
    module = build_model("small_cnn", num_classes=3, in_channels=1, image_size=8)
    fed = federation(module, 2)
    names = lambda mask: sorted({e.name for e in fed.worker.entries if mask[e.slice].all()})  # noqa: E731
    assert names(local_layers_mask(fed.worker, 1)) == sorted(e.name for e in fed.worker.entries
                                                             if e.name.startswith("body."))
    assert names(local_layers_mask(fed.worker, 2)) == ["body.0.bias", "body.0.weight", "body.2.bias", "body.2.weight"]
    assert not local_layers_mask(fed.worker, 4).any()
    with pytest.raises(ValueError, match="global_layers=5"):
        local_layers_mask(fed.worker, 5)
    m = method("lgfedavg", fed, global_layers=2)
    local = local_layers_mask(fed.worker, 2)
    a, b = torch.randn(fed.size), torch.randn(fed.size)
    upload(m, {0: a, 1: b})
    for cid, own in ((0, a), (1, b)):
        assert torch.equal(m.client_model(cid)[local], own[local])
        torch.testing.assert_close(m.client_model(cid)[~local], ((a + b) / 2)[~local])


def test_fedalt_alternates_head_and_body_and_keeps_the_head_local():
    module = build_model("small_cnn", num_classes=3, in_channels=1, image_size=8)
    fed = federation(module, 2)
    m = method("fedalt", fed, alt_epochs=2)
    m.masked_sgd = spy = Spy(0.0)
    m.train_client(task(0, fed.worker.read()), fed.worker)
    head = fed.worker.mask(lambda e: e.name.startswith("head."))
    assert [torch.equal(c[0], head) for c in spy.calls] == [True, False, True, False]
    assert all(torch.equal(c[0], ~head) for c in spy.calls[1::2])
    a, b = torch.randn(fed.size), torch.randn(fed.size)
    upload(m, {0: a, 1: b})
    assert torch.equal(m.client_model(1)[head], b[head])
    torch.testing.assert_close(m.client_model(1)[~head], ((a + b) / 2)[~head])


# ------------------------------------------------------------- checkpointed state (end to end: test_method_contract)
@pytest.mark.parametrize("name", ["fedselect", "fedselect_cvpr", "lotteryfl", "ditto"])
def test_state_round_trips_through_a_checkpoint(tmp_path, name):
    """Round 3 after restoring round 2's saved state equals round 3 of an uninterrupted run, records and state."""
    import io

    cfg = to_container(config(tmp_path, f"method={name}", *SETUP.get(name, ())))

    def experiment():
        exp = builder.build_experiment(cfg)
        exp.method.setup(exp.fed.worker.read())
        return exp

    straight = experiment()
    records = [straight.engine().round(t) for t in (1, 2, 3)]
    first = experiment()
    for t in (1, 2):
        first.engine().round(t, evaluate=False)
    buffer = io.BytesIO()
    torch.save(first.method.state_dict(), buffer)
    resumed = experiment()
    resumed.method.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    assert resumed.engine().round(3) == records[2]
    want, got = straight.method.state_dict(), resumed.method.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


# ----------------------------------------------------------------------------------- pretrained weights
def fake_torchvision_cache(home: Path) -> nn.Module:
    torch.manual_seed(0)
    reference = torchvision.models.resnet18(weights=None)
    with torch.no_grad():
        for mod in reference.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
    folder = home / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    torch.save(reference.state_dict(), folder / "resnet18-f37072fd.pth")
    return reference


def test_pretrained_torchvision_loads_from_torch_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    reference = fake_torchvision_cache(tmp_path / "th")
    assert resolve_pretrained("torchvision") == tmp_path / "th" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    assert resolve_pretrained("torchvision:resnet18") == resolve_pretrained("torchvision")
    assert resolve_pretrained(tmp_path / "x.pth") == tmp_path / "x.pth"  # anything else is a path
    ours = build_model("resnet18", num_classes=10, in_channels=3, image_size=32)
    load_pretrained_source(ours, "torchvision")
    reference.fc = nn.Identity()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(ours.eval().features(x), reference.eval()(x))


def test_pretrained_torch_home_defaults_and_missing_file_message(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert torch_home() == tmp_path / "xdg" / "torch"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert torch_home() == tmp_path / "home" / ".cache" / "torch"
    with pytest.raises(FileNotFoundError) as info:
        resolve_pretrained("torchvision")
    message = str(info.value)
    where = tmp_path / "home" / ".cache" / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    assert str(where) in message and "IMAGENET1K_V1" in message and "download.pytorch.org" in message
    with pytest.raises(ValueError, match="no torchvision checkpoint"):
        resolve_pretrained("torchvision:resnet8")


@pytest.mark.skipif(not hasattr(builder, "load_pretrained_source"),
                    reason="bench/builder.py does not route model.pretrained through bench.core.pretrained yet")
def test_pretrained_torchvision_through_the_builder(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    reference = fake_torchvision_cache(tmp_path / "th")
    cfg = to_container(config(tmp_path, "model=resnet18", "model.pretrained=torchvision"))
    worker = builder.build_worker(cfg, 10, 3, 32, torch.device("cpu"))
    own = worker.module.state_dict()
    assert all(torch.equal(own["body." + k], v) for k, v in reference.state_dict().items() if not k.startswith("fc."))


def test_mask_iou_pairs_and_the_recorded_final_layer_iou():
    from methods.fedselect import final_linear_weight, mask_iou

    masks = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    iou = mask_iou(masks)
    assert iou[0, 1] == pytest.approx(1 / 3) and iou[1, 0] == pytest.approx(1 / 3)  # |{0}| / |{0, 1, 2}|
    assert iou[0, 0] == 1.0 and iou[0, 2] == 0.0 and iou[2, 3] == 1.0  # two empty masks: identical
    fed = federation(two_linears(), 2)
    last = final_linear_weight(fed.worker)
    assert torch.equal(last, positions(fed, "1.weight", *range(8)))
    m = method("fedselect", fed)
    own = {0: positions(fed, "1.weight", 0, 1), 1: positions(fed, "1.weight", 1, 2) | positions(fed, "0.weight", 3)}
    upload(m, {0: fed.worker.read(), 1: fed.worker.read()}, own)
    record = m.metrics(1)
    assert record["head_mask_clients"] == [0, 1]
    assert record["head_mask_iou"] == [[1.0, 1 / 3], [1 / 3, 1.0]]  # 0.weight's entry is outside the final layer
