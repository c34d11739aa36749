"""A process that serves many runs (pool worker, runs in turn) reads each data source once: same records."""

from __future__ import annotations

import contextvars
import gc
import threading
import weakref

import pytest
import torch

import bench.core.data as data
from bench.core.data import SharedSources, load_sources, sharing_sources
from bench.experiment.launch import run_in_turn
from bench.experiment.run import execute, run_dir_for, to_container
from datasets import partition_report
from datasets.partition import ClientSplit, Partition
from datasets.partition_report import report_key
from tests.helpers import config

DIGITS = {"source": "digits", "image_size": 8}


def test_inside_sharing_a_source_is_read_once_per_distinct_config(monkeypatch):
    reads = []
    real = data._load_sources
    monkeypatch.setattr(data, "_load_sources", lambda *a: reads.append(a[0]) or real(*a))
    first, _ = load_sources(DIGITS, None)
    again, _ = load_sources(DIGITS, None)
    assert len(reads) == 2 and first[0].images is not again[0].images  # no sharing outside the block
    with sharing_sources(capacity=1) as shared:
        a_train, a_test = load_sources(DIGITS, None)
        b_train, b_test = load_sources(dict(DIGITS), None)
        assert len(reads) == 3 and shared.loads == 1
        assert a_train[0].images is b_train[0].images and a_test[0].labels is b_test[0].labels
        assert a_train is not b_train  # each caller gets its own lists
        load_sources({**DIGITS, "image_size": 16}, None)  # another config: read, and evicts the first (capacity 1)
        load_sources(DIGITS, None)
        assert shared.loads == 3 and len(shared.loaded) == 1
    load_sources(DIGITS, None)
    assert len(reads) == 6  # the block is over: every call reads again


def test_a_failed_read_is_not_kept(tmp_path):
    cfg = {"source": "cifar10"}
    with sharing_sources() as shared:
        for _ in range(2):
            with pytest.raises(Exception, match="cifar-10"):
                load_sources(cfg, str(tmp_path))
        assert shared.loads == 0 and not shared.loaded


def test_bad_capacity_is_named():
    with pytest.raises(ValueError, match="capacity=0 is invalid"):
        SharedSources(0)


def test_runs_in_turn_read_the_source_once_with_the_records_of_separate_processes(tmp_path, monkeypatch):
    cfgs = [to_container(config(tmp_path / label, f"method={m}", f"seed={s}", "dataset=digits"))
            for label in ("alone", "shared") for m, s in (("fedavg", 0), ("local", 0), ("fedavg", 1))]
    alone, shared = cfgs[:3], cfgs[3:]
    for cfg in alone:
        execute(cfg)
    reads, drawn = [], []
    real = data._load_sources
    monkeypatch.setattr(data, "_load_sources", lambda *a: reads.append(a[0]) or real(*a))
    draw = partition_report.render_partition_report  # the tests' runs keep no report cache (cache_dir=null)
    monkeypatch.setattr(partition_report, "render_partition_report", lambda *a, **k: drawn.append(1) or draw(*a, **k))
    outcomes = run_in_turn(shared, [0, 1, 2])
    assert all(o.ok for o in outcomes), outcomes
    assert len(reads) == 1
    assert len(drawn) == 2  # FedAvg and Local on seed 0 share their partition's report; seed 1 has its own
    for a, b in zip(alone, shared, strict=True):
        for name in ("rounds.jsonl", "summary.json", "partition/class_counts.csv", "partition/partition.png"):
            assert (run_dir_for(a) / name).read_bytes() == (run_dir_for(b) / name).read_bytes()
        assert (run_dir_for(b) / "partition" / "partition.pdf").read_bytes().startswith(b"%PDF")


def test_keep_computes_once_per_key_and_holds_the_most_recent(monkeypatch):
    made = []
    shared = SharedSources(1)
    monkeypatch.setattr(SharedSources, "KEPT", 2)
    for key in ("a", "b", "a", "c", "a", "b"):
        assert shared.keep(key, lambda key=key: made.append(key) or key.upper()) == key.upper()
    assert made == ["a", "b", "c", "b"]  # "b" was the least recently used when "c" came


def test_report_key_names_what_the_report_draws():
    labels = torch.arange(12) % 3
    def split(*train):
        return ClientSplit(torch.tensor(train), torch.tensor([], dtype=torch.long), torch.tensor([11]))
    one = Partition((split(0, 1, 2), split(3, 4)), "toy", {}, 0)
    key = report_key(one, labels, 3, title="t")
    assert key == report_key(Partition(one.clients, "toy", {"other": 1}, 5), labels.clone(), 3, title="t")
    assert key != report_key(Partition((split(0, 1), split(2, 3, 4)), "toy", {}, 0), labels, 3, title="t")
    assert key != report_key(one, labels.roll(1), 3, title="t")
    assert key != report_key(one, labels, 3, title="u")
    assert key != report_key(one, labels, 3, title="t", class_names=["x", "y", "z"])


def test_a_block_inside_another_shares_its_cache():
    with sharing_sources() as outer:
        load_sources(DIGITS, None)
        with sharing_sources() as inner:
            assert inner is outer
            load_sources(DIGITS, None)
        assert outer.loads == 1


def test_the_block_frees_its_sources_even_when_a_thread_holds_its_context():
    """A thread started inside the block (W&B starts some) holds a copy of the context until it ends; the cached
    tensors must not live on in it (freed by a daemon thread at interpreter exit, they aborted the process)."""
    release = threading.Event()
    with sharing_sources() as shared:
        train, _ = load_sources(DIGITS, None)
        images = weakref.ref(train[0].images)
        context = contextvars.copy_context()
        holder = threading.Thread(target=context.run, args=(release.wait,), daemon=True)
        holder.start()
        del train
    try:
        gc.collect()
        assert images() is None and not shared.loaded and not shared.kept
    finally:
        release.set()
        holder.join()
