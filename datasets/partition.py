"""Partitioners: who holds which samples. Deterministic from the data seed alone.

Index convention ("pool"): the pool is the source's train split followed by its test split (for
multi-domain data: every domain's train part, then every domain's test part). Each client gets int64 pool
positions for ``train``, ``val`` and ``test``. Train positions are < n_train; test positions are >= n_train
unless a scheme carves the client's test part out of its own training data (``test_mode="holdout"``).

Schemes (``make_partition(scheme, labels, num_clients, seed, **params)``):

================== ==================================================================================
``pathological``   FedCAC (Sec. 4.1): each client draws ``classes_per_client`` classes; ``n_train`` /
                   ``n_test`` samples split equally over them; ``overlap`` lets clients share samples
``dirichlet``      FedCAC (Sec. 4.1): q_i ~ Dir(alpha * 1) (``prior="uniform"``) or Dir(alpha * p)
                   (``prior="class_prior"``); the same q_i sizes the train and the test part
``class_mix``      given class mixes: client i's ``n_train`` / ``n_test`` samples in the proportions of
                   ``mixes[i]`` (one weight per class), as FedCAC's Figs. 1b (4:4:1:1) and 7 (15 chosen mixes)
``shards``         LG-FedAvg / FedRep / FedSelect (Sec. 5): ``shards_per_client`` shards of
                   ``num_users`` users; optional ``train_per_class`` / ``test_per_class`` truncation;
                   ``test_pool="class"``: ``test_per_class`` test samples of each of the client's classes
                   from the class's whole test split (disjoint between clients) instead of its shards
``dirichlet_hsu``  the whole train split over clients, per class Dir(alpha) (Hsu et al., 2019)
``classes_per_client``  ``k`` classes per client, each class's samples shared evenly by its holders
``iid``            train split shuffled and dealt equally
``domain``         ``clients_per_domain`` clients per domain (FedC2I's Digit-5 / Office-10)
================== ==================================================================================

The last four share the train split without overlap; their test part is ``test_mode="matched"`` (test
split shared out in each client's train class proportions) or ``"holdout"`` (``test_fraction`` of the
client's own data). ``val_fraction`` then moves a class-stratified share of each client's train part
into ``val``. Every bad parameter raises :class:`PartitionError` naming it, its value and the fix, and so does a
federation of more clients than training samples (before anything is drawn).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from common.registry import Registry


class PartitionError(ValueError):
    """A partition parameter is invalid or cannot be satisfied by the data."""


@dataclass(frozen=True)
class ClientSplit:
    train: torch.Tensor  # int64 pool positions
    val: torch.Tensor
    test: torch.Tensor


@dataclass(frozen=True)
class Partition:
    clients: tuple[ClientSplit, ...]
    scheme: str
    params: dict
    seed: int

    def to_state(self) -> dict:
        return {"scheme": self.scheme, "params": self.params, "seed": self.seed,
                "clients": [{"train": c.train, "val": c.val, "test": c.test} for c in self.clients]}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Partition:
        clients = tuple(ClientSplit(c["train"], c["val"], c["test"]) for c in state["clients"])
        return cls(clients, state["scheme"], dict(state["params"]), int(state["seed"]))


@dataclass(frozen=True)
class LabelInfo:
    """What a partitioner sees of the data."""

    train_labels: torch.Tensor
    test_labels: torch.Tensor
    num_classes: int
    train_domains: torch.Tensor | None = None
    test_domains: torch.Tensor | None = None
    domain_names: tuple[str, ...] = ()


Parts = list[tuple[np.ndarray, np.ndarray]]  # per client: (train pool positions, test pool positions)


@dataclass(frozen=True)
class Scheme:
    draw: Callable[[PartitionData, int, np.random.Generator, dict], Parts]
    defaults: dict


PARTITIONERS: Registry[Scheme] = Registry("partition scheme")
TEST_MODES = ("matched", "holdout")
SHARD_TEST_POOLS = ("shard", "class")  # shards: a client's test samples from its shards, or from its classes' splits


def scheme(name: str, **defaults: Any) -> Callable:
    """Register ``draw(data, num_clients, rng, params)`` under ``name`` with its parameter defaults."""

    def decorate(draw: Callable) -> Callable:
        PARTITIONERS.register(name)(Scheme(draw, defaults))
        return draw

    return decorate


def fail(param: str, value: Any, fix: str) -> PartitionError:
    return PartitionError(f"partition.{param}={value!r} is invalid: {fix}")


class PartitionData:
    """What a scheme's draw function is given: the labels as numpy arrays plus per-class position lists (pool
    positions: test positions start after the ``n_train`` train samples)."""

    def __init__(self, labels: LabelInfo) -> None:
        self.y_train = labels.train_labels.cpu().numpy().astype(np.int64)
        self.y_test = labels.test_labels.cpu().numpy().astype(np.int64)
        self.n_train = len(self.y_train)
        self.num_classes = labels.num_classes
        self.train_by_class = [np.flatnonzero(self.y_train == c) for c in range(self.num_classes)]
        self.test_by_class = [np.flatnonzero(self.y_test == c) + self.n_train for c in range(self.num_classes)]
        self.d_train = None if labels.train_domains is None else labels.train_domains.cpu().numpy()
        self.d_test = None if labels.test_domains is None else labels.test_domains.cpu().numpy()
        self.domain_names = labels.domain_names

    def label(self, positions: np.ndarray) -> np.ndarray:
        pool = np.concatenate([self.y_train, self.y_test])
        return pool[positions]


# ------------------------------------------------------------------------------- shared checks
def _positive_int(p: dict, key: str, minimum: int = 1) -> int:
    value = p[key]
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < minimum:
        raise fail(key, value, f"it must be an integer >= {minimum}")
    return int(value)


def _optional_count(p: dict, key: str) -> int | None:
    return None if p[key] is None else _positive_int(p, key)


def _fraction(p: dict, key: str, low_open: bool = False) -> float:
    value = p[key]
    ok = isinstance(value, int | float) and (0 < value < 1 if low_open else 0 <= value < 1)
    if not ok:
        raise fail(key, value, f"it must be in {'(0, 1)' if low_open else '[0, 1)'}")
    return float(value)


def _alpha(p: dict) -> float:
    if not isinstance(p["alpha"], int | float) or not p["alpha"] > 0 or not math.isfinite(p["alpha"]):
        raise fail("alpha", p["alpha"], "the Dirichlet concentration must be a finite number > 0")
    return float(p["alpha"])


def _choice(p: dict, key: str, allowed: Sequence[str]) -> str:
    if p[key] not in allowed:
        raise fail(key, p[key], f"use one of {list(allowed)}")
    return p[key]


# -------------------------------------------------------------------- FedCAC-style fixed sizes
def _split_evenly(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class _Sampler:
    """Draws per-class samples; with ``overlap`` clients draw independently (with replacement only when a client
    needs more of a class than it has, as FedCAC's code), otherwise from what is left."""

    def __init__(self, by_class: list[np.ndarray], overlap: bool, what: str, param: str) -> None:
        self.left = [c.copy() for c in by_class]
        self.overlap, self.what, self.param = overlap, what, param

    def take(self, rng: np.random.Generator, cls: int, count: int, client: int, value: Any) -> np.ndarray:
        pool = self.left[cls]
        if count > len(pool) and self.overlap and len(pool):
            # FedCAC's code (Fling, fling/utils/data_utils/sampling.py: dirichlet_sampling and pathological_sampling)
            # draws a class with replacement when a client needs more of it than the class has
            # (replace=(select_num > len(idxs_classes[j]))): Tiny-ImageNet's 50 test images per class under Dir(0.01).
            # Only here, where a draw without replacement is impossible, so every other partition is unchanged.
            return pool[rng.choice(len(pool), size=count, replace=True)]
        if count > len(pool):
            have = "has" if self.overlap else "has left"
            raise fail(self.param, value, f"client {client} needs {count} {self.what} samples of class {cls} but "
                       f"the class {have} {len(pool)}; lower {self.param}"
                       + ("" if self.overlap else " or set partition.overlap=true"))
        chosen = rng.choice(len(pool), size=count, replace=False)
        picked = pool[chosen]
        if not self.overlap:
            self.left[cls] = np.delete(pool, chosen)
        return picked


def _fixed_size_parts(data: PartitionData, num_clients: int, rng: np.random.Generator, p: dict,
                      class_counts: Callable[[int], tuple[np.ndarray, np.ndarray]]) -> Parts:
    overlap = bool(p["overlap"])
    train = _Sampler(data.train_by_class, overlap, "train", "n_train")
    test = _Sampler(data.test_by_class, overlap, "test", "n_test")
    parts = []
    for i in range(num_clients):
        n_tr, n_te = class_counts(i)
        tr = [train.take(rng, c, int(k), i, p["n_train"]) for c, k in enumerate(n_tr) if k]
        te = [test.take(rng, c, int(k), i, p["n_test"]) for c, k in enumerate(n_te) if k]
        parts.append((np.concatenate(tr), np.concatenate(te) if te else np.empty(0, np.int64)))
    return parts


def _check_sizes(p: dict, data: PartitionData, num_clients: int) -> tuple[int, int]:
    n_train, n_test = _positive_int(p, "n_train"), _positive_int(p, "n_test", minimum=0)
    if not p["overlap"]:
        for key, n, avail in (("n_train", n_train, data.n_train), ("n_test", n_test, len(data.y_test))):
            if n * num_clients > avail:
                raise fail(key, n, f"{num_clients} clients x {n} = {n * num_clients} samples exceed the "
                           f"{avail} available without overlap; lower it or set partition.overlap=true")
    return n_train, n_test


@scheme("pathological", classes_per_client=2, n_train=500, n_test=100, overlap=True)
def _pathological(data: PartitionData, num_clients: int, rng: np.random.Generator, p: dict) -> Parts:
    k = _positive_int(p, "classes_per_client")
    if k > data.num_classes:
        raise fail("classes_per_client", k, f"it must be <= the number of classes ({data.num_classes})")
    n_train, n_test = _check_sizes(p, data, num_clients)
    if n_train < k:
        raise fail("n_train", n_train, f"it must be >= classes_per_client ({k})")
    if p["overlap"]:
        need, smallest = math.ceil(n_train / k), min(len(c) for c in data.train_by_class)
        if need > smallest:
            raise fail("n_train", n_train, f"{need} samples per class are needed but the smallest class has "
                       f"{smallest}; lower n_train")

    def counts(_: int) -> tuple[np.ndarray, np.ndarray]:
        classes = rng.choice(data.num_classes, size=k, replace=False)
        n_tr, n_te = np.zeros(data.num_classes, int), np.zeros(data.num_classes, int)
        n_tr[classes], n_te[classes] = _split_evenly(n_train, k), _split_evenly(n_test, k)
        return n_tr, n_te

    return _fixed_size_parts(data, num_clients, rng, p, counts)


def dirichlet_counts(q: np.ndarray, n: int) -> np.ndarray:
    """FedCAC's rounding: round(n q_c) for c < C-1, capped by what is left; the last class gets the rest."""
    counts = np.zeros(len(q), dtype=int)
    left = n
    for c in range(len(q) - 1):
        counts[c] = min(int(round(n * q[c])), left)
        left -= counts[c]
    counts[-1] = left
    return counts


@scheme("dirichlet", alpha=0.1, n_train=500, n_test=100, prior="uniform", overlap=True)
def _dirichlet(data: PartitionData, num_clients: int, rng: np.random.Generator, p: dict) -> Parts:
    alpha = _alpha(p)
    prior = _choice(p, "prior", ("uniform", "class_prior"))
    n_train, n_test = _check_sizes(p, data, num_clients)
    if prior == "uniform":
        concentration = np.full(data.num_classes, alpha)
    else:
        freq = np.array([len(c) for c in data.train_by_class], dtype=float)
        concentration = alpha * freq / freq.sum()
        if (concentration <= 0).any():
            raise fail("prior", prior, "a class has no training sample; use prior=uniform")

    def counts(_: int) -> tuple[np.ndarray, np.ndarray]:
        q = rng.dirichlet(concentration)
        return dirichlet_counts(q, n_train), dirichlet_counts(q, n_test)

    return _fixed_size_parts(data, num_clients, rng, p, counts)


def _mixes(p: dict, data: PartitionData, num_clients: int) -> np.ndarray:
    """``partition.mixes`` as a clients x classes array of weights, checked."""
    mixes = p["mixes"]
    fix = (f"give one list of {data.num_classes} non-negative class weights per client ({num_clients} lists), "
           f"each with a positive sum, e.g. [[4, 0, ..., 4], ...]")
    if not isinstance(mixes, Sequence) or isinstance(mixes, str) or len(mixes) != num_clients:
        raise fail("mixes", mixes, fix)
    try:
        weights = np.array([[float(w) for w in mix] for mix in mixes], dtype=float)
    except (TypeError, ValueError):
        raise fail("mixes", mixes, fix) from None
    if weights.shape != (num_clients, data.num_classes) or not np.isfinite(weights).all() or (weights < 0).any() \
            or (weights.sum(axis=1) <= 0).any():
        raise fail("mixes", mixes, fix)
    return weights


@scheme("class_mix", mixes=None, n_train=500, n_test=100, overlap=True)
def _class_mix(data: PartitionData, num_clients: int, rng: np.random.Generator, p: dict) -> Parts:
    weights = _mixes(p, data, num_clients)
    n_train, n_test = _check_sizes(p, data, num_clients)

    def counts(i: int) -> tuple[np.ndarray, np.ndarray]:
        q = weights[i] / weights[i].sum()
        return dirichlet_counts(q, n_train), dirichlet_counts(q, n_test)

    return _fixed_size_parts(data, num_clients, rng, p, counts)


# ------------------------------------------------------------------------------------- shards
@scheme("shards", shards_per_client=2, num_users=None, train_per_class=None, test_per_class=None, test_pool="shard")
def _shards(data: PartitionData, num_clients: int, rng: np.random.Generator, p: dict) -> Parts:
    s = _positive_int(p, "shards_per_client")
    test_pool = _choice(p, "test_pool", SHARD_TEST_POOLS)
    users = num_clients if p["num_users"] is None else _positive_int(p, "num_users")
    if users < num_clients:
        raise fail("num_users", users, f"it must be >= num_clients ({num_clients}): clients are drawn from users")
    if (s * users) % data.num_classes:
        raise fail("shards_per_client", s, f"shards_per_client x num_users ({s} x {users}) must be divisible by "
                   f"the number of classes ({data.num_classes})")
    per_class = s * users // data.num_classes
    small = min(min(len(c) for c in data.train_by_class), min(len(c) for c in data.test_by_class))
    if per_class > small:
        raise fail("shards_per_client", s, f"{per_class} shards per class but a class has only {small} samples")
    train_cap, test_cap = _optional_count(p, "train_per_class"), _optional_count(p, "test_per_class")
    if test_pool == "class" and test_cap is None:
        raise fail("test_pool", test_pool, "test images drawn from the class's whole test split need a count: set "
                   "partition.test_per_class")
    train_shards = [np.array_split(rng.permutation(c), per_class) for c in data.train_by_class]
    test_shards = [np.array_split(rng.permutation(c), per_class) for c in data.test_by_class]
    order = rng.permutation(data.num_classes * per_class)  # shard ids, dealt s per user
    chosen = np.sort(rng.choice(users, size=num_clients, replace=False))
    parts = []
    for u in chosen:
        ids = order[u * s:(u + 1) * s]
        tr = {}
        te = {}
        for shard in ids:
            c, j = divmod(int(shard), per_class)
            tr.setdefault(c, []).append(train_shards[c][j])
            te.setdefault(c, []).append(test_shards[c][j])
        parts.append((
            np.concatenate([np.concatenate(tr[c])[:train_cap] for c in sorted(tr)]),
            np.concatenate([np.concatenate(te[c])[:test_cap] for c in sorted(te)]),
        ))
    if test_pool == "class":
        classes = [np.unique(data.label(train)) for train, _ in parts]
        tests = _class_pool_tests(data, classes, test_cap, rng)
        parts = [(train, test) for (train, _), test in zip(parts, tests, strict=True)]
    return parts


def _class_pool_tests(data: PartitionData, classes: list[np.ndarray], per_class: int,
                      rng: np.random.Generator) -> list[np.ndarray]:
    """``per_class`` test samples of each of a client's ``classes``, from the class's whole test split and disjoint
    between clients: each class's test split is shuffled once and dealt out in client order."""
    tests: list[list[np.ndarray]] = [[] for _ in classes]
    for c in range(data.num_classes):
        holders = [i for i, held in enumerate(classes) if c in held]
        if not holders:
            continue
        pool = data.test_by_class[c]
        if len(holders) * per_class > len(pool):
            raise fail("test_per_class", per_class, f"{len(holders)} clients hold class {c} and {len(holders)} x "
                       f"{per_class} exceed its {len(pool)} test samples (test_pool=class keeps them disjoint); "
                       "lower test_per_class")
        dealt = rng.permutation(pool)
        for k, i in enumerate(holders):
            tests[i].append(dealt[k * per_class:(k + 1) * per_class])
    return [np.concatenate(t) if t else np.empty(0, np.int64) for t in tests]


# ------------------------------------------------------------------ whole-split partitions
def _test_parts(data: PartitionData, train_parts: list[np.ndarray], rng: np.random.Generator, p: dict) -> Parts:
    mode = _choice(p, "test_mode", TEST_MODES)
    if mode == "holdout":
        frac = _fraction(p, "test_fraction", low_open=True)
        out = []
        for tr in train_parts:
            shuffled = rng.permutation(tr)
            k = int(math.floor(frac * len(tr)))
            out.append((shuffled[k:], shuffled[:k]))
        return out
    # matched: each class's test samples shared out in proportion to the clients' train counts of it
    tests: list[list[np.ndarray]] = [[] for _ in train_parts]
    for c in range(data.num_classes):
        held = np.array([(data.y_train[tr] == c).sum() for tr in train_parts], dtype=float)
        if held.sum() == 0:
            continue
        pool = rng.permutation(data.test_by_class[c])
        quota = held / held.sum() * len(pool)
        counts = np.floor(quota).astype(int)
        for i in np.argsort(-(quota - counts), kind="stable")[: len(pool) - counts.sum()]:
            counts[i] += 1
        for i, piece in enumerate(np.split(pool, np.cumsum(counts)[:-1])):
            tests[i].append(piece)
    return [(tr, np.concatenate(te) if te else np.empty(0, np.int64)) for tr, te in zip(train_parts, tests,
                                                                                           strict=True)]


def _check_test_mode(p: dict) -> None:
    _choice(p, "test_mode", TEST_MODES)
    if p["test_mode"] == "holdout":
        _fraction(p, "test_fraction", low_open=True)


@scheme("dirichlet_hsu", alpha=0.5, min_size=10, max_retries=100, test_mode="matched", test_fraction=0.2)
def _dirichlet_hsu(data: PartitionData, num_clients: int, rng: np.random.Generator, p: dict) -> Parts:
    alpha = _alpha(p)
    min_size, retries = _positive_int(p, "min_size", 0), _positive_int(p, "max_retries")
    _check_test_mode(p)
    if min_size * num_clients > data.n_train:
        raise fail("min_size", min_size, f"{num_clients} clients x {min_size} exceed the {data.n_train} training "
                   "samples; lower min_size or the number of clients")
    for _ in range(retries):
        shares: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for members in data.train_by_class:
            q = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(q) * len(members)).astype(int)[:-1]
            for i, piece in enumerate(np.split(rng.permutation(members), cuts)):
                shares[i].append(piece)
        train = [np.concatenate(s) for s in shares]
        if min(len(t) for t in train) >= min_size:
            return _test_parts(data, train, rng, p)
    raise fail("alpha", alpha, f"no draw in max_retries={retries} gave every client >= min_size={min_size} "
               "samples; raise alpha, lower min_size or use fewer clients")


@scheme("classes_per_client", k=2, test_mode="matched", test_fraction=0.2)
def _classes_per_client(data: PartitionData, num_clients: int, rng: np.random.Generator, p: dict) -> Parts:
    k = _positive_int(p, "k")
    if k > data.num_classes:
        raise fail("k", k, f"it must be <= the number of classes ({data.num_classes})")
    _check_test_mode(p)
    perm = rng.permutation(data.num_classes)
    held = [[int(perm[(i * k + j) % data.num_classes]) for j in range(k)] for i in range(num_clients)]
    shares: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(data.num_classes):
        holders = [i for i in range(num_clients) if c in held[i]]
        if holders:
            for i, piece in zip(holders, np.array_split(rng.permutation(data.train_by_class[c]), len(holders)),
                                strict=True):
                shares[i].append(piece)
    return _test_parts(data, [np.concatenate(s) for s in shares], rng, p)


@scheme("iid", test_mode="matched", test_fraction=0.2)
def _iid(data: PartitionData, num_clients: int, rng: np.random.Generator, p: dict) -> Parts:
    _check_test_mode(p)
    return _test_parts(data, np.array_split(rng.permutation(data.n_train), num_clients), rng, p)


def _first_per_class(positions: np.ndarray, labels: np.ndarray, cap: int | None) -> np.ndarray:
    if cap is None:
        return positions
    keep = [positions[labels == c][:cap] for c in np.unique(labels)]
    return np.sort(np.concatenate(keep))


@scheme("domain", clients_per_domain=1, train_per_class=None, test_per_class=None)
def _domain(data: PartitionData, num_clients: int, rng: np.random.Generator, p: dict) -> Parts:
    if data.d_train is None or data.d_test is None:
        raise fail("scheme", "domain", "the dataset has one domain; list several in dataset.domains")
    per = _positive_int(p, "clients_per_domain")
    domains = len(data.domain_names) or int(data.d_train.max()) + 1
    if num_clients != per * domains:
        raise PartitionError(f"num_clients={num_clients} is invalid: {domains} domains x clients_per_domain="
                             f"{per} gives {per * domains} clients; set num_clients={per * domains}")
    train_cap, test_cap = _optional_count(p, "train_per_class"), _optional_count(p, "test_per_class")
    parts = []
    for d in range(domains):
        tr = np.flatnonzero(data.d_train == d)
        te = np.flatnonzero(data.d_test == d) + data.n_train
        tr = _first_per_class(tr, data.y_train[tr], train_cap)
        te = _first_per_class(te, data.y_test[te - data.n_train], test_cap)
        parts += list(zip(np.array_split(rng.permutation(tr), per), np.array_split(rng.permutation(te), per),
                          strict=True))
    return parts


# -------------------------------------------------------------------------------- entry point
def _val_split(data: PartitionData, train: np.ndarray, frac: float, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Move round(frac * n_c) samples of every class c of ``train`` into val."""
    labels = data.label(train)
    val = []
    for c in np.unique(labels):
        members = rng.permutation(train[labels == c])
        val.append(members[: int(round(frac * len(members)))])
    val_idx = np.concatenate(val) if val else np.empty(0, np.int64)
    return np.setdiff1d(train, val_idx), np.sort(val_idx)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.sort(np.asarray(a, dtype=np.int64)))


def make_partition(scheme: str, labels: LabelInfo, num_clients: int, seed: int, *, val_fraction: float = 0.0,
                   **params: Any) -> Partition:
    """Partition ``labels`` over ``num_clients`` clients with the registered ``scheme`` (see module doc)."""
    spec = PARTITIONERS.get(scheme)
    unknown = set(params) - set(spec.defaults)
    if unknown:
        raise PartitionError(f"partition scheme {scheme!r} has no parameter(s) {sorted(unknown)}; it accepts "
                             f"{sorted(spec.defaults)} (and val_fraction)")
    if not isinstance(num_clients, int | np.integer) or num_clients < 1:
        raise PartitionError(f"num_clients={num_clients!r} is invalid: it must be an integer >= 1")
    frac = _fraction({"val_fraction": val_fraction}, "val_fraction")
    p = {**spec.defaults, **params}
    data = PartitionData(labels)
    if num_clients > data.n_train:  # refused before a draw: some clients would hold no training sample
        raise PartitionError(f"num_clients={num_clients} is invalid: only {data.n_train} training samples, so some "
                             f"clients would have none; use at most {data.n_train} clients or a larger data set")
    rng = np.random.default_rng(np.random.PCG64(seed))
    parts = spec.draw(data, int(num_clients), rng, p)
    val_rng = np.random.default_rng(np.random.PCG64([seed, 1]))
    clients = []
    for train, test in parts:
        train, val = _val_split(data, train, frac, val_rng) if frac else (train, np.empty(0, np.int64))
        clients.append(ClientSplit(_tensor(train), _tensor(val), _tensor(test)))
    return Partition(tuple(clients), scheme, {**p, "val_fraction": frac}, int(seed))
