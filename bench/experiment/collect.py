"""Collect run directories into a pandas frame and tables of mean +- std over seeds.

Only runs whose ``summary.json`` says ``complete`` are averaged; every other run directory found is
returned separately as missing/partial so a table can list it instead of silently averaging it in.

Command line (writes Markdown, LaTeX and CSV from whatever runs exist; nothing is trained)::

    python -m bench.experiment.collect conf/paper/fedcac/table2.yaml --scale mini [--out-dir runs] [--results results]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from bench.core.records import RunDir, run_config
from bench.core.summary import chance_verdict, final_eval, pick
from bench.experiment.claims import annotate
from bench.experiment.provenance import is_stale, run_code
from bench.experiment.spec import (
    PROTOCOL_KEYS,
    Cell,
    OutputColumn,
    differing_protocols,
    output_columns,
    paper_numbers,
    row_protocol,
)
from common.verified_io import read_jsonl


def curves(run_dirs: Sequence[Path], stage: str = "post", split: str = "test") -> pd.DataFrame:
    """Long frame (run_dir, round, mean_acc) of the evaluation records of ``run_dirs``."""
    rows = []
    for run in run_dirs:
        for rec in read_jsonl(Path(run) / "rounds.jsonl"):
            if rec.get("kind") == "eval" and rec["stage"] == stage and rec["split"] == split:
                rows.append({"run_dir": str(run), "round": rec["round"], "mean_acc": rec["mean_acc"]})
    return pd.DataFrame(rows)


def collect(spec: dict[str, Any], scale: str, dirs: dict[Cell, Path]) -> tuple[pd.DataFrame, list[str]]:
    """Per-cell mean/std over complete seeds, the paper's value and the difference; plus incomplete runs.

    Cells with runs computed by other code than this tree's (or by several versions of the code) are listed
    in ``frame.attrs["stale"]``; they are averaged in, and ``bench.experiment.table --rerun-stale`` reruns them.
    ``frame.attrs`` also holds the test images per client (``test_images``: min, max over the averaged runs),
    the spec's ``compare`` row against the best other row with paired differences over seeds (``paired``),
    and Kendall's tau between our ordering of the rows and the paper's per column (``ordering``)."""
    columns = output_columns(spec, scale)
    per_client = {c.column for c in columns if c.client is not None}
    values: dict[tuple[str, str], dict[int, float]] = {}
    codes: dict[tuple[str, str], set[str | None]] = {}
    stale: dict[tuple[str, str], int] = {}
    finished: dict[tuple[str, str], int] = {}
    test_images: list[int] = []
    problems = []
    diverged: set[tuple[str, str]] = set()
    untrained: dict[tuple[str, str], list[str]] = {}  # (row, output column) -> why, per seed
    unchecked = 0  # runs not judged against chance
    metrics: dict[str, dict[tuple[str, str], list[float]]] = {}  # spec metrics -> (row, column) -> per seed
    sizes: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (row, column) -> each run's capacity record
    for cell, path in dirs.items():
        run = RunDir(path)
        state = run.summary_state()
        if state == "diverged":
            diverged.add((cell.row, cell.column))
            message = json.loads(run.diverged.read_text()).get("message", "")
            problems.append(f"diverged: {cell.row} | {cell.column} | seed {cell.seed}: {message} ({run.diverged})")
            continue
        if state != "complete":
            state = ("failed" if (path / "error.txt").exists() else "damaged" if state == "damaged"
                     else "partial" if run.rounds.exists() else "missing")
            where = path / "error.txt" if state == "failed" else path
            problems.append(f"{state}: {cell.row} | {cell.column} | seed {cell.seed} ({where})")
            continue
        summary = json.loads(run.summary.read_text())
        proto = row_protocol(spec, cell.row)
        result = pick(summary["results"], proto["stage"], proto["selection"], proto["weighting"])
        values.setdefault((cell.row, cell.column), {})[cell.seed] = result["acc"]
        records, cfg = run.records(), run_config(path)
        for name, why in untrained_columns(path, records, proto, cell, columns, cfg).items():
            if name == UNCHECKED:
                unchecked += 1
            else:
                untrained.setdefault((cell.row, name), []).append(why)
        record = eval_at(path, proto["stage"], result["round"], records=records)
        if record is not None:
            test_images += [n for n in record["n"] if n]
            if cell.column in per_client:
                for column in columns:
                    if column.column == cell.column and column.client is not None:
                        at = record["clients"].index(column.client) if column.client in record["clients"] else None
                        if at is not None:
                            values.setdefault((cell.row, column.name), {})[cell.seed] = record["acc"][at]
        for name in spec.get("metrics", []):  # the method's final-round numbers the spec shows (summary.final_metrics)
            value = summary.get("final_metrics", {}).get(name)
            if isinstance(value, int | float):
                metrics.setdefault(name, {}).setdefault((cell.row, cell.column), []).append(float(value))
        if summary.get("capacity"):
            sizes.setdefault((cell.row, cell.column), []).append(summary["capacity"])
        codes.setdefault((cell.row, cell.column), set()).add(run_code(summary))
        stale[(cell.row, cell.column)] = stale.get((cell.row, cell.column), 0) + is_stale(summary, run_imports(cfg))
        finished[(cell.row, cell.column)] = finished.get((cell.row, cell.column), 0) + 1
    for (row, name), whys in sorted(untrained.items()):
        problems += [f"did not train: {row} | {name} | {why}" for why in whys]
        values.pop((row, name), None)  # shown as "did not train", never averaged, ranked or compared
    published = paper_numbers(spec, scale)
    rows = []
    for row in spec["rows"]:
        proto = row_protocol(spec, row["name"])
        for column in columns:
            if row.get("unavailable") and column.client is None:
                problems.append(f"not run: {row['name']} | {column.name}: {row['unavailable']}")
            seeds = {} if (row["name"], column.column) in diverged else values.get((row["name"], column.name), {})
            accs = list(seeds.values())
            mean = sum(accs) / len(accs) if accs else math.nan
            std = pd.Series(accs).std() if len(accs) > 1 else math.nan
            paper = published.get((row["name"], column.name))
            rows.append({"method": row["name"], "column": column.name, "mean": mean, "std": std,
                         "seeds": len(accs), "paper_mean": paper[0] if paper else math.nan,
                         "paper_std": paper[1] if paper and paper[1] is not None else math.nan,
                         "paper_source": paper[2] if paper else "",
                         "protocol": "/".join(proto[k] for k in PROTOCOL_KEYS),
                         "state": ("diverged" if (row["name"], column.column) in diverged else "did not train"
                                   if (row["name"], column.name) in untrained else "")})
    frame = pd.DataFrame(rows)
    frame["diff"] = frame["mean"] - frame["paper_mean"]
    frame["beyond_2std"] = (frame["diff"].abs() > 2 * frame["std"]) & frame["std"].notna() & frame["diff"].notna()
    frame.attrs["diverged_cells"] = sorted([row, column] for row, column in diverged)
    frame.attrs["untrained_cells"] = sorted([row, column] for row, column in untrained)
    frame.attrs["unchecked_runs"] = unchecked
    stale_cells = [(row, column) for (row, column), count in stale.items() if count or len(codes[(row, column)]) > 1]
    frame.attrs["stale_cells"] = [[row, c.name] for row, column in stale_cells for c in columns if c.column == column]
    frame.attrs["stale"] = [f"{row} | {column}: " + ", ".join(
        ([f"{stale[(row, column)]} of {finished[(row, column)]} runs from other code than this tree"]
         if stale[(row, column)] else [])
        + (["runs from different code versions"] if len(codes[(row, column)]) > 1 else []))
        for row, column in stale_cells]
    frame.attrs["row_protocols"] = protocol_notes(spec, dirs)
    frame.attrs["metrics"] = {name: [{"row": row, "column": column, "mean": sum(v) / len(v), "runs": len(v)}
                                     for (row, column), v in cells.items()] for name, cells in metrics.items()}
    frame.attrs["test_images"] = [min(test_images), max(test_images)] if test_images else []
    frame.attrs["widths"] = width_statistics(spec, sizes)
    frame.attrs["seeds"] = sorted({int(n) for n in frame["seeds"] if n})
    frame.attrs["paired"] = paired_differences(spec.get("compare"), values, [c.name for c in columns],
                                               [r["name"] for r in spec["rows"]], published)
    frame.attrs["ordering"] = orderings(frame)
    frame.attrs["seed_values"] = {key: dict(seeds) for key, seeds in values.items()}  # (row, column) -> seed -> acc
    annotate(spec, scale, frame, dirs)  # marks and tau only where the ledger's preconditions hold
    return frame, problems


def width_statistics(spec: dict[str, Any], sizes: dict[tuple[str, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per row and column (row order): the mean share of the full model its clients train (p^2 of width p;
    pFedGate's sparsity) over clients and seeds, the widest client width and the rule that sized them, from the
    runs' summaries (``capacity``; a summary written before costs were recorded gives p^2, one before rules
    "not recorded"). Empty when every run's capacity setting is ideal (every client at full width)."""
    if all(record["setting"] == "ideal" for records in sizes.values() for record in records):
        return []
    out = []
    for row in spec["rows"]:
        for (name, column), records in sizes.items():
            if name != row["name"]:
                continue
            costs = [c for r in records for c in r.get("cost") or [w * w for w in r["width"]]]
            rules = sorted({r.get("rule", "not recorded") for r in records})
            out.append({"row": name, "column": column, "mean_p2": sum(costs) / len(costs),
                        "widest": max(w for r in records for w in r["width"]), "rule": "; ".join(rules),
                        "runs": len(records)})
    return out


def eval_at(run: Path, stage: str, round_: int, split: str = "test",
            records: Sequence[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """A run's evaluation record of one stage and round (None if its records do not have it). A method whose
    trained model is the model it holds (Local: ``pre_is_post``) records only ``post``, which answers ``pre``.
    ``records``: the run's records when the caller has read them already."""
    records = read_jsonl(Path(run) / "rounds.jsonl") if records is None else records
    found = {rec["stage"]: rec for rec in records
             if rec.get("kind") == "eval" and rec["round"] == round_ and rec["split"] == split}
    return found.get(stage, found.get("post") if stage == "pre" else None)


#: what each stage evaluates, for the tables' protocol lines
STAGE_MEANING = {"pre": "each client's model right after its local training",
                 "post": "the model each client holds after aggregation"}


def protocol_notes(spec: dict[str, Any], dirs: dict[Cell, Path]) -> dict[str, str]:
    """Rows scored otherwise than the table's protocol, or whose scored model is first fine-tuned on the client's
    training data (the method's ``post_finetune``), each with a sentence saying how (from the row's run configs)."""
    import methods

    notes, differing = {}, differing_protocols(spec)
    for row in spec["rows"]:
        proto = row_protocol(spec, row["name"])
        configs = [p / "config.yaml" for c, p in dirs.items() if c.row == row["name"] and (p / "config.yaml").exists()]
        cfg = run_config(configs[0].parent) if configs else {}
        method = cfg.get("method", {})
        cls = methods.find(method["name"]) if method.get("name") else None
        tuned_by = cls.post_finetune if cls is not None else None
        finetune = (f"; the model is first fine-tuned for {method[tuned_by]} epochs on the client's training data "
                    f"(method.{tuned_by})" if proto["stage"] == "post" and tuned_by and method.get(tuned_by) else "")
        if row["name"] in differing or finetune:
            notes[row["name"]] = (f"stage={proto['stage']} ({STAGE_MEANING[proto['stage']]}), "
                                  f"selection={proto['selection']}, weighting={proto['weighting']}{finetune}")
    return notes


def client_test_counts(run: Path) -> dict[int, list[int]] | None:
    """Test images per class of each client: from the run's partition report, else (runs committed without it)
    from its partition built again from its config; None if neither can be had."""
    path = Path(run) / "partition" / "class_counts.csv"
    if not path.exists():
        return rebuilt_test_counts(json.dumps(run_config(run), sort_keys=True, default=str))
    counts = pd.read_csv(path)
    test = counts[counts["part"] == "test"]
    classes = [c for c in counts.columns if c.startswith("class_")]
    return {int(r["client"]): [int(r[c]) for c in classes] for _, r in test.iterrows()}


@functools.lru_cache(maxsize=64)
def rebuilt_test_counts(config: str) -> dict[int, list[int]] | None:
    """Test images per class of each client of the partition a run's config (JSON) describes, built again from its
    data (the partition cache answers when it has it); None when the data is not here."""
    from bench.core.data import load_sources, partition_sources, sharing_sources

    cfg = json.loads(config)
    try:
        with sharing_sources():
            labels, partition = partition_sources(
                *load_sources(cfg["dataset"], cfg.get("data_root")), str(cfg["dataset"]["name"]), cfg["partition"],
                num_clients=int(cfg["num_clients"]), data_seed=int(cfg["data_seed"]), cache_dir=cfg.get("cache_dir"))
    except (OSError, ValueError, KeyError):  # data missing here, a partition that cannot be built, an unknown source
        return None
    import torch

    pool = torch.cat([labels.train_labels, labels.test_labels])
    return {k: torch.bincount(pool[c.test], minlength=labels.num_classes).tolist()
            for k, c in enumerate(partition.clients)}


@functools.cache
def default_chance_z() -> float:
    """``eval.chance_z`` of ``conf/config.yaml``, for runs whose config predates the key."""
    base = yaml.safe_load((Path(__file__).resolve().parents[2] / "conf" / "config.yaml").read_text())
    return float(base["eval"]["chance_z"])


#: the key under which :func:`untrained_columns` reports a run it could not judge
UNCHECKED = ""


def untrained_columns(run: Path, records: Sequence[dict[str, Any]], proto: dict[str, str], cell: Cell,
                      columns: Sequence[OutputColumn], cfg: dict[str, Any] | None = None) -> dict[str, str]:
    """The output columns of ``cell`` in which its run did not train (its final accuracy at the row's stage is not
    above chance: :func:`bench.core.summary.chance_verdict`), each with the reason; the spec column itself is
    judged on the mean over clients, a per-client column on that client alone (``cfg``: the run's config, if read
    already). A run that cannot be judged (no partition report or final record, or ``eval.chance_z=null``) is
    reported under :data:`UNCHECKED`."""
    final = final_eval(records, proto["stage"])
    counts = client_test_counts(run)
    z = (run_config(run) if cfg is None else cfg).get("eval", {}).get("chance_z", default_chance_z())
    if final is None or counts is None or z is None:
        return {UNCHECKED: f"seed {cell.seed} ({run})"}
    verdict = chance_verdict(final, counts, proto["weighting"], float(z))
    out = {}
    for column in columns:
        if column.column != cell.column:
            continue
        judged = verdict if column.client is None else verdict["clients"].get(str(column.client))
        if judged and judged["verdict"] == "did not train":
            out[column.name] = (f"seed {cell.seed}: final accuracy {judged['acc']:.2f} (round {final['round']}, "
                                f"{proto['stage']}) is not above chance {judged['chance']:.2f} + margin = "
                                f"{judged['threshold']:.2f} ({run})")
    return out


def paired_differences(compare: str | None, values: dict[tuple[str, str], dict[int, float]], columns: Sequence[str],
                       rows: Sequence[str], published: dict[tuple[str, str], tuple] | None = None,
                       confidence: float = 0.95) -> list[dict[str, Any]]:
    """Per column and other row: row ``compare`` minus that row over the seeds both have (the mean and std of the
    per-seed differences, a ``confidence`` t-interval of the mean, in how many seeds ``compare`` is higher), the
    paper's difference of the same two rows, whether ours has its sign (``agrees``), and ``contradicts``: the
    interval lies entirely on the other side of zero than the paper's difference. ``best_other`` marks the row
    with the highest mean of the column; it comes first."""
    from scipy.stats import t as student

    if not compare:
        return []
    if compare not in rows:
        raise ValueError(f"compare={compare!r} is not a row of the table; rows: {list(rows)}")
    published = published or {}
    out = []
    for column in columns:
        ours = values.get((compare, column), {})
        others = {r: values[(r, column)] for r in rows if r != compare and values.get((r, column))}
        if not ours or not others:
            continue
        best = max(others, key=lambda r: sum(others[r].values()) / len(others[r]))
        for other in sorted(others, key=lambda r: r != best):
            seeds = sorted(ours.keys() & others[other].keys())
            diffs = [ours[s] - others[other][s] for s in seeds]
            if not diffs:
                continue
            mean = sum(diffs) / len(diffs)
            std = float(pd.Series(diffs).std()) if len(diffs) > 1 else math.nan
            half = (float(student.ppf(0.5 + confidence / 2, len(diffs) - 1)) * std / math.sqrt(len(diffs))
                    if len(diffs) > 1 else math.nan)
            mine, theirs = published.get((compare, column)), published.get((other, column))
            paper = mine[0] - theirs[0] if mine and theirs else math.nan
            low, high = mean - half, mean + half
            out.append({"column": column, "row": compare, "other": other, "best_other": other if other == best
                        else None, "seeds": len(diffs), "mean_diff": mean, "std_diff": std,
                        "ci_low": low, "ci_high": high, "confidence": confidence,
                        "higher_in": sum(d > 0 for d in diffs), "paper_diff": paper,
                        "agrees": None if math.isnan(paper) or mean == 0 else (mean > 0) == (paper > 0),
                        "contradicts": bool(not math.isnan(paper) and not math.isnan(half) and paper != 0
                                            and (high < 0 if paper > 0 else low > 0))})
    return out


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b between two rankings (ties allowed); nan when either side is all ties."""
    concordant = discordant = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + ties_a) * (concordant + discordant + ties_b))
    return (concordant - discordant) / denom if denom else math.nan


def orderings(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Per column with at least three rows that have both our mean and the paper's: Kendall's tau of the two."""
    out = []
    for column, group in frame.groupby("column", sort=False):
        both = group[group["mean"].notna() & group["paper_mean"].notna()]
        if len(both) >= 3:
            out.append({"column": column, "rows": len(both),
                        "tau": kendall_tau(list(both["mean"]), list(both["paper_mean"])),
                        "ours_best": str(both.loc[both["mean"].idxmax(), "method"]),
                        "paper_best": str(both.loc[both["paper_mean"].idxmax(), "method"])})
    return out


def run_imports(cfg: dict[str, Any]) -> tuple[str, ...]:
    """The ``imports`` of a run's config (:func:`run_config`): modules whose source is part of its code identity."""
    return tuple(cfg.get("imports") or ())


def main(argv: Sequence[str] | None = None) -> None:
    from bench.experiment.manifest import cell_dirs
    from bench.experiment.render import write_table
    from bench.experiment.spec import SCALES, expand, load_spec
    from bench.experiment.tuning import with_tuned

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", nargs="+", help="table specs, e.g. conf/paper/fedcac/table2.yaml")
    parser.add_argument("--scale", default="mini", choices=SCALES)
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--out-dir", default="runs", help="where the run directories are")
    parser.add_argument("--results", default="results", help="where tables go")
    args = parser.parse_args(argv)
    for path in args.spec:
        spec = with_tuned(load_spec(path), args.scale, args.results)  # the rows' searched values, as the table ran
        cells = expand(spec, args.scale, args.seeds, args.out_dir)
        dirs = cell_dirs(spec, args.scale, cells, args.results)  # the table's manifest, else composed
        frame, problems = collect(spec, args.scale, dirs)
        averaged = int(frame[frame["column"].isin([c["name"] for c in spec["columns"]])]["seeds"].sum())
        print(f"wrote {write_table(spec, args.scale, frame, problems, args.results)} "
              f"({averaged} runs averaged, {len(problems)} listed as not averaged in)")


if __name__ == "__main__":
    main()
