"""Update rules of FedCAC and its baselines on tiny hand-checkable cases."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from bench.core.engine import ClientRound
from bench.core.models import build_model
from bench.experiment.run import config_hash, execute
from methods.fedamp import FedAMPHyper, attention_spread, attention_weights, cosine_attention_weights
from methods.fedcac import FedCACHyper, collaborators, critical_mask, overlaps
from tests.helpers import config, federation, method


def task(cid: int, start: torch.Tensor, round_: int = 1) -> ClientRound:
    return ClientRound(cid, round_, None, torch.Generator().manual_seed(cid), start, 0.1)  # type: ignore[arg-type]


def upload_vectors(m, vectors: dict[int, torch.Tensor], round_: int = 1) -> None:
    """Simulate a round in which client c trained to vectors[c]."""
    m.begin_round(round_, sorted(vectors))
    for cid, vec in sorted(vectors.items()):
        start = m.client_model(cid).clone()
        m.fed.worker.load(vec)
        m.upload(task(cid, start, round_), m.fed.worker)
    m.aggregate(round_, sorted(vectors))


# ------------------------------------------------------------------------------------------ FedCAC
def test_critical_mask_top_tau_per_tensor_and_ties():
    assert critical_mask(torch.tensor([0.1, 0.5, 0.3, 0.4]), 0.5).tolist() == [False, True, False, True]
    assert critical_mask(torch.tensor([0.5, 0.5, 0.5, 0.1]), 0.25).tolist() == [True, True, True, False]  # ties
    assert not critical_mask(torch.tensor([1.0, 2.0, 3.0, 4.0]), 0.2).any()  # floor(0.8) = 0
    # threshold <= 1e-10 falls back to the smallest score > 1e-20 (official code)
    assert critical_mask(torch.tensor([0.0, 0.0, 0.0, 1e-15]), 0.5).tolist() == [False, False, False, True]
    assert critical_mask(torch.zeros(4), 0.5).all()  # all-zero tensor: wholly critical
    assert critical_mask(torch.tensor([0.1, 0.5, 0.3, 0.4]), 0.5, reverse=True).tolist() == [True, False, True, False]


def test_overlap_values_code_and_paper_definitions():
    masks = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
    o = overlaps(masks, "code", chunk=3)  # chunking must not change the counts
    assert o[0, 1].item() == pytest.approx(0.5)  # |c1 & c2| / |c1| when sizes match
    assert o[0, 2].item() == pytest.approx(1 - (2 + 3 - 4) / 4)  # 0.75: the code's formula, sizes differ
    assert o[2, 0].item() == pytest.approx(1 - (3 + 2 - 4) / 6)  # not symmetric
    paper = overlaps(masks, "paper")
    assert paper[0, 1].item() == pytest.approx(2 / 8)  # ||M1 - M2||_1 / (2n), n = 4


def cac_hp(**kw) -> FedCACHyper:
    base = dict(tau=0.5, beta=10, selection="sensitivity", collaboration="time_varying", top_k=1,
                noncritical="all", overlap="code", bn_stats="local", overlap_matrix_every=0)
    return FedCACHyper(**{**base, **kw})


def test_threshold_and_collaborators_at_t1_beta_and_after():
    o = torch.tensor([[1.0, 0.9, 0.5], [0.8, 1.0, 0.6], [0.5, 0.7, 1.0]])
    off = [0.9, 0.5, 0.8, 0.6, 0.5, 0.7]
    avg, mx = sum(off) / 6, 0.9
    groups, stats = collaborators(o, 1, cac_hp())
    assert stats["threshold"] == pytest.approx(avg + 0.1 * (mx - avg))  # Eq. 7 with 1-based t
    thr = stats["threshold"]  # 0.6833...
    assert groups == [[j for j in (1, 2) if o[0, j] >= thr], [j for j in (0, 2) if o[1, j] >= thr],
                      [j for j in (0, 1) if o[2, j] >= thr]] == [[1], [0], [1]]
    groups, stats = collaborators(o, 10, cac_hp())
    assert stats["threshold"] == pytest.approx(mx) and groups == [[1], [], []]  # only pairs at O_max
    groups, _ = collaborators(o, 11, cac_hp())
    assert groups == [[], [], []]  # t > beta: critical parameters are trained locally only
    assert collaborators(o, 50, cac_hp(collaboration="top_k", top_k=1))[0] == [[1], [0], [1]]
    assert collaborators(o, 1, cac_hp(collaboration="none"))[0] == [[], [], []]


def tiny_bn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))


def test_eq11_mix_critical_from_collaborators_rest_from_global_bn_stats_local():
    fed = federation(tiny_bn(), 3, sizes=[1.0, 1.0, 2.0])
    m = method("fedcac", fed, **{k: v for k, v in vars(cac_hp(beta=1)).items()})
    d = fed.size  # 6 linear params + 4 BN params + 4 BN buffers
    params = fed.worker.param_mask
    trained = {0: torch.arange(d, dtype=torch.float32) + 1.0, 1: -(torch.arange(d, dtype=torch.float32) + 1.0),
               2: torch.full((d,), 4.0)}
    upload_vectors(m, trained, round_=1)  # beta=1: only the pair(s) reaching O_max collaborate
    masks = m._masks
    stats = m.metrics(1)
    w_bar = (trained[0] + trained[1] + 2 * trained[2]) / 4  # Eq. 9, sample-weighted
    for cid in range(3):
        members = [cid] + [j for j in range(3) if j != cid and
                           overlaps(torch.stack([masks[i][params] for i in range(3)]))[cid, j] >= stats["threshold"]]
        u = torch.stack([trained[j] for j in members]).mean(0)  # Eq. 10
        expected = torch.where(masks[cid], u, w_bar)
        expected = torch.where(params, expected, trained[cid])  # BN buffers stay the client's own
        torch.testing.assert_close(m.client_model(cid), expected)
    assert stats["collaborators_max"] >= 1


def test_noncritical_as_critical_and_bn_stats_critical_options():
    fed = federation(tiny_bn(), 2)
    m = method("fedcac", fed, **vars(cac_hp(noncritical="as_critical", bn_stats="critical",
                                               collaboration="none")))
    d = fed.size
    upload_vectors(m, {0: torch.ones(d), 1: torch.full((d,), 3.0)})
    assert torch.equal(m.client_model(0), torch.ones(d)) and torch.equal(m.client_model(1), torch.full((d,), 3.0))


def test_round1_critical_initial_takes_round_1_critical_entries_from_the_initial_model_only():
    fed = federation(nn.Linear(3, 2), 2)
    init = fed.worker.read().clone()
    d = fed.size
    trained = {0: init + torch.arange(d, dtype=torch.float32), 1: init - 2 * torch.arange(d, dtype=torch.float32)}
    w_bar = (trained[0] + trained[1]) / 2
    runs = {}
    for choice in ("customized", "initial"):
        fed.worker.load(init)  # every client starts from the same initial model
        m = method("fedcac", fed, **vars(cac_hp(round1_critical=choice, collaboration="none")))
        upload_vectors(m, trained, round_=1)
        runs[choice] = m
        for cid in (0, 1):
            critical_source = init if choice == "initial" else trained[cid]  # no collaborators: u_i = w_i
            torch.testing.assert_close(m.client_model(cid), torch.where(m._masks[cid], critical_source, w_bar))
    assert not torch.equal(runs["customized"].client_model(0), runs["initial"].client_model(0))
    m = runs["initial"]  # from round 2 on, Eq. 10 as in the default
    again = {0: m.client_model(0) + 1.0, 1: m.client_model(1) - 1.0}
    upload_vectors(m, again, round_=2)
    for cid in (0, 1):
        w_bar = (again[0] + again[1]) / 2
        torch.testing.assert_close(m.client_model(cid), torch.where(m._masks[cid], again[cid], w_bar))


def test_committed_fedcac_runs_keep_their_config_hash_with_round1_critical_customized():
    root = Path(__file__).resolve().parent.parent
    runs = sorted(root.glob("runs/*/*/medium/fedcac/*/summary.json"))
    assert runs, "no committed FedCAC runs found under runs/"
    for summary in runs:
        cfg = yaml.safe_load((summary.parent / "config.yaml").read_text())
        recorded = json.loads(summary.read_text())["config_hash"]
        assert "round1_critical" not in cfg["method"] and config_hash(cfg) == recorded, summary
        cfg["method"]["round1_critical"] = "customized"  # the default: the run as it was before the key existed
        assert config_hash(cfg) == recorded, summary
        cfg["method"]["round1_critical"] = "initial"
        assert config_hash(cfg) != recorded, summary


def test_fedcac_sensitivity_is_eq5():
    fed = federation(nn.Linear(4, 1, bias=False), 1)
    m = method("fedcac", fed, **vars(cac_hp()))
    start = torch.tensor([1.0, 1.0, 1.0, 1.0])
    m.state["models"][0] = start
    m.begin_round(1, [0])
    fed.worker.load(torch.tensor([1.5, 0.0, 3.0, 1.1]))  # s = |delta * theta| = [.75, 0, 6, .11]
    m.upload(task(0, start.clone()), fed.worker)
    assert m._masks[0].tolist() == [True, False, True, False]


# ----------------------------------------------------------------------------- FedBN / FedPer / FedRep
def test_fedbn_keeps_exactly_the_norm_layers_local():
    torch.manual_seed(0)
    module = build_model("resnet8", num_classes=3, in_channels=1, image_size=8, width=0.125)
    fed = federation(module, 2)
    m = method("fedbn", fed)
    norm = fed.worker.mask(lambda e: isinstance(fed.worker.module.get_submodule(e.name.rpartition(".")[0]),
                                                nn.BatchNorm2d))
    assert int(norm.sum()) == int(fed.worker.index(norm).numel()) > 0
    assert torch.equal(m.state["personal_index"], fed.worker.index(norm))
    a, b = torch.randn(fed.size), torch.randn(fed.size)
    upload_vectors(m, {0: a, 1: b})
    for cid, own in ((0, a), (1, b)):
        got = m.client_model(cid)
        assert torch.equal(got[norm], own[norm])
        torch.testing.assert_close(got[~norm], ((a + b) / 2)[~norm])


@pytest.mark.parametrize("name", ["fedper", "fedrep"])
def test_fedper_and_fedrep_keep_exactly_the_head_local(name):
    module = build_model("small_cnn", num_classes=3, in_channels=1, image_size=8)
    fed = federation(module, 2)
    hp = {"head_epochs": 1, "body_epochs": 1} if name == "fedrep" else {}
    m = method(name, fed, **hp)
    head = fed.worker.mask(lambda e: e.name.startswith("head."))
    assert int(head.sum()) == 128 * 3 + 3
    a, b = torch.randn(fed.size), torch.randn(fed.size)
    upload_vectors(m, {0: a, 1: b})
    for cid, own in ((0, a), (1, b)):
        assert torch.equal(m.client_model(cid)[head], own[head])
        torch.testing.assert_close(m.client_model(cid)[~head], ((a + b) / 2)[~head])


def test_fedrep_trains_head_then_body(tmp_path):
    summary = execute(config(tmp_path, "method=fedrep", "method.head_epochs=2", "method.body_epochs=1",
                             "rounds=1"))
    assert summary["complete"]
    module = build_model("small_cnn", num_classes=4, in_channels=1, image_size=8)
    fed = federation(module, 1)
    m = method("fedrep", fed, head_epochs=2, body_epochs=1)
    calls = []
    m.local_sgd = lambda t, model, epochs, params: calls.append((epochs, {id(p) for p in params})) or 0.0
    m.train_client(task(0, fed.worker.read()), fed.worker)
    head_ids = {id(module.head.weight), id(module.head.bias)}
    body_ids = {id(p) for n, p in module.named_parameters() if n.startswith("body.")}
    assert calls == [(2, head_ids), (1, body_ids)]


def test_frozen_parts_do_not_move_during_fedrep_phases(tmp_path):
    from bench.core.data import FederatedData
    from datasets.augment import build_transform
    from datasets.sources import load_source

    src = load_source("synthetic", "train", num_train=16, num_classes=4)
    data = FederatedData(src.images, src.labels, ({"train": torch.arange(16), "val": torch.arange(0),
                                                   "test": torch.arange(4)},), src.classes,
                         build_transform(None), build_transform(None), None, src.labels)  # type: ignore[arg-type]
    module = build_model("small_cnn", num_classes=4, in_channels=1, image_size=8)
    fed = federation(module, 1)
    head = fed.worker.mask(lambda e: e.name.startswith("head."))
    for head_epochs, body_epochs, moved in ((1, 0, head), (0, 1, ~head)):
        m = method("fedrep", fed, head_epochs=head_epochs, body_epochs=body_epochs)
        before = fed.worker.read()
        m.train_client(ClientRound(0, 1, data.client(0), torch.Generator().manual_seed(0), before, 0.1), fed.worker)
        after = fed.worker.read()
        params = fed.worker.param_mask
        assert torch.equal(after[~moved & params], before[~moved & params])
        assert not torch.equal(after[moved & params], before[moved & params])
        assert all(p.requires_grad for p in module.parameters())  # frozen flags restored


# ------------------------------------------------------------------------------------------- FedAMP
def test_fedamp_weights_sum_to_one_and_follow_the_attention_function():
    torch.manual_seed(0)
    w = torch.randn(5, 7)
    xi = attention_weights(w, alpha_k=0.5, sigma=30.0)
    torch.testing.assert_close(xi.sum(1), torch.ones(5, dtype=torch.float64))
    d2 = float(((w[0].double() - w[3].double()) ** 2).sum())
    assert xi[0, 3].item() == pytest.approx(0.5 * math.exp(-d2 / 30.0) / 30.0, rel=1e-9)


def test_fedamp_cloud_models_and_proximal_gradient():
    fed = federation(nn.Linear(2, 1), 3)
    m = method("fedamp", fed, alpha_k=1.0, lam=2.0, sigma=10.0, start="own")
    vecs = {c: torch.full((fed.size,), float(c)) for c in range(3)}
    upload_vectors(m, vecs)
    xi = attention_weights(torch.stack([vecs[c] for c in range(3)]), 1.0, 10.0)
    expected = (xi @ torch.stack([vecs[c] for c in range(3)]).double()).float()
    torch.testing.assert_close(m.state["clouds"], expected)
    fed.worker.load(torch.zeros(fed.size))
    for p in fed.worker.parameters():
        p.grad = torch.zeros_like(p)
    m.before_step(task(1, torch.zeros(fed.size)), fed.worker)
    grads = torch.cat([p.grad.flatten() for p in fed.worker.parameters()])
    torch.testing.assert_close(grads, 2.0 * (0 - expected[1]))  # (lambda / alpha_k)(w - u_i)


def test_fedamp_cosine_form_fixes_the_self_weight_and_prefers_the_most_similar_model():
    w = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, 0.2]])
    xi = cosine_attention_weights(w, cos_scale=5.0, self_weight=0.25)
    torch.testing.assert_close(xi.sum(1), torch.ones(4, dtype=torch.float64))
    assert xi.diagonal().tolist() == [0.25] * 4
    cos01 = 0.9 / math.hypot(0.9, 0.1)
    expected = 0.75 * math.exp(5 * cos01) / (math.exp(5 * cos01) + 1.0 + math.exp(5 * -1.0 / math.hypot(1.0, 0.2)))
    assert xi[0, 1].item() == pytest.approx(expected, rel=1e-9)
    spread = attention_spread(xi, [10, 11, 12, 13])
    assert spread["xi_top_partner"][:2] == [11, 10]  # client ids, not positions
    off = xi.masked_fill(torch.eye(4, dtype=torch.bool), 0.0)
    share = (off.max(1).values / off.sum(1)).mean().item()  # every row's top weight over its off-diagonal mass
    assert spread["xi_top_share"] == pytest.approx(share, rel=1e-12)


def test_fedamp_alpha_decays_every_decay_every_rounds():
    fed = federation(nn.Linear(2, 1), 2)
    m = method("fedamp", fed, alpha_k=100.0, lam=1.0, sigma=1.0, start="cloud", alpha_decay=0.1, decay_every=30)
    assert [m.alpha(r) for r in (1, 30, 31, 60, 61)] == pytest.approx([100.0, 100.0, 10.0, 10.0, 1.0])
    with pytest.raises(ValueError, match="method.attention='dot'"):
        FedAMPHyper(alpha_k=1.0, lam=1.0, sigma=1.0, start="own", attention="dot")


@pytest.mark.parametrize("attention", ["cosine", "distance"])
def test_fedamp_weights_a_class_sharing_partner_above_the_others(tmp_path: Path, attention: str) -> None:
    """Three pairs of clients, each pair holding the same two digits: every client's recorded top partner is
    the other client of its pair, in every round, with more than a uniform share of its off-diagonal weight."""
    pairs = [[1.0 if c in (2 * (i // 2), 2 * (i // 2) + 1) else 0.0 for c in range(10)] for i in range(6)]
    form = {"cosine": ["method.attention=cosine"],  # FLGo's HeurFedAMP values (cos_scale 25, xi_ii = 1 / M)
            "distance": ["method.sigma=0.3", "method.alpha_k=0.05", "method.lam=0.01"]}[attention]  # sigma ~ its d^2
    cfg = config(tmp_path, "dataset=digits", "partition=class_mix", f"partition.mixes={json.dumps(pairs)}",
                 "partition.n_train=40", "partition.n_test=10", "num_clients=6", "rounds=4", "method=fedamp", *form)
    execute(cfg)
    run_dir = next((tmp_path / "runs").glob("**/rounds.jsonl")).parent
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    spreads = [r for r in rounds if r.get("kind") == "method"]
    assert len(spreads) == 4
    for r in spreads:
        assert r["xi_top_partner"] == [1, 0, 3, 2, 5, 4], r
        assert r["xi_top_share"] > 1 / 5
        assert r["xi_offdiag_min"] < r["xi_offdiag_median"] <= r["xi_offdiag_max"]


# ---------------------------------------------------------------------------------------- PerFedMask
def test_perfedmask_masking_vectors_fill_budgets_with_balanced_coverage():
    from methods.perfedmask import masking_vectors

    masks = masking_vectors([10, 10, 20], [1.0, 0.5, 0.5])
    assert masks[0].tolist() == [True, True, True]  # nu = 1: everything
    assert masks[1].tolist() == [False, False, True]  # least covered, larger first: the 20-block
    assert masks[2].tolist() == [True, True, False]  # then the remaining least-covered blocks
    assert masking_vectors([10, 30], [0.1])[0].tolist() == [True, False]  # nothing fits: smallest block


def test_perfedmask_masked_aggregation_and_frozen_head():
    module = build_model("small_cnn", num_classes=3, in_channels=1, image_size=8)
    fed = federation(module, 2)
    m = method("perfedmask", fed, budget=[1.0, 0.3], freeze_head=True, finetune_epochs=0,
               finetune_momentum=0.9, finetune_weight_decay=0.0)
    trains = m.state["trains"]
    head = fed.worker.mask(lambda e: e.name.startswith("head."))
    assert not trains[:, head].any() and trains[0, ~head].all() and 0 < trains[1].sum() < trains[0].sum()
    init = m.state["global"].clone()
    a, b = torch.randn(fed.size), torch.randn(fed.size)
    upload_vectors(m, {0: a, 1: b})
    both, only0 = trains[0] & trains[1], trains[0] & ~trains[1]
    torch.testing.assert_close(m.state["global"][both], ((a + b) / 2)[both])
    torch.testing.assert_close(m.state["global"][only0], a[only0])
    assert torch.equal(m.state["global"][head], init[head])  # nobody trains the head: unchanged


def test_perfedmask_post_stage_is_the_fine_tuned_global_model(tmp_path):
    def results(epochs: int) -> dict:
        s = execute(config(tmp_path / str(epochs), "method=perfedmask", "rounds=2",
                           f"method.finetune_epochs={epochs}"))
        return {(r["stage"], r["selection"], r["weighting"]): r["acc"] for r in s["results"]}

    none, some = results(0), results(2)
    assert none[("pre", "final", "unweighted")] == some[("pre", "final", "unweighted")]
    assert none[("post", "final", "unweighted")] != some[("post", "final", "unweighted")]


def test_fedamp_fling_constants_extrapolate_on_a_small_model() -> None:
    """Fling's alpha_k 1e4, sigma 100 on 10 models about one squared unit apart: self-weights far below 0."""
    w = torch.eye(10) * math.sqrt(0.5)  # every pair at squared distance 1
    xi = attention_weights(w, alpha_k=1e4, sigma=100.0)
    assert xi.diagonal().max().item() == pytest.approx(1 - 9 * 100 * math.exp(-0.01), rel=1e-9)
    assert xi.diagonal().max().item() < -800


def test_fedamp_attention_cross_check_record_agrees_in_both_forms() -> None:
    """The committed run of scripts/crosscheck_fedamp_attention.py: FLGo's xi and Fling's u_i equal ours."""
    record = json.loads((Path(__file__).parent.parent / "results/crosscheck/fedamp/attention.json").read_text())
    assert record["agree"] is True and set(record["forms"]) == {"cosine", "distance"}
    for form, data in record["forms"].items():
        assert len(data["rounds"]) == 4
        for row in data["rounds"]:
            diffs = [v for k, v in row.items() if k.endswith("diff")]
            assert len(diffs) == (2 if form == "distance" else 1)
            assert max(diffs) <= record["tolerance"]
        assert data["rounds"][-1]["top_partner"] == [1, 0, 3, 2, 5, 4]
