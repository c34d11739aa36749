"""Partitioners: sizes, label proportions, index ranges, determinism, disjointness, every error case."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import torch

import datasets.partition_file  # noqa: F401  (registers the from_file scheme)
from datasets.partition import PARTITIONERS, LabelInfo, PartitionError, dirichlet_counts, make_partition
from datasets.partition_cache import cached_partition
from datasets.partition_report import class_counts, render_partition_report, write_report_files

N_TRAIN, N_TEST, C = 1000, 500, 10
LABELS = LabelInfo(torch.arange(N_TRAIN) % C, torch.arange(N_TEST) % C, C)
POOL = torch.cat([LABELS.train_labels, LABELS.test_labels])

SETTINGS = {
    "pathological": dict(n_train=40, n_test=10),
    "dirichlet": dict(alpha=0.5, n_train=40, n_test=10),
    "class_mix": dict(mixes=[[i % C == c or (i + 3) % C == c for c in range(C)] for i in range(10)], n_train=40,
                      n_test=10),
    "shards": dict(shards_per_client=2, num_users=20),
    "dirichlet_hsu": dict(alpha=0.5),
    "classes_per_client": dict(k=3),
    "iid": {},
}


def labels_of(idx: torch.Tensor) -> torch.Tensor:
    return POOL[idx]


def counts(idx: torch.Tensor) -> np.ndarray:
    return torch.bincount(labels_of(idx), minlength=C).numpy()


def test_every_scheme_has_tests():
    assert set(PARTITIONERS.names()) == set(SETTINGS) | {"domain", "from_file"}  # from_file: test_partition_file.py


@pytest.mark.parametrize("scheme", sorted(SETTINGS))
def test_determinism_and_seed_independence_from_global_rng(scheme):
    a = make_partition(scheme, LABELS, 10, seed=5, **SETTINGS[scheme])
    torch.manual_seed(123)
    np.random.seed(123)
    b = make_partition(scheme, LABELS, 10, seed=5, **SETTINGS[scheme])
    c = make_partition(scheme, LABELS, 10, seed=6, **SETTINGS[scheme])
    pairs = zip(a.clients, b.clients, strict=True)
    same = all(torch.equal(x.train, y.train) and torch.equal(x.test, y.test) for x, y in pairs)
    diff = any(not torch.equal(x.train, y.train) for x, y in zip(a.clients, c.clients, strict=True))
    assert same and diff
    for client in a.clients:
        assert client.train.dtype == torch.int64
        assert bool((client.train < N_TRAIN).all()) and bool((client.test >= N_TRAIN).all())
        assert torch.equal(client.train, client.train.sort().values)


def test_pathological_k_classes_equal_train_test_proportions():
    p = make_partition("pathological", LABELS, 8, 0, classes_per_client=3, n_train=60, n_test=30)
    for client in p.clients:
        tr, te = counts(client.train), counts(client.test)
        assert (tr > 0).sum() == 3 and tr.sum() == 60 and te.sum() == 30
        assert np.array_equal(tr // 20, te // 10) and set(tr[tr > 0]) == {20}
        assert len(set(client.train.tolist())) == 60  # no repeats inside a client


def test_overlap_off_makes_clients_disjoint_and_overlap_on_allows_sharing():
    off = make_partition("pathological", LABELS, 10, 0, n_train=20, n_test=10, overlap=False)
    seen = torch.cat([c.train for c in off.clients])
    assert len(set(seen.tolist())) == seen.numel() == 200
    with pytest.raises(PartitionError, match="has left 0; lower n_train or set partition.overlap=true"):
        make_partition("pathological", LABELS, 10, 0, n_train=100, n_test=50, overlap=False)
    on = make_partition("pathological", LABELS, 10, 0, n_train=100, n_test=50)
    shared = torch.cat([c.train for c in on.clients])
    assert len(set(shared.tolist())) < shared.numel()


def test_dirichlet_counts_rounding_rule():
    assert dirichlet_counts(np.array([0.25, 0.25, 0.5]), 10).tolist() == [2, 2, 6]  # round half to even
    assert dirichlet_counts(np.array([0.7, 0.7, 0.0]), 10).tolist() == [7, 3, 0]  # capped by what is left


def test_dirichlet_sizes_and_same_proportions_in_train_and_test():
    p = make_partition("dirichlet", LABELS, 10, 1, alpha=0.3, n_train=50, n_test=10)
    for client in p.clients:
        tr, te = counts(client.train), counts(client.test)
        assert tr.sum() == 50 and te.sum() == 10
        assert np.abs(tr / 50 - te / 10).max() <= 0.1 + 1e-9  # same q_i, rounded at two sizes
    small = make_partition("dirichlet", LABELS, 30, 1, alpha=0.01, n_train=50, n_test=10)
    assert np.mean([(counts(c.train) > 0).sum() for c in small.clients]) < 2  # alpha -> 0: one class
    prior = make_partition("dirichlet", LABELS, 5, 1, alpha=1.0, n_train=50, n_test=10, prior="class_prior")
    assert prior.params["prior"] == "class_prior"


def test_class_mix_gives_each_client_its_mix_in_train_and_test():
    mixes = [[4, 0, 0, 1, 0, 1, 0, 0, 0, 4], [0, 1, 1, 0, 0, 0, 0, 0, 0, 0], [1] * C]
    p = make_partition("class_mix", LABELS, 3, seed=0, mixes=mixes, n_train=100, n_test=20)
    np.testing.assert_array_equal(counts(p.clients[0].train), [40, 0, 0, 10, 0, 10, 0, 0, 0, 40])
    np.testing.assert_array_equal(counts(p.clients[0].test), [8, 0, 0, 2, 0, 2, 0, 0, 0, 8])
    np.testing.assert_array_equal(counts(p.clients[1].train), [0, 50, 50] + [0] * 7)
    np.testing.assert_array_equal(counts(p.clients[2].train), [10] * C)


@pytest.mark.parametrize("mixes", [None, [[1] * C] * 2, [[1] * (C - 1)] * 3, [[0] * C] * 3, [[-1] + [1] * 9] * 3,
                                   "abc", [["x"] * C] * 3])
def test_class_mix_refuses_mixes_that_do_not_fit_the_clients_and_classes(mixes):
    with pytest.raises(PartitionError, match=r"partition.mixes=.*one list of 10 non-negative class weights per "
                                             r"client \(3 lists\)"):
        make_partition("class_mix", LABELS, 3, 0, mixes=mixes, n_train=40, n_test=10)


def test_shards_assignment_truncation_and_disjointness():
    p = make_partition("shards", LABELS, 10, 0, shards_per_client=2, num_users=20, train_per_class=5,
                       test_per_class=3)
    for client in p.clients:
        tr, te = counts(client.train), counts(client.test)
        assert (tr > 0).sum() in (1, 2)
        assert np.array_equal(tr > 0, te > 0)  # test reuses the class assignment
        assert tr.max() <= 5 and te.max() <= 3
    full = make_partition("shards", LABELS, 20, 0, shards_per_client=2, num_users=20)
    all_train = torch.cat([c.train for c in full.clients])
    assert sorted(all_train.tolist()) == list(range(N_TRAIN))


@pytest.mark.parametrize("scheme", ["dirichlet_hsu", "classes_per_client", "iid"])
def test_whole_split_schemes_are_disjoint_and_matched_test_follows_train(scheme):
    p = make_partition(scheme, LABELS, 10, 0, **SETTINGS[scheme])
    train = torch.cat([c.train for c in p.clients])
    test = torch.cat([c.test for c in p.clients])
    assert len(set(train.tolist())) == train.numel()
    assert len(set(test.tolist())) == test.numel()
    for client in p.clients:
        tr, te = counts(client.train), counts(client.test)
        assert not ((te > 0) & (tr == 0)).any()  # only classes the client trains on
        assert np.abs(te - tr * N_TEST / N_TRAIN).max() < 1  # proportional, largest-remainder rounding


def test_classes_per_client_exact_k():
    p = make_partition("classes_per_client", LABELS, 10, 0, k=3)
    assert all((counts(c.train) > 0).sum() == 3 for c in p.clients)


def test_holdout_test_mode_takes_test_from_the_clients_own_data():
    p = make_partition("iid", LABELS, 5, 0, test_mode="holdout", test_fraction=0.25)
    for client in p.clients:
        assert bool((client.test < N_TRAIN).all())
        assert client.test.numel() == 50 and client.train.numel() == 150
        assert not set(client.test.tolist()) & set(client.train.tolist())


def test_dirichlet_hsu_retries_are_bounded():
    with pytest.raises(PartitionError, match="max_retries=3"):
        make_partition("dirichlet_hsu", LABELS, 50, 0, alpha=0.001, min_size=19, max_retries=3)
    p = make_partition("dirichlet_hsu", LABELS, 10, 0, alpha=1.0, min_size=30)
    assert min(c.train.numel() for c in p.clients) >= 30


def test_validation_split_is_stratified_and_disjoint():
    p = make_partition("pathological", LABELS, 4, 0, n_train=40, n_test=10, val_fraction=0.25)
    for client in p.clients:
        assert client.val.numel() == 10 and client.train.numel() == 30
        assert not set(client.val.tolist()) & set(client.train.tolist())
        assert np.array_equal(counts(client.val) > 0, counts(client.train) > 0)
    assert p.params["val_fraction"] == 0.25


def test_domain_scheme():
    train_dom = torch.arange(N_TRAIN) // 500
    test_dom = torch.arange(N_TEST) // 250
    info = LabelInfo(LABELS.train_labels, LABELS.test_labels, C, train_dom, test_dom, ("a", "b"))
    p = make_partition("domain", info, 4, 0, clients_per_domain=2, train_per_class=10)
    assert len(p.clients) == 4
    for i, client in enumerate(p.clients):
        domain = i // 2
        assert bool((train_dom[client.train] == domain).all())
        assert bool((test_dom[client.test - N_TRAIN] == domain).all())
    assert sum(c.train.numel() for c in p.clients[:2]) == 10 * C  # first 10 per class of domain a
    first = torch.cat([c.train for c in p.clients[:2]]).sort().values
    assert first.tolist() == list(range(100))  # "the first n per class" in original order
    with pytest.raises(PartitionError, match="num_clients=3"):
        make_partition("domain", info, 3, 0, clients_per_domain=2)
    with pytest.raises(PartitionError, match="one domain"):
        make_partition("domain", LABELS, 1, 0)


@pytest.mark.parametrize(
    ("scheme", "kwargs", "clients", "message"),
    [
        ("dirichlet", dict(alpha=0.0), 4, "partition.alpha=0.0"),
        ("dirichlet", dict(alpha=-1), 4, "partition.alpha=-1"),
        ("dirichlet_hsu", dict(alpha=float("nan")), 4, "partition.alpha=nan"),
        ("pathological", dict(classes_per_client=11), 4, "partition.classes_per_client=11"),
        ("classes_per_client", dict(k=0), 4, "partition.k=0"),
        ("pathological", dict(n_train=300, n_test=10, overlap=False), 4, "partition.n_train=300"),
        ("pathological", dict(n_train=400, n_test=10), 4, "partition.n_train=400"),
        ("dirichlet", dict(n_train=40, n_test=10, prior="paper"), 4, "partition.prior='paper'"),
        ("pathological", dict(n_train=40, n_test=10), 0, "num_clients=0"),
        ("shards", dict(shards_per_client=3, num_users=7), 4, "partition.shards_per_client=3"),
        ("shards", dict(num_users=2), 4, "partition.num_users=2"),
        ("iid", dict(test_mode="both"), 4, "partition.test_mode='both'"),
        ("iid", dict(test_mode="holdout", test_fraction=1.0), 4, "partition.test_fraction=1.0"),
        ("iid", dict(colour="red"), 4, r"no parameter\(s\) \['colour'\]"),
        ("dirichlet_hsu", dict(min_size=200), 10, "partition.min_size=200"),
    ],
)
def test_bad_parameters_raise_one_clear_error(scheme, kwargs, clients, message):
    with pytest.raises(PartitionError, match=message):
        make_partition(scheme, LABELS, clients, 0, **kwargs)


def test_bad_val_fraction_and_unknown_scheme():
    with pytest.raises(PartitionError, match="partition.val_fraction=1.5"):
        make_partition("iid", LABELS, 2, 0, val_fraction=1.5)
    with pytest.raises(KeyError, match="unknown partition scheme 'zig'"):
        make_partition("zig", LABELS, 2, 0)


def _cached(args: tuple) -> list[list[int]]:
    cache_dir, seed = args
    p = cached_partition(cache_dir, "toy", "dirichlet", LABELS, 10, seed, alpha=0.5, n_train=40, n_test=10)
    return [c.train.tolist() for c in p.clients]


def test_cache_round_trip_and_concurrent_writers(tmp_path):
    direct = [c.train.tolist() for c in
              make_partition("dirichlet", LABELS, 10, 3, alpha=0.5, n_train=40, n_test=10).clients]
    with mp.get_context("spawn").Pool(4) as pool:
        results = pool.map(_cached, [(str(tmp_path), 3)] * 8)
    assert all(r == direct for r in results)
    files = list((tmp_path / "partitions").rglob("*.pt"))
    assert len(files) == 1 and not list((tmp_path / "partitions").rglob("*.tmp"))
    files[0].write_bytes(b"torn")  # a corrupt file is recomputed, not trusted
    assert _cached((str(tmp_path), 3)) == direct
    assert _cached((str(tmp_path), 4)) != direct
    assert len(list((tmp_path / "partitions").rglob("*.pt"))) == 2


def test_report_counts_and_plot(tmp_path):
    p = make_partition("pathological", LABELS, 6, 0, n_train=40, n_test=10, val_fraction=0.25)
    table = class_counts(p, POOL, C)
    assert table.loc[(0, "train"), "total"] == 30 and table.loc[(0, "val"), "total"] == 10
    assert table.xs("test", level="part")["total"].tolist() == [10] * 6
    paths = write_report_files(render_partition_report(p, POOL, C, title="toy"), tmp_path)
    assert paths["png"].stat().st_size > 1000 and paths["pdf"].exists()
    csv = paths["csv"].read_text().splitlines()
    assert csv[0].startswith("client,part,class_0") and len(csv) == 1 + 6 * 3


def test_cache_key_follows_the_scheme_code(tmp_path, monkeypatch):
    """Editing a scheme's draw function (a user's plug-in, say) must not serve partitions cached by the old
    code: the cache key holds the draw function's source."""
    import dataclasses

    from datasets import partition as partition_module
    from datasets.partition_cache import partition_key, scheme_code

    key = partition_key("toy", "dirichlet", {"alpha": 0.5}, 10, 0, 0.0, "labels")
    assert key == partition_key("toy", "dirichlet", {"alpha": 0.5}, 10, 0, 0.0, "labels")
    original = partition_module.PARTITIONERS.get("dirichlet")

    def edited(data, num_clients, rng, p):  # same name, other code
        return original.draw(data, num_clients, rng, p)

    monkeypatch.setitem(partition_module.PARTITIONERS._entries, "dirichlet", dataclasses.replace(original, draw=edited))
    assert scheme_code("dirichlet") != scheme_code("shards")
    assert partition_key("toy", "dirichlet", {"alpha": 0.5}, 10, 0, 0.0, "labels") != key


def test_report_cache_serves_the_drawn_bytes_and_redraws_a_damaged_file(tmp_path, monkeypatch):
    from datasets import partition_report as report

    p = make_partition("pathological", LABELS, 6, 0, n_train=40, n_test=10)
    drawn = report.cached_partition_report(tmp_path, p, POOL, C, title="toy")
    fresh = report.render_partition_report(p, POOL, C, title="toy")
    assert [drawn[n] for n in ("class_counts.csv", "partition.png")] == [fresh[n] for n in ("class_counts.csv",
                                                                                           "partition.png")]
    (cached,) = (tmp_path / "partition_reports").rglob("*.pt")
    calls = []
    real = report.render_partition_report
    monkeypatch.setattr(report, "render_partition_report", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert report.cached_partition_report(tmp_path, p, POOL, C, title="toy") == drawn and not calls  # served
    report.cached_partition_report(tmp_path, p, POOL, C, title="other")  # another title: another report
    q = make_partition("pathological", LABELS, 6, 1, n_train=40, n_test=10)
    assert report.cached_partition_report(tmp_path, q, POOL, C, title="toy")["class_counts.csv"] != drawn[
        "class_counts.csv"] and len(calls) == 2  # another partition: drawn
    cached.write_bytes(b"torn")
    with pytest.warns(RuntimeWarning, match="unusable"):
        assert report.cached_partition_report(tmp_path, p, POOL, C, title="toy")["partition.png"] == drawn[
            "partition.png"]
    assert len(calls) == 3
    report.cached_partition_report(tmp_path, p, POOL, C, title="toy")
    assert len(calls) == 3  # the redrawn report was written back
    report.cached_partition_report(None, p, POOL, C, title="toy")  # no cache: drawn each time
    assert len(calls) == 4


def test_a_cached_report_imports_neither_matplotlib_nor_pandas(tmp_path):
    import subprocess
    import sys

    code = (f"import sys, torch\nfrom datasets.partition import LabelInfo, make_partition\n"
            f"from datasets.partition_report import cached_partition_report\n"
            f"labels = LabelInfo(torch.arange(60) % 3, torch.arange(30) % 3, 3)\n"
            f"p = make_partition('dirichlet', labels, 4, 0, alpha=0.5)\n"
            f"files = cached_partition_report({str(tmp_path)!r}, p, torch.cat([labels.train_labels, "
            f"labels.test_labels]), 3, title='t')\n"
            f"print(sorted(m for m in ('matplotlib', 'pandas') if m in sys.modules))\n")
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert first.stdout.split("\n")[-2] == "['matplotlib', 'pandas']"  # drawn
    assert second.stdout.split("\n")[-2] == "[]"  # served from the cache
