"""Engine invariants, records and determinism on tiny synthetic federations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from bench.builder import build_experiment, build_worker
from bench.core.data import FederatedData
from bench.core.records import RunDir
from bench.experiment.run import execute, run_dir_for, to_container
from common.verified_io import load_verified
from datasets.augment import build_transform
from datasets.sources import load_source
from tests.helpers import config


def final_state(summary_dir: Path) -> dict:
    return load_verified(summary_dir / "checkpoint.pt")["method"]


def run(tmp_path: Path, *overrides: str) -> tuple[dict, Path]:
    cfg = config(tmp_path, *overrides)
    summary = execute(cfg)
    return summary, run_dir_for(to_container(cfg))


def test_fedavg_with_one_client_equals_that_clients_local_training(tmp_path):
    _, avg_dir = run(tmp_path, "method=fedavg", "num_clients=1", "rounds=4", "train.epochs=2")
    _, loc_dir = run(tmp_path, "method=local", "num_clients=1", "rounds=4", "train.epochs=2")
    assert torch.equal(final_state(avg_dir)["global"], final_state(loc_dir)["models"][0])
    post = [r for r in RunDir(avg_dir).records() if r["kind"] == "eval" and r["stage"] == "post"]
    local_post = [r for r in RunDir(loc_dir).records() if r["kind"] == "eval" and r["stage"] == "post"]
    assert [r["acc"] for r in post] == [r["acc"] for r in local_post]


def shared_data_federation(num_clients: int) -> FederatedData:
    """``num_clients`` clients that all hold the very same 40 training and 20 test samples."""
    train = load_source("synthetic", "train", num_train=40, num_test=20, num_classes=4)
    test = load_source("synthetic", "test", num_train=40, num_test=20, num_classes=4)
    images = torch.cat([train.images, test.images])
    labels = torch.cat([train.labels, test.labels])
    split = {"train": torch.arange(40), "val": torch.arange(0), "test": torch.arange(40, 60)}
    return FederatedData(images, labels, tuple(dict(split) for _ in range(num_clients)), train.classes,
                         build_transform(None), build_transform(None), None, labels)  # type: ignore[arg-type]


def train_on_shared_data(tmp_path: Path, method: str, num_clients: int) -> torch.Tensor:
    # full-batch gradient descent: every client computes the same update (up to summation order)
    cfg = to_container(config(tmp_path, f"method={method}", "rounds=5", "train.batch_size=40", "train.epochs=3"))
    data = shared_data_federation(num_clients)
    experiment = build_experiment(cfg, data=data)
    experiment.engine(RunDir(tmp_path / f"{method}{num_clients}"), "h").run()
    return experiment.method.client_model(0).clone()


def test_fedavg_on_identical_client_data_equals_local_training_on_that_data(tmp_path):
    fedavg = train_on_shared_data(tmp_path, "fedavg", num_clients=3)
    alone = train_on_shared_data(tmp_path, "local", num_clients=1)
    assert not torch.equal(fedavg, build_worker(to_container(config(tmp_path)), 4, 1, 8, torch.device("cpu")).vector)
    torch.testing.assert_close(fedavg, alone, rtol=1e-5, atol=1e-6)


def test_same_config_and_seed_give_byte_identical_records(tmp_path):
    _, first = run(tmp_path / "a", "method=fedprox", "rounds=3")
    _, second = run(tmp_path / "b", "method=fedprox", "rounds=3")
    assert (first / "rounds.jsonl").read_bytes() == (second / "rounds.jsonl").read_bytes()
    assert (first / "summary.json").read_bytes() == (second / "summary.json").read_bytes()
    _, other_seed = run(tmp_path / "c", "method=fedprox", "rounds=3", "seed=1")
    assert (first / "rounds.jsonl").read_bytes() != (other_seed / "rounds.jsonl").read_bytes()


def test_data_seed_is_separate_from_training_seed(tmp_path):
    cfg_a = to_container(config(tmp_path, "seed=0", "data_seed=7"))
    cfg_b = to_container(config(tmp_path, "seed=1", "data_seed=7"))
    assert cfg_a["data_seed"] == cfg_b["data_seed"] == 7
    assert to_container(config(tmp_path, "seed=3"))["data_seed"] == 3  # default follows the seed
    _, a = run(tmp_path, "seed=0", "data_seed=7")
    _, b = run(tmp_path, "seed=1", "data_seed=7")
    test_sizes = [[r["n"] for r in RunDir(d).records() if r["kind"] == "eval"] for d in (a, b)]
    assert test_sizes[0] == test_sizes[1]


def test_a_finished_run_is_reused_not_retrained(tmp_path):
    summary, run_dir = run(tmp_path, "rounds=2")
    before = (run_dir / "rounds.jsonl").stat().st_mtime_ns
    again, _ = run(tmp_path, "rounds=2")
    assert again == summary
    assert (run_dir / "rounds.jsonl").stat().st_mtime_ns == before


def test_record_schema_and_eval_schedule(tmp_path):
    summary, run_dir = run(tmp_path, "rounds=5", "eval.every=2", "participation=0.5")
    records = RunDir(run_dir).records()
    train = [r for r in records if r["kind"] == "train"]
    assert [r["round"] for r in train] == [1, 2, 3, 4, 5]
    assert all(len(r["clients"]) == 2 for r in train)
    evals = [r for r in records if r["kind"] == "eval"]
    assert sorted({r["round"] for r in evals}) == [2, 4, 5]
    for r in evals:
        assert r["split"] == "test"
        assert len(r["acc"]) == len(r["clients"]) == len(r["n"]) == len(r["loss"])
        assert r["mean_acc"] == pytest.approx(sum(r["acc"]) / len(r["acc"]))
        weighted = sum(a * n for a, n in zip(r["acc"], r["n"], strict=True)) / sum(r["n"])
        assert r["weighted_acc"] == pytest.approx(weighted)
        assert len(r["clients"]) == (2 if r["stage"] == "pre" else 4)
    pre_clients = {r["round"]: r["clients"] for r in evals if r["stage"] == "pre"}
    assert all(pre_clients[t] == next(x["clients"] for x in train if x["round"] == t) for t in pre_clients)
    post = {r["round"]: r["mean_acc"] for r in evals if r["stage"] == "post"}
    assert summary["primary"]["acc"] == max(post.values())
    assert summary["protocol"] == {"stage": "post", "selection": "best", "weighting": "unweighted"}
    finals = [r for r in summary["results"] if r["selection"] == "final"]
    assert {r["round"] for r in finals} == {5}


def test_validation_split_gives_best_by_validation(tmp_path):
    summary, run_dir = run(tmp_path, "rounds=4", "partition.val_fraction=0.25", "eval.primary.selection=best_val")
    val = [r for r in RunDir(run_dir).records() if r["kind"] == "eval" and r["split"] == "val"]
    assert val and all(sum(r["n"]) > 0 for r in val)
    post_val = {r["round"]: r["mean_acc"] for r in val if r["stage"] == "post"}
    best_round = max(sorted(post_val), key=lambda t: (post_val[t], -t))
    assert summary["primary"]["selection"] == "best_val"
    assert summary["primary"]["round"] == best_round
    assert summary["primary"]["val_acc"] == post_val[best_round]


def test_best_val_without_validation_split_is_refused(tmp_path):
    with pytest.raises(ValueError, match="val_fraction"):
        execute(config(tmp_path, "eval.primary.selection=best_val"))


def test_fedprox_with_mu_zero_is_fedavg_and_mu_pulls_towards_the_global_model(tmp_path):
    _, avg = run(tmp_path, "method=fedavg", "rounds=2")
    _, prox0 = run(tmp_path, "method=fedprox", "method.mu=0.0", "rounds=2")
    _, prox = run(tmp_path, "method=fedprox", "method.mu=5.0", "rounds=2")
    init = build_worker(to_container(config(tmp_path)), 4, 1, 8, torch.device("cpu")).vector
    g_avg, g0, g = (final_state(d)["global"] for d in (avg, prox0, prox))
    assert torch.equal(g_avg, g0)
    assert (g - init).norm() < (g_avg - init).norm()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("method.name=fedsomething", "unknown method 'fedsomething'"),
        ("participation=0", "participation=0"),
        ("rounds=0", "rounds=0"),
        ("eval.primary.stage=middle", "eval.primary.stage='middle'"),
        ("+method.gamma=3", "no hyperparameter"),
        ("model.name=vgg99", "unknown model 'vgg99'"),
        ("partition.scheme=zigzag", "unknown partition scheme 'zigzag'"),
        ("+partition.colour=red", r"has no parameter\(s\) \['colour'\]"),
    ],
)
def test_bad_config_is_refused_before_any_work(tmp_path, override, message):
    with pytest.raises((ValueError, KeyError), match=message):
        execute(config(tmp_path, override))
    assert not (tmp_path / "runs").exists()


def test_missing_hyperparameter_names_the_config_file(tmp_path):
    with pytest.raises(ValueError, match=r"needs hyperparameter\(s\) \['mu'\]"):
        execute(config(tmp_path, "method=fedprox", "~method.mu"))


def test_summary_json_is_labelled_with_protocols(tmp_path):
    summary, run_dir = run(tmp_path, "rounds=2")
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk == summary and on_disk["complete"] is True
    assert on_disk["model"] == yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["name"]
    counts = (run_dir / "partition" / "class_counts.csv").read_text().splitlines()
    assert len(counts) == 1 + 4 * 3 and (run_dir / "partition" / "partition.png").exists()
    protocols = {(r["stage"], r["selection"], r["weighting"]) for r in on_disk["results"]}
    assert protocols == {(s, sel, w) for s in ("pre", "post") for sel in ("final", "best")
                         for w in ("unweighted", "weighted")}


def test_local_answers_pre_protocols_with_its_post_results(tmp_path):
    summary = execute(config(tmp_path, "method=local", "rounds=2", "eval.primary.stage=pre"))
    by = {(r["stage"], r["selection"], r["weighting"]): r for r in summary["results"]}
    assert by[("pre", "final", "unweighted")]["acc"] == by[("post", "final", "unweighted")]["acc"]
    assert summary["primary"]["stage"] == "pre"


def test_federation_without_capacities_gives_every_client_capacity_one():
    from tests.helpers import federation

    fed = federation(nn.Linear(2, 2), 3)
    assert fed.capacities.dtype == torch.float64 and fed.capacities.tolist() == [1.0, 1.0, 1.0]


def test_plain_sgd_takes_torchs_sgd_steps_bit_for_bit():
    """Local training's plain SGD (no momentum, weight decay or Nesterov, on the CPU) gives the parameters of
    torch.optim.SGD bit for bit, a frozen parameter (no gradient) left as it is; any other setting, or another
    optimizer, is torch's."""
    from bench.core.method import PlainSGD, local_optimizer
    from bench.core.models import build_model

    torch.manual_seed(0)
    models = [build_model("cnn_fedavg", num_classes=10, in_channels=1, image_size=28) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    x, y = torch.rand(20, 1, 28, 28), torch.randint(0, 10, (20,))
    plain = {"optimizer": "sgd", "momentum": 0.0, "weight_decay": 0.0, "nesterov": False}
    optimizers = []
    for model, make in zip(models, (local_optimizer, lambda p, cfg, lr: torch.optim.SGD(p, lr=lr)), strict=True):
        model.head.weight.requires_grad_(False)
        optimizers.append(make(list(model.parameters()), plain, 0.37))  # the frozen one's gradient stays None
        for _ in range(3):
            optimizers[-1].zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            optimizers[-1].step()
    assert isinstance(optimizers[0], PlainSGD)
    for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(p.view(torch.int32), q.view(torch.int32))
    assert not torch.equal(models[0].body[0].weight, build_model(
        "cnn_fedavg", num_classes=10, in_channels=1, image_size=28).body[0].weight)  # it trained
    params = list(models[0].parameters())
    others = ({"momentum": 0.9}, {"weight_decay": 1e-4}, {"momentum": 0.9, "nesterov": True}, {"optimizer": "adam"})
    for other in others:
        assert isinstance(local_optimizer(params, {**plain, **other}, 0.1), torch.optim.Optimizer), other


def test_plain_sgd_does_not_import_torchs_compiler():
    """Local training with plain SGD leaves torch._dynamo unimported (torch's optimizers import it, 0.9 CPU s)."""
    import subprocess
    import sys

    code = ("import sys, torch\nfrom bench.core.method import local_optimizer\n"
            "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3)\n"
            "opt = local_optimizer([p], {'optimizer': 'sgd'}, 0.5); opt.step(); opt.zero_grad()\n"
            "assert float(p[0]) == 0.5 and p.grad is None\nprint('torch._dynamo' in sys.modules)")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
