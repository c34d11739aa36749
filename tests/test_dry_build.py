"""Dry build (``bench.experiment.table --dry-run``): every paper cell's partition at every scale, from the data or the
official label counts; the partitions that built before the short-class and ``test_pool`` changes are unchanged."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.core.data import load_sources, sharing_sources, source_labels
from bench.experiment.cells import run_cells
from bench.experiment.compose import sharing_compositions
from bench.experiment.precheck import FROM_COUNTS, dry_build
from bench.experiment.run import validate
from bench.experiment.spec import SCALES, cell_config, expand, load_spec, scale_block
from bench.experiment.table import main as table_main
from datasets.label_counts import LABEL_COUNTS, label_info_from_counts
from datasets.partition import LabelInfo, Partition, PartitionError, make_partition

pytestmark = pytest.mark.slow  # builds every paper cell's experiment

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "conf" / "paper"
SPECS = sorted(p.relative_to(PAPER) for p in [*PAPER.glob("*/table*.yaml"), *PAPER.glob("*/fig*.yaml")])
#: cells the dry build cannot check without FedBN's files (no published per-class counts): FedC2I at paper scale
UNCHECKED = ("fedc2i",)


def test_every_paper_spec_is_covered():
    every = sorted(p.relative_to(PAPER) for p in PAPER.glob("*/*.yaml")
                   if not p.name.startswith("_") and p.name != "claims.yaml")
    assert every == SPECS


@pytest.fixture(scope="module")
def shared() -> Iterator[None]:
    """One composition cache and one source cache (with the labels derived from them) for all specs."""
    with sharing_compositions(), sharing_sources(capacity=8):
        yield


@pytest.mark.parametrize("path", SPECS, ids=str)
def test_every_paper_cell_builds_at_every_scale(path: Path, shared: None, tmp_path: Path) -> None:
    spec = load_spec(PAPER / path)
    for scale in SCALES:
        if scale != "paper" and not scale_block(spec, scale):
            continue
        cells = expand(spec, scale, out_dir=str(tmp_path / "runs"))
        configs = {}
        for cell in cells:
            configs[cell] = cell_config(cell, spec, scale)
            validate(configs[cell], check_device=False)
        report = dry_build(cells, configs)
        assert not report.problems, f"{path} at {scale}:\n" + "\n".join(report.problems)
        if report.unchecked:
            assert path.parts[0] in UNCHECKED and scale == "paper", report.summary()
        else:
            assert sum(report.built.values()) >= 1
    assert not (tmp_path / "runs").exists()  # nothing written


IMPOSSIBLE = """
paper: fedselect
table: "9"
title: toy
protocol: {stage: pre, selection: final, weighting: unweighted}
seeds: [0, 1]
base: [num_clients=10, quiet=true]
columns:
  - {name: fine, dataset: cifar10, model: small_cnn, overrides: [partition=shards, partition.num_users=100]}
  - {name: too many shards, dataset: cifar10, model: small_cnn,
     overrides: [partition=shards, partition.shards_per_client=4, partition.num_users=3000]}
rows:
  - {name: FedAvg, overrides: [method=fedavg]}
"""


def test_an_impossible_cell_fails_the_dry_build_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = tmp_path / "toy.yaml"
    spec.write_text(IMPOSSIBLE)
    cache = tmp_path / "cache"
    code = table_main([str(spec), "--scale", "paper", "--dry-run", "--out-dir", str(tmp_path / "runs"), "--",
                       f"data_root={tmp_path / 'no-data'}", f"cache_dir={cache}"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "2 of 4 cells cannot be built" in err
    for seed in (0, 1):  # 4 x 3000 / 10 = 1200 shards per class, CIFAR-10 has 1000 test images per class
        assert f"- FedAvg | too many shards | seed {seed}: partition.shards_per_client=4 is invalid" in err
    assert "| fine |" not in err and "(labels from label counts)" in err
    assert "2 distinct partitions built (0 from the data, 2 from official label counts)" in out
    assert not cache.exists() and not (tmp_path / "runs").exists()  # a dry build writes nothing


# ------------------------------------------------------------------------------------------- label counts
def _counts(info: LabelInfo) -> list[list[int]]:
    return [np.bincount(info.train_labels.numpy()).tolist(), np.bincount(info.test_labels.numpy()).tolist()]


@pytest.mark.parametrize("name", ["digits", "mnist5k", "fashion_mnist"])
def test_label_counts_of_the_bundled_and_installed_sets_match_their_files(name: str) -> None:
    info = source_labels(*load_sources({"source": name}, None))  # make setup / .ci/run install Fashion-MNIST
    assert _counts(info) == [list(c) for c in LABEL_COUNTS[name]]


def test_label_counts_add_up_to_the_published_sizes() -> None:
    sizes = {"cifar10": (50000, 10000), "cifar100": (50000, 10000), "tiny_imagenet": (100000, 10000),
             "mnist": (60000, 10000), "fashion_mnist": (60000, 10000), "svhn": (73257, 26032), "usps": (7291, 2007),
             "digits": (1442, 355), "mnist5k": (4000, 1000)}
    assert {name: (sum(train), sum(test)) for name, (train, test) in LABEL_COUNTS.items()} == sizes
    two = label_info_from_counts(["mnist", "usps"])  # domains one after another, as a loaded pool
    assert two.train_domains is not None and two.train_domains.bincount().tolist() == [60000, 7291]


# --------------------------------------------------------------------------- partitions that built before
def _labels(train: list[int], test: list[int]) -> LabelInfo:
    return LabelInfo(torch.from_numpy(np.repeat(np.arange(len(train)), train)),
                     torch.from_numpy(np.repeat(np.arange(len(test)), test)), len(train))


def _digest(partition: Partition) -> str:
    h = hashlib.sha256()
    for client in partition.clients:
        for part in (client.train, client.val, client.test):
            h.update(part.numpy().tobytes() + b"|")
    return h.hexdigest()[:16]


C10, TINY = _labels([5000] * 10, [1000] * 10), _labels([500] * 200, [50] * 200)
#: digests computed with the code before this change (commit 1c50eeb): name -> (labels, scheme, clients, seed, params)
BEFORE = {
    "de791e2295f128be": ("counts", C10, "dirichlet", 40, 0, dict(alpha=0.1, n_train=500, n_test=100)),
    "8a624ce7f229c4d5": ("counts", _labels([500] * 100, [100] * 100), "dirichlet", 40, 3,
                         dict(alpha=0.01, n_train=500, n_test=100)),
    "402f2394ff942441": ("counts", TINY, "dirichlet", 40, 1, dict(alpha=0.1, n_train=500, n_test=100)),
    "c0ebc3e2d7c3530b": ("counts", TINY, "pathological", 40, 2, dict(classes_per_client=20, n_train=500, n_test=100)),
    "9cfd780257cc595a": ("counts", C10, "shards", 10, 1, dict(shards_per_client=2, num_users=10, train_per_class=20)),
    "629fbddd25332d29": ("counts", C10, "shards", 10, 2,
                         dict(shards_per_client=4, num_users=100, train_per_class=20, test_per_class=100)),
    "d6cdc95b2b3b9bcd": ("digits", None, "dirichlet", 10, 1, dict(alpha=0.1, n_train=60, n_test=20)),
    "1b849ce5fa5c56e1": ("digits", None, "pathological", 10, 0, dict(classes_per_client=2, n_train=60, n_test=20)),
    "79340057eb621778": ("fashion_mnist", None, "shards", 10, 2,
                         dict(shards_per_client=4, num_users=10, train_per_class=20, test_per_class=None)),
    "e5db9565c506d270": ("fashion_mnist", None, "dirichlet", 20, 0,
                         dict(alpha=0.3, n_train=500, n_test=100, val_fraction=0.2)),
}


@pytest.mark.parametrize("digest", list(BEFORE))
def test_partitions_that_built_before_are_unchanged(digest: str) -> None:
    source, labels, scheme, clients, seed, params = BEFORE[digest]
    if labels is None:  # bundled, or installed by make setup / .ci/run (Fashion-MNIST)
        labels = source_labels(*load_sources({"source": source}, None))
    assert _digest(make_partition(scheme, labels, clients, seed, **params)) == digest


def test_a_short_class_is_drawn_with_replacement_only_where_it_raised() -> None:
    # Tiny-ImageNet, Dir(0.01): some client needs more than the 50 test images of a class (FedCAC Table 2, Fig. 4)
    partition = make_partition("dirichlet", TINY, 40, 0, alpha=0.01, n_train=500, n_test=100)
    pool = torch.cat([TINY.train_labels, TINY.test_labels])
    for client in partition.clients:
        test = client.test.numpy()
        assert len(test) == 100 and len(np.unique(client.train.numpy())) == len(client.train)
        positions, repeats = np.unique(test, return_counts=True)
        short = set(pool[positions[repeats > 1]].tolist())  # classes with a repeated image
        assert all((pool[test] == c).sum() > 50 for c in short)
    assert sum(len(c.test) - len(np.unique(c.test.numpy())) for c in partition.clients) == 293
    with pytest.raises(PartitionError, match="needs 5[0-9]+ test samples of class .* has left"):
        make_partition("dirichlet", TINY, 2, 0, alpha=0.01, n_train=500, n_test=100, overlap=False)


def test_shards_test_pool_class_gives_each_client_test_per_class_of_its_classes_disjointly() -> None:
    params = dict(shards_per_client=4, num_users=100, train_per_class=20, test_per_class=100)
    shard = make_partition("shards", C10, 10, 0, **params)
    pooled = make_partition("shards", C10, 10, 0, **params, test_pool="class")
    pool = torch.cat([C10.train_labels, C10.test_labels])
    every = torch.cat([c.test for c in pooled.clients])
    assert len(every.unique()) == len(every)  # disjoint between clients
    for a, b in zip(shard.clients, pooled.clients, strict=True):
        assert torch.equal(a.train, b.train)  # the training data is the shards'
        classes = pool[a.train].unique()
        assert torch.equal(pool[b.test].bincount(minlength=10)[classes], torch.full((len(classes),), 100))
        assert set(pool[b.test].tolist()) == set(classes.tolist())
    with pytest.raises(PartitionError, match="test_per_class=1001 is invalid: .* exceed its 1000 test samples"):
        make_partition("shards", C10, 10, 0, **{**params, "test_per_class": 1001}, test_pool="class")
    with pytest.raises(PartitionError, match="partition.test_pool='class' is invalid: .* set partition.test_per_class"):
        make_partition("shards", C10, 10, 0, shards_per_client=2, test_pool="class")


def test_fedselect_paper_scale_uses_the_class_pool_and_mini_keeps_its_shards() -> None:
    spec = load_spec(PAPER / "fedselect" / "table1.yaml")
    paper, mini = (cell_config(expand(spec, scale)[0])["partition"] for scale in ("paper", "mini"))
    assert paper["test_pool"] == "class" and paper["test_per_class"] == 100
    assert "test_pool" not in mini  # its config (and run directory) as before
    report = dry_build(cells := expand(spec, "paper", seeds=[0]), {c: cell_config(c) for c in cells})
    assert report.built[FROM_COUNTS] + report.built["data"] == 2 and not report.problems


def test_a_paper_block_may_not_swap_in_stand_ins(tmp_path: Path) -> None:
    spec = tmp_path / "toy.yaml"
    spec.write_text(IMPOSSIBLE + "scales:\n  paper:\n    datasets: {cifar10: digits}\n")
    with pytest.raises(ValueError, match=r"scales.paper sets \['datasets'\]"):
        load_spec(spec)


def test_dry_run_without_precheck_composes_only(tmp_path: Path) -> None:
    spec = tmp_path / "toy.yaml"
    spec.write_text(IMPOSSIBLE)
    cells = expand(load_spec(spec), "paper", out_dir=str(tmp_path / "runs"))
    assert len(run_cells(cells, dry_run=True, precheck=False)) == 4
