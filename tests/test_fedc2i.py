"""FedC2I and its baselines FedRoD and FedProto on tiny hand-checkable cases, plus end-to-end runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import methods
from bench.core.data import FederatedData
from bench.core.engine import ClientRound, hyperparameters
from bench.core.models import SplitModel, build_model
from bench.experiment.run import execute
from methods.fedc2i import class_losses, influence, leave_one_out
from methods.fedproto import average_prototypes, nearest_prototype_logits, proto_penalty
from methods.fedrod import balanced_softmax_loss
from tests.helpers import config, federation, method

C2I = {"gamma": 1.0, "extractor": "influence", "classifier": "class", "class_features": "own", "batch_size": None}
PROTO = {"lam": 1.0, "penalty": "squared_l2", "weighting": "count", "prototypes": "training", "prediction": "head"}




def task(cid: int, start: torch.Tensor, data=None) -> ClientRound:
    return ClientRound(cid, 1, data, torch.Generator().manual_seed(cid), start, 0.1)  # type: ignore[arg-type]


def tiny_split(features: int = 3, classes: int = 2) -> SplitModel:
    """body = Linear(2, features) + ReLU, head = Linear(features, classes)."""
    torch.manual_seed(0)
    return SplitModel(nn.Sequential(nn.Linear(2, features), nn.ReLU()), features, classes)


def tiny_data(num_train: int = 16, classes: int = 4) -> FederatedData:
    from datasets.augment import build_transform
    from datasets.sources import load_source

    src = load_source("synthetic", "train", num_train=num_train, num_classes=classes)
    split = {"train": torch.arange(num_train), "val": torch.arange(0), "test": torch.arange(4)}
    return FederatedData(src.images, src.labels, (split,), src.classes, build_transform(None),
                         build_transform(None), None, src.labels)  # type: ignore[arg-type]


def method_records(tmp_path: Path) -> list[dict]:
    (rounds,) = tmp_path.rglob("rounds.jsonl")
    return [r for r in map(json.loads, rounds.read_text().splitlines()) if r["kind"] == "method"]


# ------------------------------------------------------------------------------------------ FedC2I
def test_influence_is_normalised_powers_of_the_losses_and_stable():
    losses = torch.tensor([1.0, 2.0, 4.0])
    torch.testing.assert_close(influence(losses, 1.0), torch.tensor([1, 2, 4], dtype=torch.float64) / 7)
    torch.testing.assert_close(influence(losses, 2.0), torch.tensor([1, 4, 16], dtype=torch.float64) / 21)
    assert influence(losses, 0.0).tolist() == [1 / 3] * 3  # gamma = 0: uniform weights (Eq. 5)
    assert influence(torch.tensor([0.0, 3.0]), 0.0).tolist() == [0.5, 0.5]  # even with a zero loss
    big = influence(torch.tensor([1.0, 2.0, 2.0]), 2000.0)  # 2^2000 overflows: log space does not
    assert big.tolist() == [0.0, 0.5, 0.5]
    matrix = influence(torch.tensor([[1.0, 3.0], [3.0, 1.0]]), 1.0)  # Eq. 9: normalised over clients per class
    assert matrix.tolist() == [[0.25, 0.75], [0.75, 0.25]]


def test_leave_one_out_averages_every_other_client():
    rows = torch.tensor([[1.0, 10.0], [2.0, 20.0], [6.0, 60.0]])
    assert leave_one_out(rows).tolist() == [[4.0, 40.0], [3.5, 35.0], [1.5, 15.0]]  # Eq. 4 / 7


def test_class_losses_replace_exactly_one_row():
    torch.manual_seed(0)
    features, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0])
    own, loo = torch.randn(3, 3), torch.randn(2, 3, 3)  # C = 3 rows of F' = 3, M = 2 leave-one-out sets
    got = class_losses(features, y, own, loo)
    for i in range(2):
        for c in range(3):
            rows = own.clone()
            rows[c] = loo[i, c]  # only row c changes
            assert got[i, c].item() == pytest.approx(F.cross_entropy(features @ rows.T, y).item(), rel=1e-6)
    same = class_losses(features, y, own, own.expand(2, 3, 3))
    torch.testing.assert_close(same, F.cross_entropy(features @ own.T, y).expand(2, 3))


def c2i_case(**hp):
    """Three clients of a tiny split model with distinct uploads, and one batch."""
    fed = federation(tiny_split(), 3, sizes=[1.0, 1.0, 2.0])
    m = method("fedc2i", fed, **{**C2I, **hp})
    torch.manual_seed(1)
    m.state["models"] = torch.randn(3, fed.size)
    x, y = torch.randn(6, 2), torch.tensor([0, 1, 1, 0, 1, 0])
    return fed, m, x, y


def test_client_influence_is_the_loss_of_the_leave_one_out_extractor_with_own_head():
    fed, m, x, y = c2i_case(gamma=3.0)
    models, body = m.state["models"], ~fed.worker.mask(lambda e: e.name.startswith("head."))
    personal, lam, _ = m.personalize(1, fed.worker, x, y)
    losses = []
    for i in range(3):
        vector = models[1].clone()
        vector[body] = (models.sum(0) - models[i])[body] / 2  # Eq. 4 with client 1's classifier
        fed.worker.load(vector)
        losses.append(F.cross_entropy(fed.worker.module(x), y).item())
    expected = torch.tensor(losses, dtype=torch.float64) ** 3
    torch.testing.assert_close(lam, expected / expected.sum())  # Eq. 5
    torch.testing.assert_close(personal[body], (lam.float() @ models[:, body]))  # Eq. 6


def test_corrected_eq10_moves_the_classifier_row_by_row():
    fed, m, x, y = c2i_case()
    models = m.state["models"]
    personal, lam, lam_class = m.personalize(0, fed.worker, x, y)
    assert lam_class.shape == (3, 2)
    torch.testing.assert_close(lam_class.sum(0), torch.ones(2, dtype=torch.float64))
    w, b = fed.worker.entry("head.weight").slice, fed.worker.entry("head.bias").slice
    weights, biases = models[:, w].view(3, 2, 3), models[:, b]
    for c in range(2):  # phi_bar_{0,c} = sum_i Lambda^{i,c} phi_{i,c}: the others' rows, not phi_{0,c} again
        torch.testing.assert_close(personal[w].view(2, 3)[c], (lam_class[:, c, None].float() * weights[:, c]).sum(0))
        torch.testing.assert_close(personal[b][c], (lam_class[:, c].float() * biases[:, c]).sum())
    assert not torch.allclose(personal[w], models[0, w])  # the literal Eq. 10 would return phi_0 unchanged
    # Lambda (Eq. 7-9, gamma = 1): row c of client 0's classifier replaced by the others' mean row, on theta_0
    fed.worker.load(models[0])
    z = fed.worker.module.features(x)
    losses = torch.zeros(3, 2, dtype=torch.float64)
    for i in range(3):
        others = [j for j in range(3) if j != i]
        for c in range(2):
            w_ic, b_ic = weights[0].clone(), biases[0].clone()
            w_ic[c], b_ic[c] = weights[others, c].mean(0), biases[others, c].mean()
            losses[i, c] = F.cross_entropy(z @ w_ic.T + b_ic, y).item()
    torch.testing.assert_close(lam_class, losses / losses.sum(0), rtol=1e-5, atol=1e-7)


def test_identical_models_and_gamma_zero_give_uniform_weights():
    fed, m, x, y = c2i_case(gamma=0.0)
    _, lam, lam_class = m.personalize(2, fed.worker, x, y)
    assert lam.tolist() == [1 / 3] * 3 and (lam_class == 1 / 3).all()
    fed, m, x, y = c2i_case(gamma=5.0)
    m.state["models"][:] = m.state["models"][0]  # round 1: every client holds the initial model
    personal, lam, lam_class = m.personalize(2, fed.worker, x, y)
    torch.testing.assert_close(lam, torch.full((3,), 1 / 3, dtype=torch.float64))
    torch.testing.assert_close(lam_class, torch.full((3, 2), 1 / 3, dtype=torch.float64))
    torch.testing.assert_close(personal, m.state["models"][0])
    alone = method("fedc2i", federation(tiny_split(), 1), **C2I)  # one client: nobody to leave out
    personal, lam, lam_class = alone.personalize(0, alone.fed.worker, x, y)
    assert torch.equal(personal, alone.state["models"][0]) and lam.tolist() == [1.0] and (lam_class == 1).all()


@pytest.mark.parametrize("extractor,classifier", [("local", "class"), ("fedavg", "class"), ("influence", "client")])
def test_table3_ablations(extractor, classifier):
    fed, m, x, y = c2i_case(extractor=extractor, classifier=classifier, gamma=2.0)
    models, head = m.state["models"], fed.worker.mask(lambda e: e.name.startswith("head."))
    personal, lam, lam_class = m.personalize(1, fed.worker, x, y)
    expected_body = {"local": models[1], "fedavg": (models[0] + models[1] + 2 * models[2]) / 4,
                     "influence": lam.float() @ models}[extractor]
    torch.testing.assert_close(personal[~head], expected_body[~head])
    w = fed.worker.entry("head.weight").slice
    rows = lam_class if classifier == "class" else lam[:, None].expand(3, 2)  # -lambda: rows by lambda_m
    expected = (rows.float()[:, :, None] * models[:, w].view(3, 2, 3)).sum(0)
    torch.testing.assert_close(personal[w].view(2, 3), expected)


def test_class_features_from_the_aggregated_extractor_change_lambda_only():
    _, own, x, y = c2i_case()
    fed, agg, _, _ = c2i_case(class_features="aggregated")
    a, b = own.personalize(0, own.fed.worker, x, y), agg.personalize(0, fed.worker, x, y)
    torch.testing.assert_close(a[1], b[1])
    assert not torch.allclose(a[2], b[2])


def test_uploads_are_committed_after_the_round():
    fed, m, _, _ = c2i_case()
    before = m.state["models"].clone()
    m.begin_round(1, [0, 1])
    fed.worker.load(torch.zeros(fed.size))
    m.upload(task(0, before[0]), fed.worker)
    assert torch.equal(m.state["models"], before)  # client 1 still aggregates client 0's last-round model
    m.upload(task(1, before[1]), fed.worker)
    m.aggregate(1, [0, 1])
    assert not m.state["models"][:2].any() and torch.equal(m.state["models"][2], before[2])


# ------------------------------------------------------------------------------------------ FedRoD
def test_balanced_softmax_loss_on_a_hand_example():
    logits, y = torch.tensor([[0.5, -1.0, 2.0]]), torch.tensor([0])
    counts = torch.tensor([3, 1, 0])  # class 2 absent from the client
    expected = -math.log(3 * math.exp(0.5) / (3 * math.exp(0.5) + math.exp(-1.0)))
    assert balanced_softmax_loss(logits, y, counts).item() == pytest.approx(expected, rel=1e-6)
    prior = torch.tensor([0.75, 0.25, 1e-30]).log()  # log class priors: the same loss (softmax shift)
    assert F.cross_entropy(logits + prior, y).item() == pytest.approx(expected, rel=1e-6)
    logits.requires_grad_(True)
    balanced_softmax_loss(logits, y, counts).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 2] == 0


def rod_model(personal_init: str = "copy") -> nn.Module:
    cls = methods.load("fedrod")
    torch.manual_seed(0)
    base = build_model("small_cnn", num_classes=4, in_channels=1, image_size=8)
    return cls.extend_model(base, hyperparameters(cls, {"personal_init": personal_init}))


def test_fedrod_prediction_is_the_sum_of_both_heads_and_losses_reach_their_own_parts():
    module = rod_model()
    fed = federation(module, 2)
    m = method("fedrod", fed, personal_init="copy")
    torch.testing.assert_close(module.personal.weight, module.head.weight)  # copy init
    with torch.no_grad():
        module.personal.weight.add_(torch.randn_like(module.personal.weight))
    x = torch.rand(5, 1, 8, 8)
    z = module.body(x)
    torch.testing.assert_close(m.predict(0, fed.worker, x), module.head(z) + module.personal(z))
    data = tiny_data()
    y = torch.tensor([0, 1, 1, 2, 0])
    loss = m.loss(task(0, fed.worker.read(), data.client(0)), fed.worker, x, y)
    grads = torch.autograd.grad(loss, [module.body[0].weight, module.head.weight, module.personal.weight])
    counts = torch.bincount(data.labels, minlength=4)
    bsm = balanced_softmax_loss(module.head(module.body(x)), y, counts)
    body_g, head_g = torch.autograd.grad(bsm, [module.body[0].weight, module.head.weight])
    torch.testing.assert_close(grads[0], body_g)  # the personal loss never reaches the body ...
    torch.testing.assert_close(grads[1], head_g)  # ... nor the generic head
    generic = module.head(z).detach()
    (p_g,) = torch.autograd.grad(F.cross_entropy(generic + module.personal(z.detach()), y), [module.personal.weight])
    torch.testing.assert_close(grads[2], p_g)
    assert not rod_model("zero").personal.weight.any()


def test_fedrod_averages_body_and_generic_head_and_keeps_the_personal_head():
    fed = federation(rod_model(), 2, sizes=[1.0, 3.0])
    m = method("fedrod", fed, personal_init="copy")
    personal = fed.worker.mask(lambda e: e.name.startswith("personal."))
    assert int(personal.sum()) == 128 * 4 + 4
    a, b = torch.randn(fed.size), torch.randn(fed.size)
    m.begin_round(1, [0, 1])
    for cid, vec in ((0, a), (1, b)):
        fed.worker.load(vec)
        m.upload(task(cid, m.client_model(cid)), fed.worker)
    m.aggregate(1, [0, 1])
    for cid, own in ((0, a), (1, b)):
        assert torch.equal(m.client_model(cid)[personal], own[personal])
        torch.testing.assert_close(m.client_model(cid)[~personal], ((a + 3 * b) / 4)[~personal])


# ---------------------------------------------------------------------------------------- FedProto
def test_prototype_averaging_per_class():
    protos = torch.tensor([[[1.0, 0.0], [0.0, 0.0], [5.0, 5.0]],
                           [[3.0, 2.0], [4.0, 4.0], [0.0, 0.0]]])  # [K=2, C=3, F=2]
    counts = torch.tensor([[1.0, 0.0, 2.0], [3.0, 5.0, 0.0]])
    mean, weight = average_prototypes(protos, counts, "count")
    torch.testing.assert_close(mean, torch.tensor([[2.5, 1.5], [4.0, 4.0], [5.0, 5.0]]))  # (1*1 + 3*3) / 4, ...
    assert weight.tolist() == [4.0, 5.0, 2.0]
    mean, weight = average_prototypes(protos, counts, "uniform")
    torch.testing.assert_close(mean[0], torch.tensor([2.0, 1.0]))  # plain mean over the clients holding class 0
    assert weight.tolist() == [2.0, 1.0, 1.0]
    assert average_prototypes(protos, torch.zeros(2, 3), "count")[1].tolist() == [0.0, 0.0, 0.0]


def test_prototype_regulariser_value_and_gradient():
    z = torch.tensor([[1.0, 2.0], [0.0, 1.0], [3.0, 3.0]], requires_grad=True)
    y = torch.tensor([0, 1, 2])
    protos, known = torch.tensor([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]]), torch.tensor([1.0, 1.0, 0.0])
    value = proto_penalty(z, y, protos, known, "squared_l2")
    assert value.item() == pytest.approx((5.0 + 1.0 + 0.0) / 3)  # class 2 has no global prototype: no term
    (grad,) = torch.autograd.grad(value, z)
    torch.testing.assert_close(grad, 2 * (z - protos[y]).detach() * known[y, None] / 3)
    assert proto_penalty(z, y, protos, known, "mse").item() == pytest.approx(value.item() / 2)  # / feature size


def test_nearest_prototype_prediction_and_own_prototype_fallback():
    z = torch.tensor([[0.9, 0.1], [0.1, 1.2], [4.0, 5.0]])
    protos, known = torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]), torch.tensor([True, True, False])
    logits = nearest_prototype_logits(z, protos, known)
    assert logits.argmax(1).tolist() == [0, 1, 1]  # class 2 has no prototype: never predicted
    assert logits[0, 0].item() == pytest.approx(-(0.01 + 0.01))
    fed = federation(tiny_split(features=2, classes=3), 2)
    m = method("fedproto", fed, **{**PROTO, "prediction": "nearest"})
    m.state["global"], m.state["global_weight"] = protos, torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64)
    m.state["protos"][0, 2], m.state["counts"][0, 2] = torch.tensor([7.0, 7.0]), 3.0  # client 0 holds class 2
    held, has = m.prototypes_of(0)
    assert has.all() and held[2].tolist() == [7.0, 7.0] and not m.prototypes_of(1)[1][2]
    x = torch.randn(4, 2)
    expected = nearest_prototype_logits(fed.worker.module.features(x), held, has)
    torch.testing.assert_close(m.predict(0, fed.worker, x), expected)


@pytest.mark.parametrize("source", ["training", "trained"])
def test_fedproto_uploads_class_means_and_keeps_models_local(source):
    data = tiny_data()
    fed = federation(build_model("small_cnn", num_classes=4, in_channels=1, image_size=8), 2)
    m = method("fedproto", fed, **{**PROTO, "prototypes": source})
    start = m.client_model(0).clone()
    seen = []
    if source == "training":  # record the features local training sees, batch by batch
        loss = m.loss
        m.loss = lambda t, model, x, y: seen.append((model.module.features(x).detach(), y)) or loss(t, model, x, y)
    t = task(0, start, data.client(0))
    m.train_client(t, fed.worker)
    m.upload(t, fed.worker)
    trained = fed.worker.read()
    if source == "trained":
        fed.worker.module.eval()
        with torch.no_grad():
            seen = [(fed.worker.module.features(data.images), data.labels)]
    z, y = torch.cat([s[0] for s in seen]), torch.cat([s[1] for s in seen])
    for c in range(4):
        torch.testing.assert_close(m.state["protos"][0, c], z[y == c].mean(0), rtol=1e-5, atol=1e-6)
    assert m.state["counts"][0].tolist() == torch.bincount(data.labels, minlength=4).double().tolist()
    assert not m.state["counts"][1].any()
    m.aggregate(1, [0])
    torch.testing.assert_close(m.state["global"], m.state["protos"][0])  # the only client holding prototypes
    assert torch.equal(m.client_model(0), trained) and torch.equal(m.client_model(1), start)  # no averaging


# ---------------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("overrides", [["method=fedc2i"], ["method=fedc2i", "method.extractor=fedavg"],
                                       ["method=fedrod"], ["method=fedproto", "method.prediction=nearest"]])
def test_each_option_runs_end_to_end_and_fedc2i_records_its_influence(tmp_path, overrides):
    """(Resume and rerun of the defaults: test_method_contract.)"""
    first = execute(config(tmp_path / "a", *overrides, "rounds=2"))
    assert first["complete"] and all(math.isfinite(r["acc"]) for r in first["results"])
    if overrides[0] == "method=fedc2i":
        records = method_records(tmp_path / "a")
        assert [r["round"] for r in records] == [1, 2]
        for r in records:
            assert r["influence_clients"] == [0, 1, 2, 3]
            for vector, matrix in zip(r["influence"], r["class_influence"], strict=True):
                assert len(vector) == 4 and sum(vector) == pytest.approx(1.0)
                assert len(matrix) == 4 and all(len(row) == 4 for row in matrix)  # [M][C], C = 4 classes
                assert [sum(col) for col in zip(*matrix, strict=True)] == pytest.approx([1.0] * 4)
        assert records[0]["influence"] == [[0.25] * 4] * 4  # round 1: every upload is the initial model
        assert records[1]["influence"] != records[0]["influence"]
