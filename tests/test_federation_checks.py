"""Impossible federations are refused before anything starts (more clients than training samples, a client left
without training or test samples), participation always selects a client, and the partition report stays fast for
any number of clients while the reports of the existing federations stay byte for byte what they were."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from bench.builder import build_experiment, check_clients_nonempty
from bench.core.data import build_federated_data
from bench.experiment.compose import compose_config
from bench.experiment.run import execute, partition_report, to_container
from datasets.partition import LabelInfo, PartitionError, make_partition
from datasets.partition_cache import cached_partition
from datasets.partition_report import MAX_DRAWN_CLIENTS, class_counts, partition_label, render_partition_report
from methods.fedavg import FedAvg
from tests.helpers import config
from tests.test_partition import LABELS, POOL

pytestmark = pytest.mark.reliability


def test_a_hundred_thousand_clients_on_digits_are_refused_within_seconds(tmp_path: Path):
    started = time.monotonic()
    with pytest.raises(ValueError, match="num_clients=100000 is invalid: only 1442 training samples"):
        execute(config(tmp_path, "dataset=digits", "num_clients=100000", f"cache_dir={tmp_path / 'cache'}"))
    assert time.monotonic() - started < 15  # about a second: digits are loaded, no partition is drawn
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_more_clients_than_training_samples_are_refused_by_every_scheme():
    for scheme, params in (("pathological", {}), ("dirichlet", {}), ("iid", {}), ("classes_per_client", {}),
                           ("shards", {"shards_per_client": 1})):
        with pytest.raises(PartitionError, match="num_clients=1001 is invalid: only 1000 training samples"):
            make_partition(scheme, LABELS, 1001, 0, **params)


class CopesWithEmptyClients(FedAvg):
    empty_splits = frozenset({"train", "test"})


def test_a_client_without_train_or_test_samples_is_refused_unless_the_method_copes():
    sizes = {"train": [5, 0, 3, 0], "test": [2, 2, 0, 2]}
    with pytest.raises(ValueError, match=r"leaves 2 of 4 clients without train samples \(client 1, 3\), which "
                                         "method FedAvg cannot handle: use fewer clients"):
        check_clients_nonempty(sizes, FedAvg, "dirichlet_hsu")
    with pytest.raises(ValueError, match=r"leaves 1 of 4 clients without test samples \(client 2\)"):
        check_clients_nonempty({**sizes, "train": [1] * 4}, FedAvg, "iid")
    check_clients_nonempty(sizes, CopesWithEmptyClients, "iid")


def test_a_refused_partition_is_not_cached(tmp_path: Path):
    def refuse(_: object) -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        cached_partition(tmp_path, "toy", "iid", LABELS, 4, 0, accept=refuse)
    assert not list(tmp_path.rglob("*.pt"))
    cached_partition(tmp_path, "toy", "iid", LABELS, 4, 0)
    with pytest.raises(ValueError, match="refused"):  # a cached one is checked too
        cached_partition(tmp_path, "toy", "iid", LABELS, 4, 0, accept=refuse)


def test_any_participation_selects_at_least_one_client(tmp_path: Path):
    engine = build_experiment(to_container(config(tmp_path, "participation=0.01"))).engine()
    assert engine.num_participants == 1 and len(engine.participants(1)) == 1


#: sha256 of class_counts.csv and partition.png of small federations, rendered at 39840a6 (before the summary
#: figure); partition.pdf embeds its creation time, so it differs between any two renderings
REPORTS = {
    ("dataset=synthetic", "partition=pathological", "num_clients=4"): (
        "bd0e0ccca3b55fab184f98d017e1eabece77304d4921ff0f41b4755e3abd9335",
        "0f0a1e49a1828922ee34b9c4aac68286aa5ff31c7106217acc3a38e4d5bbaf45"),
    ("dataset=digits", "num_clients=20"): (
        "06478239dfc6a6deb8ea4f7ce78e782e899003373e2afa0d39a85e7814f0cf25",
        "e4afb822b036b0095fe2c9f5c060d3d55097c7a5b86fd585272a0b905057141c"),
    ("dataset=digits", "num_clients=150", "partition=iid"): (
        "fddacb64eac4de96c7d7b43a0f8a1dd9704c1d920af83cb8d19802ecb1b99385",
        "591ae7f1ab77604f2bbea13d985fcdddcc1157215a6db5e4ed94ad3a56d1cfd0"),
}


@pytest.mark.parametrize("overrides", list(REPORTS), ids=[" ".join(o) for o in REPORTS])
def test_the_report_of_a_small_federation_is_byte_identical(overrides: tuple[str, ...]):
    cfg = to_container(compose_config([*overrides, "cache_dir=null"]))  # conf/config.yaml's defaults
    data = build_federated_data(cfg["dataset"], cfg["partition"], num_clients=cfg["num_clients"], data_seed=0)
    files = partition_report(data, f"{cfg['dataset']['name']}: {partition_label(cfg['partition'])}")
    digests = tuple(hashlib.sha256(files[name]).hexdigest() for name in ("class_counts.csv", "partition.png"))
    assert digests == REPORTS[overrides]


def loop_class_counts(partition, pool_labels: torch.Tensor, num_classes: int) -> pd.DataFrame:
    """The report's counts one client and part at a time, as computed at 39840a6."""
    rows = []
    for cid, client in enumerate(partition.clients):
        for part in ("train", "val", "test"):
            idx = getattr(client, part)
            counts = torch.bincount(pool_labels[idx], minlength=num_classes).tolist()
            rows.append({"client": cid, "part": part, **{f"class_{c}": n for c, n in enumerate(counts)},
                         "total": int(idx.numel())})
    return pd.DataFrame(rows).set_index(["client", "part"])


@pytest.mark.parametrize(("scheme", "params"), [("pathological", {"n_train": 40, "n_test": 10}),
                                                ("dirichlet_hsu", {"alpha": 0.3}), ("iid", {"test_mode": "holdout"}),
                                                ("shards", {"shards_per_client": 2, "num_users": 20})])
def test_class_counts_equal_the_per_client_loop(scheme: str, params: dict):
    partition = make_partition(scheme, LABELS, 10, 3, val_fraction=0.2, **params)
    fast, slow = class_counts(partition, POOL, 10), loop_class_counts(partition, POOL, 10)
    assert fast.to_csv() == slow.to_csv()
    pd.testing.assert_frame_equal(fast, slow)


def test_a_large_federation_gets_a_summary_figure_quickly():
    labels = LabelInfo(torch.arange(100_000) % 10, torch.arange(20_000) % 10, 10)
    partition = make_partition("iid", labels, 20_000, 0)
    started = time.monotonic()
    files = render_partition_report(partition, torch.cat([labels.train_labels, labels.test_labels]), 10)
    assert time.monotonic() - started < 20  # about 1.5 s; a dot per client took minutes
    assert len(files["class_counts.csv"].decode().splitlines()) == 1 + 3 * 20_000
    assert len(files["partition.png"]) < 200_000 and MAX_DRAWN_CLIENTS < 20_000


def test_a_tables_pre_launch_check_refuses_a_partition_leaving_a_client_empty(tmp_path: Path):
    from bench.experiment.precheck import _data_problem

    empty = ["partition=dirichlet_hsu", "partition.min_size=0", "partition.alpha=0.05", "num_clients=200"]
    cfg = to_container(config(tmp_path, f"cache_dir={tmp_path / 'cache'}", *empty))
    assert "leaves 98 of 200 clients without train samples" in _data_problem(cfg)
    assert not (tmp_path / "cache").exists()
    fine = to_container(config(tmp_path, f"cache_dir={tmp_path / 'cache'}", *empty[:2], "num_clients=4"))
    assert _data_problem(fine) is None
