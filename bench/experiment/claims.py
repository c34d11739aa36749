"""The claims ledger: a verdict per pre-registered claim of a paper and scale, computed from the run records.

Each paper's claims are data (``conf/paper/<paper>/claims.yaml``, docs/claims.md); the preconditions and their
thresholds are ``conf/claims.yaml``. A claim is a set of comparisons (row A minus row B in a column, or a trend
along a sweep), each paired over seeds; a comparison is tested only where every precondition holds (the stand-in
carries the paper's question, the column has headroom, the rows have converged, the mechanisms ran, the baselines
are sound), otherwise it is ``cannot test`` and says which failed.

The command line that writes the ledgers is :mod:`bench.experiment.ledger`.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.core.records import RunDir, run_config
from bench.experiment.spec import PAPER_DIR, Cell, output_base, output_columns, row_protocol, scale_block
from common.verified_io import atomic_write_text, json_safe, read_jsonl

ROOT = Path(__file__).resolve().parents[2]
THRESHOLDS = ROOT / "conf" / "claims.yaml"
KINDS = ("outperforms", "competitive", "trend")
SHAPES = ("increasing", "decreasing", "flat")
VERDICTS = ("supported", "contradicted", "not resolved", "cannot test")
PAPERS = ("fedcac", "pa3dfl", "fedc2i", "fedselect")
#: the method of a spec's local-only row (headroom) and of its FedAvg row (baseline sound)
LOCAL, FEDAVG = "local", "fedavg"


class ClaimsError(ValueError):
    """A claims file or threshold that cannot be used: the message names the file, the claim and the fix."""


# ------------------------------------------------------------------------------------------------ loading

@functools.cache
def thresholds(path: str | Path = THRESHOLDS) -> dict[str, Any]:
    """``conf/claims.yaml``: the preconditions' thresholds (checked for the keys the ledger reads)."""
    conf = yaml.safe_load(Path(path).read_text()) or {}
    for key in ("confidence", "headroom_points", "convergence", "competitive_margin", "magnitude_factor",
                "baseline", "mechanisms"):
        if key not in conf:
            raise ClaimsError(f"{path}: missing key {key!r} (see docs/claims.md)")
    if not 0 < float(conf["confidence"]) < 1:
        raise ClaimsError(f"{path}: confidence={conf['confidence']!r} must lie in (0, 1), e.g. 0.95")
    return conf


def claims_path(paper: str) -> Path:
    return PAPER_DIR / paper / "claims.yaml"


def load_claims(paper: str, path: str | Path | None = None) -> list[dict[str, Any]]:
    """The claims of ``paper``, each checked against the schema and against its spec's rows and columns."""
    path = Path(path) if path is not None else claims_path(paper)
    if not path.is_file():
        raise ClaimsError(f"{paper}: no claims file {path}; write one (docs/claims.md)")
    data = yaml.safe_load(path.read_text()) or {}
    if data.get("paper") != paper:
        raise ClaimsError(f"{path}: paper={data.get('paper')!r}, expected {paper!r}")
    claims = data.get("claims")
    if not isinstance(claims, list) or not claims:
        raise ClaimsError(f"{path}: 'claims' must be a non-empty list of claims (docs/claims.md)")
    seen = set()
    for claim in claims:
        check_claim(claim, path, seen)
    return claims


def check_claim(claim: dict[str, Any], path: Path, seen: set[str]) -> None:
    where = f"{path}, claim {claim.get('id')!r}"
    cid = claim.get("id")
    if not isinstance(cid, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", cid):
        raise ClaimsError(f"{where}: id must be lower-case letters, digits and '-', e.g. t2-fedcac-beats-fedper")
    if cid in seen:
        raise ClaimsError(f"{where}: id repeats; give every claim its own id")
    seen.add(cid)
    for key in ("quote", "section"):
        if not claim.get(key):
            raise ClaimsError(f"{where}: needs a {key!r}")
    if claim.get("kind") not in KINDS:
        raise ClaimsError(f"{where}: kind={claim.get('kind')!r}; use one of {', '.join(KINDS)}")
    if claim.get("spec") is None:
        if not claim.get("untestable"):
            raise ClaimsError(f"{where}: spec is null; say why no spec builds it in 'untestable:'")
        return
    spec = claim_spec(path.parent.name, claim["spec"], where)
    rows = [r["name"] for r in spec["rows"]]
    columns = paper_column_names(spec)
    named_rows = [claim.get("row"), claim.get("other")] + list(claim.get("rows") or [])
    if isinstance(claim.get("others"), list):
        named_rows += claim["others"]
    elif claim.get("kind") != "trend" and claim.get("others") != "all":
        raise ClaimsError(f"{where}: others={claim.get('others')!r}; give a list of row names or 'all'")
    for name in named_rows:
        if name is not None and name not in rows:
            raise ClaimsError(f"{where}: {name!r} is not a row of {claim['spec']}; rows: {rows}")
    if claim.get("columns") != "all":
        if not isinstance(claim.get("columns"), list):
            raise ClaimsError(f"{where}: columns={claim.get('columns')!r}; give a list of column names or 'all'")
        for name in claim["columns"]:
            if name not in columns:
                raise ClaimsError(f"{where}: {name!r} is not a column of {claim['spec']}; columns: {columns}")
    if claim["kind"] == "trend":
        if claim.get("shape") not in SHAPES:
            raise ClaimsError(f"{where}: shape={claim.get('shape')!r}; use one of {', '.join(SHAPES)}")
        if claim.get("along") == "rows" and len(claim.get("rows") or []) < 2:
            raise ClaimsError(f"{where}: a trend along rows needs 'rows:' with at least two rows, in sweep order")
        if claim.get("along") == "columns" and (not claim.get("row") or claim.get("columns") == "all"):
            raise ClaimsError(f"{where}: a trend along columns needs 'row:' and 'columns:' listed in sweep order")
        if claim.get("along") not in ("rows", "columns"):
            raise ClaimsError(f"{where}: along={claim.get('along')!r}; use rows or columns")
    elif not claim.get("row"):
        raise ClaimsError(f"{where}: needs 'row:' (row A of the comparison)")


@functools.cache
def _spec(paper: str, name: str) -> dict[str, Any]:
    from bench.experiment.spec import load_spec

    return load_spec(PAPER_DIR / paper / f"{name}.yaml")


def claim_spec(paper: str, name: str, where: str) -> dict[str, Any]:
    if not (PAPER_DIR / paper / f"{name}.yaml").is_file():
        raise ClaimsError(f"{where}: spec={name!r} names no file conf/paper/{paper}/{name}.yaml")
    return _spec(paper, name)


def paper_column_names(spec: dict[str, Any]) -> list[str]:
    """The output columns of the paper scale (the names claims use)."""
    return [c.name for c in output_columns(spec, "paper")]


# ------------------------------------------------------------------------------------------------ evidence

@dataclass
class Evidence:
    """What one spec's runs at one scale hold: per (row, output column) the accuracy of each complete seed, the
    collected frame (paper numbers, states), each row's method, and the run directories."""

    spec: dict[str, Any]
    scale: str
    values: dict[tuple[str, str], dict[int, float]]
    frame: Any
    dirs: dict[Cell, Path]
    methods: dict[str, str] = field(default_factory=dict)
    cache: dict[tuple[str, str, str], Any] = field(default_factory=dict, repr=False)

    def memo(self, what: str, row: str, column: str, compute: Any) -> Any:
        """``compute()`` once per (what, row, column)."""
        key = (what, row, column)
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]

    @property
    def columns(self) -> list[str]:
        return [c.name for c in output_columns(self.spec, self.scale)]

    def mean(self, row: str, column: str) -> float:
        seeds = self.values.get((row, column), {})
        return sum(seeds.values()) / len(seeds) if seeds else math.nan

    def state(self, row: str, column: str) -> str:
        hit = self.frame[(self.frame["method"] == row) & (self.frame["column"] == column)]
        return str(hit.iloc[0]["state"]) if len(hit) else ""

    def runs(self, row: str, column: str) -> list[Path]:
        """The complete runs of a row in a column, by seed (judged once)."""
        spec_column = self.spec_column(column)
        return self.memo("runs", row, spec_column, lambda: [
            p for c, p in sorted(self.dirs.items(), key=lambda kv: kv[0].seed)
            if c.row == row and c.column == spec_column and RunDir(p).summary_state() == "complete"])

    def records(self, run: Path) -> list[dict[str, Any]]:
        """A run's round records, read once per evidence."""
        return self.memo("records", str(run), "", lambda: read_jsonl(run / "rounds.jsonl"))

    def spec_column(self, column: str) -> str:
        return next(c.column for c in output_columns(self.spec, self.scale) if c.name == column)

    def client(self, column: str) -> int | None:
        return next(c.client for c in output_columns(self.spec, self.scale) if c.name == column)


def evidence_of(spec: dict[str, Any], scale: str, frame: Any, dirs: dict[Cell, Path]) -> Evidence:
    """The evidence of a collected table (:func:`bench.experiment.collect.collect`'s frame and run directories)."""
    methods = {}
    for cell, path in dirs.items():
        if cell.row not in methods and (path / "config.yaml").exists():
            methods[cell.row] = str(run_config(path).get("method", {}).get("name"))
    return Evidence(spec, scale, frame.attrs["seed_values"], frame, dirs, methods)


def curve(evidence: Evidence, row: str, column: str) -> list[tuple[int, float]]:
    """The row's mean test accuracy per evaluated round over its complete seeds (the row's protocol stage; a
    per-client column: that client's accuracy). A run that stopped early (its early-stopping rule fired) holds its
    last value over the rounds the others still ran."""
    stage = row_protocol(evidence.spec, row)["stage"]
    client = evidence.client(column)
    per_run = []
    for run in evidence.runs(row, column):
        found: dict[str, dict[int, float]] = {}
        for rec in evidence.records(run):
            if rec.get("kind") == "eval" and rec["split"] == "test":
                value = rec["mean_acc"] if client is None else rec["acc"][rec["clients"].index(client)]
                found.setdefault(rec["stage"], {})[rec["round"]] = value
        if found.get(stage) or found.get("post"):
            per_run.append(found.get(stage) or found["post"])
    if not per_run:
        return []
    rounds = sorted(set().union(*per_run))
    out = []
    for r in rounds:
        held = [run[max(k for k in run if k <= r)] for run in per_run if min(run) <= r]
        if len(held) == len(per_run):
            out.append((r, sum(held) / len(held)))
    return out


def convergence(points: Sequence[tuple[int, float]], conf: dict[str, Any]) -> str | None:
    """Why a curve has not converged (None when it has): it gains ``flat_points`` or more over its last
    ``last_fraction`` of evaluated rounds, or it peaks at its last round."""
    if len(points) < 3:
        return "fewer than 3 evaluated rounds"
    window = max(2, math.ceil(conf["last_fraction"] * len(points)))
    start, end = points[-window], points[-1]
    gain = end[1] - start[1]
    if gain >= conf["flat_points"]:
        return f"gains {gain:+.2f} over rounds {start[0]}-{end[0]} (flat: < {conf['flat_points']})"
    if max(v for _, v in points[:-1]) < end[1]:
        return f"peaks at its last round {end[0]} ({end[1]:.2f})"
    return None


def diagnostic(evidence: Evidence, row: str, column: str, conf: dict[str, Any]) -> tuple[bool, str] | None:
    """Whether the row's mechanism ran (its method's diagnostic of ``conf/claims.yaml``'s ``mechanisms``), with
    the value; None when its method declares none."""
    method = evidence.methods.get(row)
    rule = conf["mechanisms"].get(method)
    if rule is None:
        return None

    def late_mean(metric: str) -> tuple[list[float], dict[str, Any]]:
        values, config = [], {}
        for run in evidence.runs(row, column):
            config = run_config(run)
            found = [r for r in evidence.records(run) if r.get("kind") == "method" and metric in r]
            if not found:
                continue
            last = max(r["round"] for r in found)
            late = [r[metric] for r in found if r["round"] > last * (1 - rule["late_fraction"])]
            flat = [sum(v) / len(v) if isinstance(v, list) else v for v in late]
            values.append(sum(flat) / len(flat))
        return values, config

    values, config = late_mean(rule["metric"])
    if not values:
        return False, f"{row}: no {rule['metric']} records (its mechanism cannot be shown)"
    value = sum(values) / len(values)
    kind, threshold = rule["rule"], float(rule["threshold"])
    if kind == "above":
        active, bound = value > threshold, f"needs > {threshold:g}"
    elif kind == "entropy_ratio_below":
        value = value / math.log(int(config["num_clients"]))
        active, bound = value < threshold, f"needs < {threshold:g}"
    elif kind == "fedamp_attention":  # value: the top partner's share of the off-diagonal weight
        selves, _ = late_mean("self_weight_mean")
        own = sum(selves) / len(selves) if selves else float("nan")
        uniform = 1 / (int(config["num_clients"]) - 1)
        ratio = value / uniform
        active = ratio >= threshold and 0 <= own <= 1 - float(rule["self_margin"])
        return active, (f"{row}: {rule['what']} {ratio:.3f} x uniform, self-weight {own:.3f} over the last "
                        f"{rule['late_fraction']:.0%} of rounds (needs >= {threshold:g} x uniform and a self-weight "
                        f"in [0, {1 - float(rule['self_margin']):g}])")
    else:
        raise ClaimsError(f"{THRESHOLDS}: mechanisms.{method}.rule={kind!r}; use above, entropy_ratio_below or "
                          "fedamp_attention")
    return active, f"{row}: {rule['what']} {value:.3f} over the last {rule['late_fraction']:.0%} of rounds ({bound})"


# ------------------------------------------------------------------------------------------------ preconditions

def standin(spec: dict[str, Any], scale: str, column: str) -> str | None:
    """Why the column's data at ``scale`` does not carry the paper's question: None at the paper scale, where the
    scale runs the paper's own data set, or where ``scales.<scale>.measures_paper`` lists it (undeclared is off)."""
    if scale == "paper":
        return None
    block = scale_block(spec, scale)
    dataset = next(c["dataset"] for c in spec["columns"] if c["name"] == column)
    if dataset in (block.get("measures_paper") or []):
        return None
    used = block.get("datasets", {}).get(dataset, dataset)
    if used == dataset:  # the paper's own data (fewer rounds or clients: the convergence and headroom checks)
        return None
    return (f"stand-in: {used} for the paper's {dataset} is not declared to carry the paper's question "
            f"(scales.{scale}.measures_paper)")


def headroom(evidence: Evidence, column: str, conf: dict[str, Any]) -> str | None:
    """Why the column leaves no room for collaboration: its local-only row within ``headroom_points`` of its best
    row (None when it leaves room, or the spec has no local-only row)."""
    local = [r for r, m in evidence.methods.items() if m == LOCAL]
    means = {r["name"]: evidence.mean(r["name"], column) for r in evidence.spec["rows"]}
    means = {r: m for r, m in means.items() if not math.isnan(m)}
    if not local or local[0] not in means:
        return None
    best = max(means, key=means.get)
    gap = means[best] - means[local[0]]
    if gap < conf["headroom_points"]:
        return (f"headroom: {local[0]} {means[local[0]]:.2f} is {gap:.2f} below the best row {best} "
                f"{means[best]:.2f} (needs >= {conf['headroom_points']:g})")
    return None


def baseline(evidence: Evidence, row: str, column: str, conf: dict[str, Any]) -> str | None:
    """Why row B is suspect: it did not train or diverged, or it sits far below FedAvg where the paper has it
    far above."""
    state = evidence.state(row, column)
    if state:
        return f"baseline suspect: {row} {state}"
    fedavg = [r for r, m in evidence.methods.items() if m == FEDAVG and r != row]
    if not fedavg:
        return None
    from bench.experiment.spec import paper_numbers

    paper = paper_numbers(evidence.spec, "paper")
    column_at_paper = paper_column(evidence, column)
    ours, theirs = evidence.mean(row, column) - evidence.mean(fedavg[0], column), None
    if (row, column_at_paper) in paper and (fedavg[0], column_at_paper) in paper:
        theirs = paper[(row, column_at_paper)][0] - paper[(fedavg[0], column_at_paper)][0]
    limits = conf["baseline"]
    if theirs is not None and theirs >= limits["paper_above_points"] and ours < -limits["below_fedavg_points"]:
        return (f"baseline suspect: {row} is {-ours:.2f} below {fedavg[0]} here, {theirs:+.2f} above it in the "
                "paper")
    return None


def tuning_budget(evidence: Evidence, rows: Sequence[str]) -> str | None:
    """Why the rows did not get the same tuning budget: the search their records come from (the table's
    ``<table>.tuning.json``, read into each row's ``searched``) ran different numbers of points for them, an
    unsearched row counting as one (None when every row's budget is the same)."""
    from bench.experiment.tuning import searched_points

    searched = searched_points(evidence.spec)
    points = {row: searched.get(row, 1) for row in rows}
    if len(set(points.values())) <= 1:
        return None
    return "tuning budget: " + ", ".join(f"{row} searched over {n} point{'s' * (n != 1)}" for row, n in points.items())


def paper_column(evidence: Evidence, column: str) -> str:
    """The paper-scale name of an output column (a per-client stand-in column maps by its paper setting)."""
    ours = next(c for c in output_columns(evidence.spec, evidence.scale) if c.name == column)
    if ours.client is None:
        return column
    for c in output_columns(evidence.spec, "paper"):
        if c.column == ours.column and c.client is not None and c.paper.get("setting") == ours.paper.get("setting"):
            return c.name
    return column


def scale_column(evidence: Evidence, name: str) -> str | None:
    """The output column at the evidence's scale that a claim's (paper-scale) column name means; None when it is
    not run at this scale."""
    if name in evidence.columns:
        return name
    for c in output_columns(evidence.spec, "paper"):
        if c.name == name and c.client is not None:
            for ours in output_columns(evidence.spec, evidence.scale):
                if ours.column == c.column and ours.paper.get("setting") == c.paper.get("setting"):
                    return ours.name
    return None


def preconditions(evidence: Evidence, column: str, rows: Sequence[str], others: Sequence[str],
                  mechanism_rows: Sequence[str], conf: dict[str, Any]) -> list[str]:
    """Every failed precondition of a comparison among ``rows`` in ``column`` (empty: it can be tested).
    ``others``: the baselines (row B); ``mechanism_rows``: rows whose mechanism the claim rests on."""
    failed = []
    reason = standin(evidence.spec, evidence.scale, evidence.spec_column(column))
    if reason:
        failed.append(reason)
    missing = [r for r in rows if not evidence.values.get((r, column)) and not evidence.state(r, column)]
    if missing:
        failed.append(f"no runs: {', '.join(missing)}")
    reason = headroom(evidence, column, conf)
    if reason:
        failed.append(reason)
    for row in rows:
        if row in missing:
            continue
        if row not in others and evidence.state(row, column):
            failed.append(f"{row} {evidence.state(row, column)}")
        reason = evidence.memo("convergence", row, column,
                               lambda row=row: convergence(curve(evidence, row, column), conf["convergence"]))
        if reason and evidence.values.get((row, column)):
            failed.append(f"unconverged: {row} {reason}")
        shown = (evidence.memo("diagnostic", row, column, lambda row=row: diagnostic(evidence, row, column, conf))
                 if row in mechanism_rows or row in others else None)
        if shown is not None and not shown[0]:
            failed.append(f"{'inert' if row in mechanism_rows else 'baseline suspect (inert)'}: {shown[1]}")
    reason = evidence.memo("tuning", ",".join(sorted(rows)), "", lambda: tuning_budget(evidence, rows))
    if reason:
        failed.append(reason)
    for row in others:
        if row not in missing:
            reason = baseline(evidence, row, column, conf)
            if reason:
                failed.append(reason)
    return failed


# ------------------------------------------------------------------------------------------------ verdicts

def interval(diffs: Sequence[float], confidence: float) -> tuple[float, float]:
    """Mean and half-width of a two-sided t-interval (nan half-width for one seed)."""
    from scipy.stats import t as student

    mean = sum(diffs) / len(diffs)
    if len(diffs) < 2:
        return mean, math.nan
    std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
    return mean, float(student.ppf(0.5 + confidence / 2, len(diffs) - 1)) * std / math.sqrt(len(diffs))


def judge(diffs: Sequence[float], low_bound: float, paper: float | None, conf: dict[str, Any],
          flat: float | None = None) -> dict[str, Any]:
    """The verdict of one comparison from its per-seed differences: supported when the interval lies above
    ``low_bound`` (0 for outperforms, -margin for competitive; ``flat``: within +-flat), contradicted when it lies
    on the other side, else not resolved; with the magnitude against the paper's difference."""
    mean, half = interval(diffs, float(conf["confidence"]))
    out = {"seeds": len(diffs), "mean_diff": mean, "ci_low": mean - half, "ci_high": mean + half,
           "paper_diff": paper}
    if math.isnan(half):
        return {**out, "verdict": "not resolved", "reason": f"{len(diffs)} seed: no interval"}
    low, high = mean - half, mean + half
    span = f"{mean:+.2f} [{low:+.2f}, {high:+.2f}] over {len(diffs)} seeds"
    if flat is not None:
        if -flat < low and high < flat:
            return {**out, "verdict": "supported", "reason": f"{span}, within +-{flat:g}"}
        if low > flat or high < -flat:
            return {**out, "verdict": "contradicted", "reason": f"{span}, beyond +-{flat:g}"}
        return {**out, "verdict": "not resolved", "reason": f"{span}: these seeds resolve +-{half:.2f}"}
    if low > low_bound and low_bound < 0:  # competitive: the size of A - B is not the claim
        return {**out, "verdict": "supported", "reason": f"{span}, above -{-low_bound:g} (paper {fmt(paper)})"}
    if low > low_bound:
        size = magnitude(mean, low, high, paper, conf, out)
        return {**out, "verdict": "supported", "reason": f"{span}; {size}"}
    if high < low_bound:
        return {**out, "verdict": "contradicted", "reason": f"{span} (paper {fmt(paper)})"}
    return {**out, "verdict": "not resolved",
            "reason": f"{span}: these seeds resolve differences beyond {half:.2f} (paper {fmt(paper)})"}


def fmt(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:+.2f}"


def magnitude(mean: float, low: float, high: float, paper: float | None, conf: dict[str, Any],
              out: dict[str, Any]) -> str:
    """Whether a supported difference matches the paper's in size, written into ``out["magnitude"]``: ``inside``
    (the paper's difference lies in our interval), ``comparable`` (ratio within magnitude_factor), ``sign only``;
    ``no paper number`` where the paper gives none."""
    if paper is None or math.isnan(paper):
        out["magnitude"] = "no paper number"
        return "no paper number to compare the size with"
    if low <= paper <= high:
        out["magnitude"] = "inside"
        return f"the paper's {paper:+.2f} lies inside"
    factor = float(conf["magnitude_factor"])
    ratio = mean / paper if paper else math.inf
    out["magnitude"] = "comparable" if 1 / factor <= ratio <= factor else "sign only"
    return (f"gap to the paper's {paper:+.2f}: {mean - paper:+.2f} (ratio {ratio:.1f}"
            + (")" if out["magnitude"] == "comparable" else f", beyond x{factor:g}: sign only)"))


def comparisons(claim: dict[str, Any], evidence: Evidence, conf: dict[str, Any]) -> list[dict[str, Any]]:
    """The claim's comparisons at the evidence's scale, each with its verdict, reason and failed
    preconditions."""
    from bench.experiment.spec import paper_numbers

    rows = [r["name"] for r in evidence.spec["rows"]]
    names = paper_column_names(evidence.spec) if claim.get("columns") == "all" else claim["columns"]
    columns = [c for c in (scale_column(evidence, n) for n in names) if c is not None]
    paper = paper_numbers(evidence.spec, "paper")
    mechanism = [claim["row"]] if claim.get("mechanism") and claim.get("row") else []
    out = []
    if claim["kind"] == "trend":
        return trend(claim, evidence, columns, conf, paper)
    others = [r for r in rows if r != claim["row"]] if claim["others"] == "all" else claim["others"]
    margin = float(claim.get("margin", conf["competitive_margin"]))
    for column in columns:
        for other in others:
            cell = {"spec": claim["spec"], "row": claim["row"], "other": other, "column": column}
            failed = preconditions(evidence, column, [claim["row"], other], [other], mechanism, conf)
            a, b = evidence.values.get((claim["row"], column), {}), evidence.values.get((other, column), {})
            seeds = sorted(a.keys() & b.keys())
            at_paper = paper_column(evidence, column)
            mine, theirs = paper.get((claim["row"], at_paper)), paper.get((other, at_paper))
            paper_diff = mine[0] - theirs[0] if mine and theirs else None
            if seeds:
                bound = 0.0 if claim["kind"] == "outperforms" else -margin
                cell.update(judge([a[s] - b[s] for s in seeds], bound, paper_diff, conf))
            if failed:
                cell.update(verdict="cannot test", reason="; ".join(failed))
            cell["failed"] = failed
            out.append(cell)
    return out


def trend(claim: dict[str, Any], evidence: Evidence, columns: Sequence[str], conf: dict[str, Any],
          paper: dict[tuple[str, str], tuple]) -> list[dict[str, Any]]:
    """A trend claim's comparisons: per seed the least-squares slope along the sweep times its length (the
    sweep's fitted change, in points); along rows one comparison per column, along columns one in all."""
    shape, margin = claim["shape"], float(claim.get("margin", conf["competitive_margin"]))
    series: list[tuple[str, list[tuple[str, str]]]] = []  # (label, [(row, column) in sweep order])
    if claim["along"] == "rows":
        series = [(column, [(r, column) for r in claim["rows"]]) for column in columns]
        mechanism = claim["rows"] if claim.get("mechanism") else []
    else:
        series = [(" -> ".join(columns), [(claim["row"], c) for c in columns])] if len(columns) >= 2 else []
        mechanism = [claim["row"]] if claim.get("mechanism") else []
    out = []
    for label, points in series:
        rows = list(dict.fromkeys([r for r, _ in points] + ([claim["other"]] if claim.get("other") else [])))
        failed = []
        for column in dict.fromkeys(c for _, c in points):
            failed += [f"{column}: {f}" if claim["along"] == "columns" else f
                       for f in preconditions(evidence, column, rows, [claim["other"]] if claim.get("other") else [],
                                              mechanism, conf)]
        cell = {"spec": claim["spec"], "rows": rows, "column": label, "shape": shape}

        def value(row: str, column: str, seed: int) -> float | None:
            mine = evidence.values.get((row, column), {}).get(seed)
            other = evidence.values.get((claim["other"], column), {}).get(seed) if claim.get("other") else 0.0
            return None if mine is None or other is None else mine - other

        seeds = sorted(set.intersection(*(set(evidence.values.get((r, c), {})) for r, c in points)))
        changes = []
        for seed in seeds:
            ys = [value(r, c, seed) for r, c in points]
            if None not in ys:
                changes.append(fitted_change(ys))
        paper_ys = [paper.get((r, paper_column(evidence, c))) for r, c in points]
        if claim.get("other"):
            theirs = [paper.get((claim["other"], paper_column(evidence, c))) for _, c in points]
            paper_ys = [(p[0] - q[0],) if p and q else None for p, q in zip(paper_ys, theirs, strict=True)]
        paper_change = fitted_change([p[0] for p in paper_ys]) if all(paper_ys) and paper_ys else None
        if changes:
            signed = [-c for c in changes] if shape == "decreasing" else changes
            paper_signed = (-paper_change if shape == "decreasing" else paper_change) if paper_change is not None \
                else None
            cell.update(judge(signed, 0.0, paper_signed, conf, flat=margin if shape == "flat" else None))
        if failed:
            cell.update(verdict="cannot test", reason="; ".join(dict.fromkeys(failed)))
        cell["failed"] = list(dict.fromkeys(failed))
        out.append(cell)
    return out


def fitted_change(ys: Sequence[float]) -> float:
    """The least-squares line's change from the first to the last position of an evenly spaced sweep."""
    n = len(ys)
    xs = range(n)
    mx, my = (n - 1) / 2, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return slope * (n - 1)


def combine(cells: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """A claim's verdict from its comparisons (docs/claims.md) and a reason with the counts."""
    testable = [c for c in cells if c.get("verdict") and c["verdict"] != "cannot test"]
    counts = {v: sum(c.get("verdict") == v for c in cells) for v in VERDICTS}
    tally = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    if not cells:
        return "cannot test", "not run at this scale: none of its columns is run here"
    if not testable:
        failed = list(dict.fromkeys(f.split(":")[0] for c in cells for f in c.get("failed", []) or ["no runs"]))
        return "cannot test", f"{tally}: " + ", ".join(failed) + "; first: " + cells[0].get("reason", "no runs")
    if counts["contradicted"]:
        return "contradicted", tally
    if counts["supported"] == len(testable):
        return "supported", tally
    return "not resolved", tally


# ------------------------------------------------------------------------------------------------ table marks

def annotate(spec: dict[str, Any], scale: str, frame: Any, dirs: dict[Cell, Path],
             conf: dict[str, Any] | None = None) -> None:
    """Gate a collected table's marks on the ledger's preconditions, in place: each paired difference of
    ``frame.attrs["paired"]`` gets ``untestable`` (the failed preconditions, None when testable) and ``magnitude``;
    an untestable or sign-only one loses its sign mark (``agrees`` None). Each Kendall's tau of
    ``frame.attrs["ordering"]`` gets ``untestable`` for its column (every row with a number must pass)."""
    conf = conf or thresholds()
    evidence = evidence_of(spec, scale, frame, dirs)
    compare = spec.get("compare")
    for p in frame.attrs.get("paired", []):
        failed = preconditions(evidence, p["column"], [p["row"], p["other"]], [p["other"]], [p["row"]], conf)
        p["untestable"] = "; ".join(failed) or None
        paper = None if math.isnan(p["paper_diff"]) else p["paper_diff"]
        if not failed and p["agrees"] and not math.isnan(p["ci_low"]):
            magnitude(p["mean_diff"], p["ci_low"], p["ci_high"], paper, conf, p)
        if failed or p.get("magnitude") == "sign only":
            p["agrees"], p["contradicts"] = None, False
    for o in frame.attrs.get("ordering", []):
        rows = [r["name"] for r in spec["rows"] if evidence.values.get((r["name"], o["column"]))]
        failed = preconditions(evidence, o["column"], rows, [r for r in rows if r != compare],
                               [compare] if compare in rows else [], conf)
        o["untestable"] = "; ".join(failed) or None


#: why a table collected before the ledger carries no mark where its stand-in passes (its runs were not checked)
UNCHECKED = "unchecked: collected before the claims ledger (re-collect it from its runs)"


def annotate_collected(spec: dict[str, Any], scale: str, frame: Any) -> None:
    """Gate the marks of a table collected before the ledger (its statistics have no ``untestable``), in place:
    the stand-in precondition needs no runs; every other one does, so such a mark is :data:`UNCHECKED`."""
    entries = [e for e in [*frame.attrs.get("paired", []), *frame.attrs.get("ordering", [])] if "untestable" not in e]
    spec_column = {c.name: c.column for c in output_columns(spec, scale)} if entries else {}
    for entry in entries:
        column = spec_column.get(entry["column"], entry["column"])
        entry["untestable"] = standin(spec, scale, column) or UNCHECKED
        if "agrees" in entry:
            entry["agrees"], entry["contradicts"] = None, False


def mark(p: dict[str, Any]) -> str:
    """The mark of a paired difference: ✓ / ✗ / ✗! where it can test the paper's sign (and size), else why not."""
    if p.get("untestable"):
        return f" (cannot test: {precondition_names(p['untestable'])})"
    if p.get("magnitude") == "sign only":
        return " (sign only)"
    return "" if p.get("agrees") is None else " ✓" if p["agrees"] else " ✗!" if p.get("contradicts") else " ✗"


def precondition_names(untestable: str) -> str:
    """The failed preconditions' names of an ``untestable`` text, e.g. "stand-in, headroom"."""
    return ", ".join(dict.fromkeys(part.split(":")[0].strip() for part in untestable.split("; ")))


# ------------------------------------------------------------------------------------------------ ledger

def standin_of_claim(claim: dict[str, Any], evidence: Evidence) -> str | None:
    """The stand-in reason when every column of the claim at this scale fails it (it needs no runs)."""
    names = paper_column_names(evidence.spec) if claim.get("columns") == "all" else claim["columns"]
    columns = [c for c in (scale_column(evidence, n) for n in names) if c is not None]
    reasons = [standin(evidence.spec, evidence.scale, evidence.spec_column(c)) for c in columns]
    return "; ".join(dict.fromkeys(reasons)) if columns and all(reasons) else None


def counts(entries: Sequence[dict[str, Any]]) -> dict[str, int]:
    return {v: sum(e["verdict"] == v for e in entries) for v in VERDICTS}


def summary_line(paper: str, scale: str, entries: Sequence[dict[str, Any]]) -> str:
    """E.g. "FedCAC: 3 supported, 2 contradicted, 4 not resolved, 11 cannot test at mini"."""
    found = counts(entries)
    return f"{paper}: " + ", ".join(f"{n} {v}" for v, n in found.items()) + f" at {scale}"


def markdown(paper: str, scale: str, entries: Sequence[dict[str, Any]]) -> str:
    """The ledger as Markdown: the counts, then one row per claim and one line per comparison."""
    lines = [f"# Claims ledger: {paper}, {scale} scale", "", f"**{summary_line(paper, scale, entries)}**", "",
             "Generated by `python -m bench.experiment.ledger` from the run records and "
             f"`conf/paper/{paper}/claims.yaml` (pre-registered); preconditions and thresholds: "
             "`conf/claims.yaml`, docs/claims.md.", "",
             "| claim | section | verdict | reason |", "|---|---|---|---|"]
    for e in entries:
        lines.append(f"| `{e['id']}` | {e['section']} | **{e['verdict']}** | {e['reason']} |".replace("\n", " "))
    lines.append("")
    for e in entries:
        lines += [f"## `{e['id']}`: {e['verdict']}", "", f"> {e['quote']}", "", f"{e['section']}. {e['reason']}", ""]
        for c in e["cells"]:
            what = (f"{c['row']} − {c['other']}" if "other" in c else f"{c['shape']} along {', '.join(c['rows'])}")
            lines.append(f"- {c['spec']} | {c['column']} | {what}: **{c.get('verdict', 'cannot test')}** — "
                         f"{c.get('reason', '')}")
        lines.append("")
    return "\n".join(lines)


def write_ledger(paper: str, scale: str, entries: Sequence[dict[str, Any]], results_dir: str = "results") -> Path:
    """``results/<paper>/[<scale>/]claims.json`` and ``claims.md``, written atomically; returns the JSON path."""
    base = output_base(paper, "claims", scale, results_dir)
    base.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(base.with_suffix(".json"),
                      json.dumps(json_safe(list(entries)), indent=1, allow_nan=False, ensure_ascii=False) + "\n")
    atomic_write_text(base.with_suffix(".md"), markdown(paper, scale, entries))
    return base.with_suffix(".json")
