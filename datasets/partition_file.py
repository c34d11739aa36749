"""Partitions in and out: the ``from_file`` scheme reads per-client index arrays made elsewhere.

A partition file (format ``pflrepro-partition/1``, described in ``docs/partition_format.md``) lists, per
client, indices into the source's official splits: ``train`` and the optional ``val`` are positions in the
official train split, ``test`` positions in the official test split, and the optional ``test_from_train``
positions in the train split that serve as that client's test data (a hold-out test part). They are not
pool positions: :func:`file_to_parts` and :func:`partition_to_clients` convert between the two.

Both ``.json`` and ``.npz`` are read and written. Indices are sets: their order in the file does not
matter. A sample may appear on several clients (other libraries do that); within one client an index may
not repeat inside a split, nor appear in two of its splits.

The file's sha256 is part of the partition's identity. ``conf/partition/from_file.yaml`` fills
``partition.sha256`` from the file through the ``partition_file_sha256`` resolver, so the partition cache
key and the run directory change with the file's content, not only with its path; the scheme refuses a
file whose content no longer matches that hash.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import OmegaConf

from common.verified_io import atomic_write_bytes
from datasets.partition import Partition, PartitionError, fail, scheme

if TYPE_CHECKING:
    from datasets.partition import PartitionData

FORMAT = "pflrepro-partition/1"
SUFFIXES = (".npz", ".json")
#: per-client keys: required, then optional
REQUIRED = ("train", "test")
OPTIONAL = ("val", "test_from_train")
KEYS = REQUIRED + OPTIONAL
#: which official split each key indexes
SPLIT_OF = {"train": "train", "val": "train", "test": "test", "test_from_train": "train"}
RESOLVER = "partition_file_sha256"

_NPZ_CLIENT = re.compile(r"client(\d+)_(train|val|test|test_from_train)")
_NPZ_OTHER = ("format", "num_clients", "dataset", "meta")
_JSON_TOP = ("format", "num_clients", "dataset", "clients", "meta")
_EMPTY = np.empty(0, dtype=np.int64)
_EMPTY.setflags(write=False)


@dataclass(frozen=True)
class FileClient:
    """One client's indices, relative to the official splits (see the module doc)."""

    train: np.ndarray
    test: np.ndarray
    val: np.ndarray = field(default_factory=lambda: _EMPTY)
    test_from_train: np.ndarray = field(default_factory=lambda: _EMPTY)

@dataclass(frozen=True)
class PartitionFile:
    """A parsed partition file: its clients, the optional dataset name and free-form metadata."""

    clients: tuple[FileClient, ...]
    dataset: str | None = None
    meta: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------- hashing
def _read_bytes(path: str | Path) -> bytes:
    p = Path(path).expanduser()
    if p.suffix.lower() not in SUFFIXES:
        raise fail("path", str(path), f"a partition file must end in .npz or .json, not {p.suffix or '(none)'!r}")
    if not p.is_file():
        raise fail("path", str(path), f"the partition file {p} does not exist (relative paths are taken from "
                   f"the working directory {Path.cwd()}); give an existing .npz or .json file, e.g. one written "
                   "by `python -m bench.experiment.partition export <run_dir>`")
    return p.read_bytes()


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of the file's bytes; raises PartitionError naming the file when it is missing."""
    return hashlib.sha256(_read_bytes(path)).hexdigest()


if not OmegaConf.has_resolver(RESOLVER):
    OmegaConf.register_new_resolver(RESOLVER, file_sha256)


# ---------------------------------------------------------------------------------------- reading
def _bad(path: str | Path, problem: str, fix: str) -> PartitionError:
    return fail("path", str(path), f"{problem}; {fix}")


def _index_array(path: str | Path, values: Any, cid: int, key: str) -> np.ndarray:
    """``values`` as int64 after checking they are a flat list/array of integers."""
    where = f"client {cid} {key!r}"
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise _bad(path, f"{where} has shape {values.shape}", "store a 1-D integer array per client and split")
        if values.dtype.kind not in "iu":
            raise _bad(path, f"{where} holds non-integer values (dtype {values.dtype})",
                       "indices must be integers (store an int64 array)")
        return values.astype(np.int64)
    if not isinstance(values, list):
        raise _bad(path, f"{where} is a {type(values).__name__}", "give a list of integer indices")
    for j, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _bad(path, f"{where} holds the non-integer value {v!r} at position {j}",
                       "indices must be integers (e.g. 17, not 17.0 or \"17\")")
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _check_client(path: str | Path, cid: int, client: FileClient, sizes: Mapping[str, int | None]) -> None:
    for key in KEYS:
        idx = getattr(client, key)
        split = SPLIT_OF[key]
        n = sizes.get(split)
        if idx.size and n is not None:
            bad = idx[(idx < 0) | (idx >= n)]
            if bad.size:
                raise _bad(path, f"client {cid} {key!r} index {int(bad[0])} is out of range: the official {split} "
                           f"split has {n} samples (valid 0..{n - 1})",
                           f"{key!r} indices are positions in the official {split} split, not pool positions; "
                           "check the file was made for this dataset")
        uniq, counts = np.unique(idx, return_counts=True)
        if (counts > 1).any():
            dup = int(uniq[counts > 1][0])
            raise _bad(path, f"client {cid} {key!r} lists index {dup} {int(counts[counts > 1][0])} times",
                       "list each index at most once per client and split")
    for a, b in (("train", "val"), ("train", "test_from_train"), ("val", "test_from_train")):
        both = np.intersect1d(getattr(client, a), getattr(client, b))
        if both.size:
            raise _bad(path, f"client {cid} has train-split index {int(both[0])} in both {a!r} and {b!r}",
                       "a client's splits must not share samples")


def _parse_json(path: str | Path, raw: bytes) -> tuple[Any, Any, Any, list[dict[str, Any]], Any]:
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise _bad(path, f"it is not valid JSON ({err})", "write it with json.dump") from None
    if not isinstance(doc, dict):
        raise _bad(path, "its top level is not a JSON object", f"write {{\"format\": \"{FORMAT}\", ...}}")
    unknown = sorted(set(doc) - set(_JSON_TOP))
    if unknown:
        raise _bad(path, f"it has unknown key(s) {unknown}", f"allowed top-level keys: {list(_JSON_TOP)}")
    clients = doc.get("clients")
    if not isinstance(clients, list) or not all(isinstance(c, dict) for c in clients):
        raise _bad(path, "it has no 'clients' list of objects", "give \"clients\": [{\"train\": [...], "
                   "\"test\": [...]}, ...]")
    return doc.get("format"), doc.get("num_clients"), doc.get("dataset"), clients, doc.get("meta", {})


def _scalar(path: str | Path, arrays: Mapping[str, np.ndarray], key: str) -> Any:
    if key not in arrays:
        return None
    a = arrays[key]
    if a.shape != ():
        raise _bad(path, f"its {key!r} entry has shape {a.shape}", f"store {key!r} as a scalar (np.array(value))")
    return a.item()


def _parse_npz(path: str | Path, raw: bytes) -> tuple[Any, Any, Any, list[dict[str, Any]], Any]:
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise _bad(path, f"it is not a readable .npz archive of plain arrays ({err})",
                   "write it with numpy.savez / savez_compressed, no object arrays") from None
    by_client: dict[int, dict[str, Any]] = {}
    for name, array in arrays.items():
        m = _NPZ_CLIENT.fullmatch(name)
        if m:
            by_client.setdefault(int(m.group(1)), {})[m.group(2)] = array
        elif name not in _NPZ_OTHER:
            raise _bad(path, f"it has the unknown entry {name!r}",
                       f"entries are client<i>_{{{','.join(KEYS)}}} and {list(_NPZ_OTHER)}")
    n = len(by_client)
    if sorted(by_client) != list(range(n)):
        missing = sorted(set(range(max(by_client, default=-1) + 1)) - set(by_client))
        raise _bad(path, f"it has no arrays for client(s) {missing}", "number the clients 0..N-1 without gaps")
    clients = [by_client[i] for i in range(n)]
    meta = _scalar(path, arrays, "meta")
    try:
        meta = json.loads(meta) if isinstance(meta, str) else (meta or {})
    except json.JSONDecodeError:
        meta = {"text": meta}
    return _scalar(path, arrays, "format"), _scalar(path, arrays, "num_clients"), _scalar(path, arrays, "dataset"), \
        clients, meta


def parse_partition_file(path: str | Path, raw: bytes, *, n_train: int | None = None, n_test: int | None = None,
                         num_clients: int | None = None) -> PartitionFile:
    """Parse and check the bytes of a partition file; ``path`` names it in errors and picks the format.
    Indices are range-checked when ``n_train`` / ``n_test`` (sizes of the official splits) are given."""
    suffix = Path(path).suffix.lower()
    fmt, declared, dataset, raw_clients, meta = (_parse_npz if suffix == ".npz" else _parse_json)(path, raw)
    if fmt != FORMAT:
        problem = "it has no 'format' entry" if fmt is None else f"its format tag is {fmt!r}"
        raise _bad(path, problem, f"expected {FORMAT!r} (see docs/partition_format.md)")
    if declared is not None and (isinstance(declared, bool) or not isinstance(declared, int | np.integer)):
        raise _bad(path, f"its num_clients is {declared!r}", "num_clients must be an integer")
    if declared is not None and int(declared) != len(raw_clients):
        raise _bad(path, f"it declares num_clients={declared} but lists {len(raw_clients)} clients",
                   "make num_clients match the clients listed")
    if suffix == ".json" and declared is None:
        raise _bad(path, "it has no 'num_clients' entry", f"add \"num_clients\": {len(raw_clients)}")
    if num_clients is not None and len(raw_clients) != num_clients:
        raise _bad(path, f"it has {len(raw_clients)} clients but the config has num_clients={num_clients}",
                   f"set num_clients={len(raw_clients)}")
    if dataset is not None and not isinstance(dataset, str):
        raise _bad(path, f"its dataset entry is {dataset!r}", "dataset must be a string (or absent)")
    sizes = {"train": n_train, "test": n_test}
    clients = []
    for cid, c in enumerate(raw_clients):
        unknown = sorted(set(c) - set(KEYS))
        if unknown:
            raise _bad(path, f"client {cid} has unknown key(s) {unknown}", f"a client has {list(KEYS)}")
        for key in REQUIRED:
            if key not in c:
                raise _bad(path, f"client {cid} has no {key!r} indices",
                           f"every client needs {list(REQUIRED)} (an empty list is allowed)")
        client = FileClient(**{k: _index_array(path, c[k], cid, k) for k in KEYS if k in c})
        _check_client(path, cid, client, sizes)
        clients.append(client)
    return PartitionFile(tuple(clients), dataset, dict(meta) if isinstance(meta, Mapping) else {"meta": meta})


def read_partition_file(path: str | Path, *, n_train: int | None = None, n_test: int | None = None,
                        num_clients: int | None = None) -> PartitionFile:
    """Read and check a ``.npz`` or ``.json`` partition file (see :func:`parse_partition_file`)."""
    return parse_partition_file(path, _read_bytes(path), n_train=n_train, n_test=n_test, num_clients=num_clients)


# ---------------------------------------------------------------------------------------- writing
def partition_to_clients(partition: Partition, n_train: int) -> list[FileClient]:
    """A partition's pool positions as indices into the official splits (pool = train split, then test)."""
    out = []
    for c in partition.clients:
        test = c.test.cpu().numpy().astype(np.int64)
        out.append(FileClient(train=c.train.cpu().numpy().astype(np.int64), val=c.val.cpu().numpy().astype(np.int64),
                              test=test[test >= n_train] - n_train, test_from_train=test[test < n_train]))
    return out


def _format_of(path: Path, fmt: str | None) -> str:
    suffix = path.suffix.lower().lstrip(".")
    fmt = fmt or suffix or "npz"
    if fmt not in ("npz", "json"):
        raise ValueError(f"format {fmt!r} is not supported: use npz or json")
    if suffix and suffix != fmt:
        raise ValueError(f"{path} ends in .{suffix} but the format is {fmt}; make them agree")
    return fmt


def encode_partition_file(clients: Sequence[FileClient], fmt: str, *, dataset: str | None = None,
                          meta: Mapping[str, Any] | None = None) -> bytes:
    """The bytes of a partition file in ``fmt`` (``npz`` or ``json``); empty optional splits are left out."""
    if fmt == "json":
        head = {"format": FORMAT, "dataset": dataset, "num_clients": len(clients), "meta": dict(meta or {})}
        if dataset is None:
            del head["dataset"]
        rows = []
        for c in clients:
            entry = {k: getattr(c, k).tolist() for k in KEYS if k in REQUIRED or getattr(c, k).size}
            rows.append("    " + json.dumps(entry, separators=(",", ":")))
        body = json.dumps(head, indent=2)[:-2]  # reopen the object to append the clients, one per line
        return (f'{body},\n  "clients": [\n' + ",\n".join(rows) + "\n  ]\n}\n").encode()
    arrays: dict[str, np.ndarray] = {"format": np.array(FORMAT), "num_clients": np.array(len(clients))}
    if dataset is not None:
        arrays["dataset"] = np.array(dataset)
    if meta:
        arrays["meta"] = np.array(json.dumps(dict(meta), sort_keys=True))
    for i, c in enumerate(clients):
        for k in KEYS:
            a = getattr(c, k)
            if k in REQUIRED or a.size:
                arrays[f"client{i}_{k}"] = np.asarray(a, dtype=np.int64)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def write_partition_file(path: str | Path, clients: Sequence[FileClient], *, fmt: str | None = None,
                         dataset: str | None = None, meta: Mapping[str, Any] | None = None) -> Path:
    """Write a partition file atomically; the format comes from ``fmt`` or the suffix (default npz)."""
    path = Path(path)
    fmt = _format_of(path, fmt)
    if not path.suffix:
        path = path.with_suffix(f".{fmt}")
    atomic_write_bytes(path, encode_partition_file(clients, fmt, dataset=dataset, meta=meta))
    return path


# ------------------------------------------------------------------------------------ the scheme
def file_to_parts(pf: PartitionFile, n_train: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per client (train pool positions, test pool positions); test = official test split + hold-out."""
    return [(c.train, np.concatenate([c.test + n_train, c.test_from_train])) for c in pf.clients]


@scheme("from_file", path=None, sha256=None, dataset_name=None)
def _from_file(data: PartitionData, num_clients: int, rng: np.random.Generator,
               p: dict) -> list[tuple[np.ndarray, ...]]:
    """The clients of a partition file; ``sha256`` (filled by the config) pins its content."""
    if p["path"] is None:
        raise fail("path", None, "give the partition file: partition=from_file partition.path=<file.npz|.json>")
    raw = _read_bytes(p["path"])
    digest = hashlib.sha256(raw).hexdigest()
    if p["sha256"] is None:
        raise fail("sha256", None, "the file's content hash is part of the partition's identity; "
                   "conf/partition/from_file.yaml fills it in, and a direct call passes "
                   f"sha256=file_sha256(path) (here {digest})")
    if p["sha256"] != digest:
        raise fail("sha256", p["sha256"], f"the partition file {p['path']} now has sha256 {digest}: it changed since "
                   "the config was resolved; start the run again (or pin the intended file)")
    pf = parse_partition_file(p["path"], raw, n_train=data.n_train, n_test=len(data.y_test), num_clients=num_clients)
    expected = p["dataset_name"]
    if expected is not None and pf.dataset is not None and str(expected).lower() != pf.dataset.lower():
        raise _bad(p["path"], f"it was made for dataset {pf.dataset!r}, not {expected!r}",
                   "use the file made for this dataset, or set partition.dataset_name=null to skip this check")
    with_val = [i for i, c in enumerate(pf.clients) if c.val.size]
    if with_val:
        raise _bad(p["path"], f"client {with_val[0]} has a 'val' split, which from_file cannot keep yet "
                   "(make_partition takes validation data only from partition.val_fraction)",
                   "move the val indices into train and set partition.val_fraction, or drop them")
    return file_to_parts(pf, data.n_train)
