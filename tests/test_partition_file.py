"""Partitions in and out: ``partition=from_file`` and ``python -m bench.experiment.partition export``
(docs/partition_format.md).

A run's partition exported and fed back is the same partition; JSON and NPZ read the same; the file's hash
is part of the partition's identity; every bad file fails naming the file, the problem and the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.experiment.compose import compose_config, to_container
from bench.experiment.partition import export, load_run_config, rebuild_partition
from bench.experiment.run import run_dir_for, validate
from datasets.partition import LabelInfo, Partition, PartitionError, make_partition
from datasets.partition_cache import cached_partition
from datasets.partition_file import (
    FORMAT,
    KEYS,
    FileClient,
    file_sha256,
    partition_to_clients,
    read_partition_file,
    write_partition_file,
)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
TINY = ["dataset=synthetic", "model=small_cnn", "num_clients=4", "rounds=1", "train.epochs=1", "train.batch_size=10",
        "quiet=true", "logger.wandb.mode=disabled", "threads=1", "cache_dir=null"]

N_TRAIN, N_TEST, C = 1000, 500, 10
LABELS = LabelInfo(torch.arange(N_TRAIN) % C, torch.arange(N_TEST) % C, C)


def cli(module: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def only_run(out_dir: Path) -> Path:
    runs = [p.parent for p in out_dir.rglob("config.yaml")]
    assert len(runs) == 1, runs
    return runs[0]


def index_sets(partition: Partition) -> list[dict[str, set[int]]]:
    return [{k: set(getattr(c, k).tolist()) for k in ("train", "val", "test")} for c in partition.clients]


def split_sets(client: FileClient) -> dict[str, set[int]]:
    """A file client's splits as sets of ints."""
    return {k: {int(i) for i in getattr(client, k)} for k in KEYS}


def from_file(path: Path, num_clients: int, **params) -> Partition:
    return make_partition("from_file", LABELS, num_clients, 0, path=str(path), sha256=file_sha256(path), **params)


def write_json(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def doc(clients: list[dict], **top) -> dict:
    return {"format": FORMAT, "num_clients": len(clients), "clients": clients, **top}


# ------------------------------------------------------------------------------------ round trip
@pytest.mark.slow
def test_exported_run_partition_fed_back_gives_the_same_partition(tmp_path):
    cli("bench.experiment.run", *TINY, "partition=pathological", f"out_dir={tmp_path / 'a'}")
    run_a = only_run(tmp_path / "a")
    assert "wrote" in cli("bench.experiment.partition", "export", str(run_a))
    exported = run_a / "partition" / "partition.npz"
    assert exported.is_file()

    cli("bench.experiment.run", *TINY, "partition=from_file", f"partition.path={exported}", f"out_dir={tmp_path / 'b'}")
    run_b = only_run(tmp_path / "b")
    conf_b = load_run_config(run_b)
    assert conf_b["partition"]["scheme"] == "from_file"
    assert conf_b["partition"]["sha256"] == file_sha256(exported)

    # the two runs' partitions, rebuilt from their configs: the same per-client index sets
    part_a, pool, n_train, _ = rebuild_partition(load_run_config(run_a))
    part_b, _, _, _ = rebuild_partition(conf_b)
    assert index_sets(part_a) == index_sets(part_b)
    trains = [s["train"] for s in index_sets(part_a)]
    assert any(a & b for i, a in enumerate(trains) for b in trains[i + 1:]), "overlap=true shares samples"
    assert (run_a / "partition" / "class_counts.csv").read_bytes() == \
        (run_b / "partition" / "class_counts.csv").read_bytes()

    # and run b exports the file run a exported (as JSON this time)
    cli("bench.experiment.partition", "export", str(run_b), "--format", "json", "--out", str(tmp_path / "b.json"))
    a_file, b_file = read_partition_file(exported), read_partition_file(tmp_path / "b.json")
    assert [split_sets(c) for c in a_file.clients] == [split_sets(c) for c in b_file.clients]
    assert a_file.dataset == b_file.dataset == "synthetic"
    assert a_file.meta["n_train"] == n_train and a_file.meta["n_test"] == pool.numel() - n_train

    # export refuses to write a partition that no longer matches the run's recorded class counts
    csv = run_a / "partition" / "class_counts.csv"
    csv.write_text(csv.read_text().replace(",40\n", ",41\n", 1))
    with pytest.raises(ValueError, match="does not match"):
        export(run_a, tmp_path / "stale.npz")


@pytest.mark.parametrize("scheme,params", [
    ("pathological", dict(n_train=40, n_test=10)),            # overlapping clients, test from the test split
    ("iid", dict(test_mode="holdout", test_fraction=0.2)),    # test held out of the train split
    ("dirichlet_hsu", dict(alpha=0.5)),                       # whole train split, matched test
])
def test_json_and_npz_read_back_the_same_partition(tmp_path, scheme, params):
    original = make_partition(scheme, LABELS, 5, 3, **params)
    clients = partition_to_clients(original, N_TRAIN)
    if params.get("test_mode") == "holdout":
        assert all(c.test.size == 0 and c.test_from_train.size for c in clients)
    paths = [write_partition_file(tmp_path / "p.npz", clients, dataset="toy"),
             write_partition_file(tmp_path / "p", clients, fmt="json", dataset="toy")]
    assert paths[1] == tmp_path / "p.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sharing samples between clients is allowed, without a warning
        read = [from_file(p, 5) for p in paths]
    for part in read:
        assert index_sets(part) == index_sets(original)
        for a, b in zip(part.clients, original.clients, strict=True):
            assert torch.equal(a.train, b.train) and torch.equal(a.test, b.test) and a.train.dtype == torch.int64
    assert json.loads(paths[1].read_text())["clients"][0]["train"] == clients[0].train.tolist()


def test_file_indices_are_split_positions_and_order_free(tmp_path):
    f = write_json(tmp_path / "p.json", doc([{"train": [5, 1, 3], "test": [0, 499]}, {"train": [5, 2], "test": []}]))
    p = from_file(f, 2)
    assert p.clients[0].train.tolist() == [1, 3, 5]
    assert p.clients[0].test.tolist() == [N_TRAIN, N_TRAIN + N_TEST - 1]  # test index j -> pool n_train + j
    assert p.clients[1].test.numel() == 0 and p.clients[1].val.numel() == 0
    carved = from_file(write_json(tmp_path / "v.json", doc([{"train": list(range(100)), "test": [1]}])), 1,
                       val_fraction=0.2)
    assert carved.clients[0].val.numel() == 20 and carved.clients[0].train.numel() == 80


# ------------------------------------------------------------------------------- identity / cache
def test_config_fills_the_hash_and_two_files_at_one_path_never_share_a_run_or_cache_entry(tmp_path):
    path = tmp_path / "split.json"
    first = doc([{"train": [0, 1], "test": [0]}, {"train": [2], "test": [1]}, {"train": [3], "test": [2]},
                 {"train": [4], "test": [3]}])
    write_json(path, first)
    overrides = [*TINY, "partition=from_file", f"partition.path={path}", f"out_dir={tmp_path / 'runs'}"]
    conf = to_container(compose_config(overrides))
    validate(conf)
    assert conf["partition"] == {"scheme": "from_file", "path": str(path), "sha256": file_sha256(path),
                                 "dataset_name": "synthetic", "val_fraction": 0.0}
    params = {k: v for k, v in conf["partition"].items() if k not in ("scheme", "val_fraction")}
    params["dataset_name"] = None
    cached = cached_partition(tmp_path / "cache", "toy", "from_file", LABELS, 4, 0, **params)
    assert cached.clients[0].train.tolist() == [0, 1]

    second = json.loads(json.dumps(first))
    second["clients"][0]["train"] = [7, 8]
    write_json(path, second)
    conf2 = to_container(compose_config(overrides))
    assert conf2["partition"]["sha256"] != conf["partition"]["sha256"]
    assert run_dir_for(conf2) != run_dir_for(conf)
    # the old hash (a stale config) is refused rather than served from the cache or recomputed silently
    with pytest.raises(PartitionError, match="changed since the config was resolved"):
        make_partition("from_file", LABELS, 4, 0, **params)
    params2 = {**params, "sha256": conf2["partition"]["sha256"]}
    assert cached_partition(tmp_path / "cache", "toy", "from_file", LABELS, 4, 0, **params2
                            ).clients[0].train.tolist() == [7, 8]
    assert len(list((tmp_path / "cache").rglob("*.pt"))) == 2


def test_missing_file_fails_when_the_config_is_resolved(tmp_path):
    missing = tmp_path / "nowhere" / "split.npz"
    with pytest.raises(Exception, match=r"(?s)the partition file .*split\.npz does not exist"):
        to_container(compose_config([*TINY, "partition=from_file", f"partition.path={missing}"]))
    with pytest.raises(Exception, match="Missing mandatory value: partition.path"):
        to_container(compose_config([*TINY, "partition=from_file"]))


# ------------------------------------------------------------------------------------- bad files
def _npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


GOOD = [{"train": [0, 1], "test": [0]}, {"train": [2], "test": [1]}]

BAD_JSON = {
    "wrong format tag": (doc(GOOD, format="flgo-partition/2"), r"its format tag is 'flgo-partition/2'.*expected "
                         r"'pflrepro-partition/1'"),
    "num_clients vs config": (doc([*GOOD, {"train": [3], "test": [2]}]),
                              "it has 3 clients but the config has num_clients=2; set num_clients=3"),
    "num_clients vs listed": ({**doc(GOOD), "num_clients": 5}, "it declares num_clients=5 but lists 2 clients"),
    "train out of range": (doc([GOOD[0], {"train": [2, N_TRAIN], "test": [1]}]),
                           r"client 1 'train' index 1000 is out of range: the official train split has 1000 "
                           r"samples \(valid 0..999\)"),
    "test given as pool position": (doc([GOOD[0], {"train": [2], "test": [N_TRAIN + 1]}]),
                                    r"client 1 'test' index 1001 is out of range: the official test split has "
                                    r"500 samples.*not pool positions"),
    "negative index": (doc([{"train": [-1], "test": [0]}, GOOD[1]]), "client 0 'train' index -1 is out of range"),
    "duplicate in a split": (doc([GOOD[0], {"train": [2], "test": [7, 3, 7]}]),
                             "client 1 'test' lists index 7 2 times; list each index at most once"),
    "float index": (doc([{"train": [0, 1.0], "test": [0]}, GOOD[1]]),
                    "client 0 'train' holds the non-integer value 1.0 at position 1"),
    "string index": (doc([{"train": [0], "test": ["3"]}, GOOD[1]]),
                     "client 0 'test' holds the non-integer value '3' at position 0"),
    "bool index": (doc([{"train": [True], "test": [0]}, GOOD[1]]), "client 0 'train' holds the non-integer value True"),
    "missing test": (doc([{"train": [0]}, GOOD[1]]), "client 0 has no 'test' indices"),
    "unknown client key": (doc([{"train": [0], "tests": [0], "test": [0]}, GOOD[1]]),
                           r"client 0 has unknown key\(s\) \['tests'\]"),
    "no format": ({k: v for k, v in doc(GOOD).items() if k != "format"}, "it has no 'format' entry"),
    "train shared with val": (doc([{"train": [0, 1], "val": [1], "test": [0]}, GOOD[1]]),
                              "client 0 has train-split index 1 in both 'train' and 'val'"),
    "val in the file": (doc([{"train": [0, 1], "val": [2], "test": [0]}, GOOD[1]]),
                        r"client 0 has a 'val' split, which from_file cannot keep yet.*partition.val_fraction"),
    "other dataset": (doc(GOOD, dataset="cifar10"), r"it was made for dataset 'cifar10', not 'toy'.*dataset_name=null"),
}


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_bad_json_file_names_file_problem_and_fix(tmp_path, case):
    content, problem = BAD_JSON[case]
    f = write_json(tmp_path / "bad.json", content)
    with pytest.raises(PartitionError, match=r"(?s)partition\.path='.*bad\.json' is invalid: " + problem):
        from_file(f, 2, dataset_name="toy")


BAD_NPZ = {
    "wrong format tag": (dict(format=np.array("other/1"), client0_train=np.arange(2), client0_test=np.arange(1)),
                         "its format tag is 'other/1'"),
    "no format": (dict(client0_train=np.arange(2), client0_test=np.arange(1)), "it has no 'format' entry"),
    "float array": (dict(format=np.array(FORMAT), client0_train=np.array([0.0, 1.0]), client0_test=np.arange(1)),
                    r"client 0 'train' holds non-integer values \(dtype float64\)"),
    "test out of range": (dict(format=np.array(FORMAT), client0_train=np.arange(2), client0_test=np.array([N_TEST])),
                          "client 0 'test' index 500 is out of range: the official test split has 500 samples"),
    "duplicate": (dict(format=np.array(FORMAT), client0_train=np.array([4, 4]), client0_test=np.arange(1)),
                  "client 0 'train' lists index 4 2 times"),
    "gap in clients": (dict(format=np.array(FORMAT), client1_train=np.arange(2), client1_test=np.arange(1)),
                       r"it has no arrays for client\(s\) \[0\]"),
    "num_clients vs config": (dict(format=np.array(FORMAT), num_clients=np.array(1), client0_train=np.arange(2),
                                   client0_test=np.arange(1)), "it has 1 clients but the config has num_clients=2"),
    "unknown entry": (dict(format=np.array(FORMAT), client0_train=np.arange(2), client0_test=np.arange(1),
                           client0_valid=np.arange(1)), "it has the unknown entry 'client0_valid'"),
}


@pytest.mark.parametrize("case", sorted(BAD_NPZ))
def test_bad_npz_file_names_file_problem_and_fix(tmp_path, case):
    arrays, problem = BAD_NPZ[case]
    f = _npz(tmp_path / "bad.npz", **arrays)
    clients = 1 if case in ("wrong format tag", "no format", "float array", "test out of range", "duplicate",
                            "unknown entry") else 2
    with pytest.raises(PartitionError, match=r"(?s)partition\.path='.*bad\.npz' is invalid: " + problem):
        from_file(f, clients)


def test_unreadable_missing_or_unhashed_files(tmp_path):
    not_json = tmp_path / "broken.json"
    not_json.write_text("{\"format\": ")
    with pytest.raises(PartitionError, match=r"broken\.json' is invalid: it is not valid JSON"):
        from_file(not_json, 1)
    not_npz = tmp_path / "broken.npz"
    not_npz.write_bytes(b"not a zip")
    with pytest.raises(PartitionError, match=r"broken\.npz' is invalid: it is not a readable \.npz archive"):
        from_file(not_npz, 1)
    missing = tmp_path / "missing.npz"
    for call in (lambda: file_sha256(missing),
                 lambda: make_partition("from_file", LABELS, 1, 0, path=str(missing), sha256="0" * 64)):
        with pytest.raises(PartitionError, match=r"missing\.npz' is invalid: the partition file .* does not exist"):
            call()
    with pytest.raises(PartitionError, match=r"must end in \.npz or \.json, not '\.txt'"):
        file_sha256(tmp_path / "split.txt")
    good = write_json(tmp_path / "good.json", doc([{"train": [0], "test": [0]}]))
    with pytest.raises(PartitionError, match=r"partition\.sha256=None is invalid: the file's content hash is part"):
        make_partition("from_file", LABELS, 1, 0, path=str(good))
    with pytest.raises(PartitionError, match=r"partition\.path=None is invalid: give the partition file"):
        make_partition("from_file", LABELS, 1, 0)
    with pytest.raises(ValueError, match="ends in .json but the format is npz"):
        write_partition_file(tmp_path / "x.json", [FileClient(np.arange(2), np.arange(1))], fmt="npz")
