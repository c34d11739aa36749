"""PerFedMask: mask selection, masked aggregation, fine-tuning scope, and a deterministic end-to-end run."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import methods
from bench.builder import build_experiment
from bench.core.engine import ClientRound, Federation, hyperparameters
from bench.core.flat import FlatModel
from bench.core.models import build_model
from bench.experiment.run import execute, to_container
from methods.perfedmask import body_blocks, client_budgets, masking_vectors, objective
from tests.helpers import config

TRAIN = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "epochs": 1, "batch_size": 4}
HP = dict(freeze_head=True, finetune_epochs=0, finetune_momentum=0.9, finetune_weight_decay=5e-4)


def federation(module: nn.Module, num_clients: int, sizes: list[float] | None = None) -> Federation:
    sizes_t = torch.tensor(sizes or [1.0] * num_clients, dtype=torch.float64)
    return Federation(num_clients, sizes_t, FlatModel(module), TRAIN, torch.device("cpu"), 0)


def perfedmask(fed: Federation, **hp):
    cls = methods.load("perfedmask")
    m = cls(fed, hyperparameters(cls, {**HP, **hp}))
    m.setup(fed.worker.read())
    return m


def upload_vectors(m, vectors: dict[int, torch.Tensor], round_: int = 1) -> None:
    """Simulate a round in which client c trained to vectors[c]."""
    m.begin_round(round_, sorted(vectors))
    for cid, vec in sorted(vectors.items()):
        start = m.client_model(cid).clone()
        m.fed.worker.load(vec)
        task = ClientRound(cid, round_, None, torch.Generator().manual_seed(cid), start, 0.1)  # type: ignore[arg-type]
        m.upload(task, m.fed.worker)
    m.aggregate(round_, sorted(vectors))


def brute_force(sizes: list[int], budgets: list[float]) -> float:
    """min J over every feasible binary M (no empty row, no budget exceeded)."""
    best, total = float("inf"), sum(sizes)
    rows = [r for r in itertools.product([False, True], repeat=len(sizes)) if any(r)]
    for choice in itertools.product(rows, repeat=len(budgets)):
        used = [sum(s for s, on in zip(sizes, r, strict=True) if on) for r in choice]
        if all(u <= nu * total + 1e-9 for u, nu in zip(used, budgets, strict=True)):
            best = min(best, objective(torch.tensor(choice), sizes, budgets))
    return best


def test_budget_schedule_groups_clients_like_the_official_code():
    assert client_budgets(1.0, 3) == [1.0, 1.0, 1.0]
    assert client_budgets([0.125, 1.0], 4) == [0.125, 0.125, 1.0, 1.0]  # slim_ratios "8-1"
    assert client_budgets([0.2, 0.4, 0.6], 3) == [0.2, 0.4, 0.6]  # one value per client
    for bad in (0.0, 1.5, [0.5] * 4, []):
        with pytest.raises(ValueError, match="method.budget"):
            client_budgets(bad, 3)


def test_mask_selection_on_a_hand_checkable_case():
    # P = 40; blocks 10, 10, 20; budgets 40, 20, 20 parameters
    masks = masking_vectors([10, 10, 20], [1.0, 0.5, 0.5])
    assert masks.int().tolist() == [[1, 1, 1], [0, 0, 1], [1, 1, 0]]  # every block trained by exactly 2 clients
    assert objective(masks, [10, 10, 20], [1.0, 0.5, 0.5]) == pytest.approx(3 * 40 / 2 - 40)  # J = 20
    assert masking_vectors([4, 4], [1.0, 1.0]).all()  # nu = 1: everything (J = 0, the lower bound)
    assert masking_vectors([10, 30], [0.1]).int().tolist() == [[1, 0]]  # nothing fits: the smallest block


@pytest.mark.parametrize("sizes,budgets", [([10, 10, 20], [0.25, 0.5, 1.0]), ([5, 30, 15], [0.3, 0.5, 0.7]),
                                           ([8, 8, 16], [0.25, 0.25, 0.75])])
def test_local_search_reaches_the_exact_optimum_on_small_problems(sizes, budgets):
    masks = masking_vectors(sizes, budgets)
    used = masks.double() @ torch.tensor(sizes, dtype=torch.float64)
    assert (used <= torch.tensor(budgets, dtype=torch.float64) * sum(sizes) + 1e-9).all() and masks.any(1).all()
    assert objective(masks, sizes, budgets) == pytest.approx(brute_force(sizes, budgets))


def test_blocks_join_norm_layers_to_their_layer_and_residual_blocks():
    names = list(body_blocks(FlatModel(build_model("resnet8", num_classes=10, in_channels=3, image_size=32))))
    assert names == ["body.conv1", "body.layer1.0", "body.layer2.0", "body.layer3.0"]
    flat = FlatModel(build_model("small_cnn", num_classes=3, in_channels=1, image_size=8, norm="bn"))
    blocks = body_blocks(flat)
    assert [flat.entries[i].name for i in blocks["body.0"]] == [
        "body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias", "body.1.running_mean", "body.1.running_var"]
    assert not any(flat.entries[i].name.startswith("head.") for idx in blocks.values() for i in idx)


def test_masked_aggregation_averages_each_entry_over_its_trainers_only():
    fed = federation(build_model("small_cnn", num_classes=3, in_channels=1, image_size=8), 3, [1.0, 3.0, 2.0])
    m = perfedmask(fed, budget=[1.0, 0.2, 0.2])
    trains, head = m.state["trains"], fed.worker.mask(lambda e: e.name.startswith("head."))
    assert trains[0, ~head].all() and not trains[:, head].any() and not trains[1:, ~head].all(1).any()
    init = m.state["global"].clone()
    vecs = {c: torch.randn(fed.size) for c in range(3)}
    upload_vectors(m, vecs)
    w = torch.tensor([1.0, 3.0, 2.0])[:, None] * trains.float()
    expected = (w * torch.stack([vecs[c] for c in range(3)])).sum(0) / w.sum(0).clamp_min(1e-12)
    torch.testing.assert_close(m.state["global"][~head], expected[~head])
    assert torch.equal(m.state["global"][head], init[head])  # frozen head: nobody uploads it
    upload_vectors(m, {1: torch.randn(fed.size)}, round_=2)  # a lone partial client leaves its untrained blocks
    assert torch.equal(m.state["global"][~trains[1]], expected.where(~head, init)[~trains[1]])


def test_local_training_touches_only_masked_blocks_and_post_fine_tunes_everything(tmp_path: Path):
    experiment = build_experiment(to_container(config(tmp_path, "method=perfedmask", "method.budget=[0.2,1.0]",
                                                      "method.finetune_epochs=1")))
    m, worker, data = experiment.method, experiment.fed.worker, experiment.data
    m.setup(worker.read())
    m.begin_round(1, [0])
    start = m.client_model(0).clone()
    worker.load(start)
    task = ClientRound(0, 1, data.client(0), torch.Generator().manual_seed(0), start, 0.1)
    m.train_client(task, worker)
    changed = worker.vector != start
    trains = m.state["trains"][0]
    assert changed.any() and not changed[~trains].any()  # untrained blocks and the head never move
    tuned = m.eval_model(0, "post", worker, round_=1, lr=0.1)
    head = worker.mask(lambda e: e.name.startswith("head."))
    assert (tuned != m.state["global"])[head].any() and (tuned != m.state["global"])[~trains & ~head].any()
    again = m.eval_model(0, "post", worker, round_=1, lr=0.1).clone()
    torch.testing.assert_close(again, tuned)  # fine-tuning is seeded by (seed, round, client)


@pytest.mark.parametrize("budget", ["1.0", "[0.3,1.0]"])
def test_the_budget_sets_the_trained_fraction_end_to_end(tmp_path: Path, budget: str):
    """(Resume and rerun: test_method_contract.)"""
    a = execute(config(tmp_path / "a", "method=perfedmask", "rounds=3", f"method.budget={budget}"))
    assert a["complete"]
    rounds = [json.loads(line) for line in next((tmp_path / "a").rglob("rounds.jsonl")).read_text().splitlines()]
    method = [r for r in rounds if r["kind"] == "method"]
    assert len(method) == 3
    if budget == "1.0":  # nu = 1: all-ones masks, J at its lower bound 0
        assert method[0]["trained_fraction"] == 1.0 and method[0]["mask_objective"] == 0.0
    else:
        assert 0.3 < method[0]["trained_fraction"] < 1.0
