"""Cross-checks: our methods against independent public implementations on identical data.

``conf/crosscheck.yaml`` names the shared setting (data, split, model, optimiser, rounds, seeds), the methods and
for each its external implementation. ``scripts/crosscheck_external.py`` runs the external side once and writes its
learning curves as ``results/crosscheck/<method>/reference_<partition>.json`` (their numbers, never their code).
This module runs our side in a fresh output folder (finished runs are never reused, so the check sees the current
code), reads the same metric from every round, and compares best and final accuracy (means over seeds) with the
reference:

    python -m bench.experiment.crosscheck                       # every method with a reference; exit 1 on a drift
    python -m bench.experiment.crosscheck --set ci              # the reduced set (``ci:`` in the spec, first partition)
    python -m bench.experiment.crosscheck --methods fedavg --write   # also rewrite results/crosscheck/ (curves,
                                                                     # figures, table)
    python -m bench.experiment.crosscheck --table-only          # rebuild table.json + README.md from the committed
                                                                # curves
    python -m bench.experiment.crosscheck --methods fedcac --seeds 0 1 2 3 4 --results <5-repetition folder> --write
                                                     # more seeds, in a folder of their own (the spread across seeds)

A cell agrees when |ours - theirs| <= the method's tolerance for both best and final accuracy. A cell beyond it
fails the check, unless its difference is a known one still under investigation (the method's ``open:`` entry) and
ours has not moved: best and final within the common tolerance of our committed curves (``ours_<partition>.json``);
or ours is within its own seed noise (``seed_noise_z`` standard errors) of the mean of the seeds recorded in
``seeds_<partition>.json``: on another CPU our runs' last bits differ from the recording machine's, and a two-seed
mean lands elsewhere within its seed noise (``within_seed_noise``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.experiment.errors import config_phase, run_cli

SPEC = Path(__file__).resolve().parents[2] / "conf" / "crosscheck.yaml"
RESULTS = Path("results") / "crosscheck"


def load_spec(path: str | Path = SPEC) -> dict[str, Any]:
    """The cross-check spec, checked for the keys every part of the machinery reads."""
    spec = yaml.safe_load(Path(path).read_text())
    for key in ("setting", "partitions", "methods", "tolerance", "external"):
        if key not in spec:
            raise ValueError(f"{path}: missing top-level key {key!r}")
    for name, m in spec["methods"].items():
        if "ours" not in m or "external" not in m:
            raise ValueError(f"{path}: method {name!r} needs 'ours' and 'external'")
        if m["external"]["code"] not in spec["external"]:
            raise ValueError(f"{path}: method {name!r} names external code {m['external']['code']!r}, which is not "
                             f"under 'external:' ({', '.join(spec['external'])})")
        stage(spec, name)
    return spec


def method_partitions(spec: Mapping[str, Any], method: str) -> list[str]:
    """The partitions a method is checked on (its ``partitions``, else every one of the spec)."""
    return list(spec["methods"][method].get("partitions") or spec["partitions"])


def for_partition(spec: Mapping[str, Any], method: str, key: str, partition: str, default: Any = None) -> Any:
    """A method's ``tolerance``, ``note`` or ``open`` on ``partition``: one value for all of its partitions, or a
    mapping partition -> value (a partition the mapping does not name gets ``default``: a note measured on one split
    explains nothing on another)."""
    value = spec["methods"][method].get(key, default)
    return value.get(partition, default) if isinstance(value, Mapping) else value


def tolerance(spec: Mapping[str, Any], method: str, partition: str) -> tuple[float, float]:
    """A method's (best, final) tolerance on ``partition``: one number for both, or ``{best: x, final: y}`` (under
    the partition's key) where a difference is explained for one of them only, e.g. a late-round gap whose best
    rounds agree."""
    value = for_partition(spec, method, "tolerance", partition, spec["tolerance"])
    if isinstance(value, Mapping):
        if set(value) != {"best", "final"}:
            raise ValueError(f"{method}/{partition}: tolerance {dict(value)!r} is invalid: give one number, or "
                             "{best: x, final: y} under the partition's key")
        return float(value["best"]), float(value["final"])
    return float(value), float(value)


def _within(tol: tuple[float, float]) -> str:
    best, final = tol
    return f"{best:g}" if best == final else f"{best:g} best, {final:g} final"


def model_overrides(spec: Mapping[str, Any], method: str | None = None) -> list[str]:
    """Our model overrides: the method's own ``model`` list when it has one (a model the external code can run,
    e.g. HeteroFL's conv net), else the setting's model without norm layers."""
    own = spec["methods"][method].get("model") if method else None
    return [str(o) for o in own] if own else [f"model={spec['setting']['model']}", "model.options.norm=none"]


def setting_overrides(spec: Mapping[str, Any], partition: str, method: str | None = None) -> list[str]:
    """Our config overrides for the shared setting on ``partition`` (everything but method and seed; the model is
    ``method``'s own when its entry names one)."""
    s = spec["setting"]
    return [f"dataset={s['dataset']}", *model_overrides(spec, method),
            f"num_clients={s['num_clients']}", f"dataset.n_train_per_client={s['n_train_per_client']}",
            f"dataset.n_test_per_client={s['n_test_per_client']}", f"data_seed={s['data_seed']}",
            f"rounds={s['rounds']}", "participation=1.0", "train.optimizer=sgd", f"train.lr={s['lr']}",
            "train.momentum=0.0", "train.weight_decay=0.0", f"train.batch_size={s['batch_size']}",
            f"train.epochs={s['epochs']}", "train.drop_last=true", "eval.every=1", "eval.primary.stage=post",
            "eval.primary.selection=final", "eval.primary.weighting=weighted", *spec["partitions"][partition]]


def stage(spec: Mapping[str, Any], method: str) -> str:
    """The evaluation stage compared (``stage``: ``post`` = after aggregation, the default; ``pre`` = after local
    training, for an external code that evaluates before its server step)."""
    value = spec["methods"][method].get("stage", "post")
    if value not in ("pre", "post"):
        raise ValueError(f"{method}: stage {value!r} is invalid: use 'post' or 'pre'")
    return value


def compared_stage_overrides(spec: Mapping[str, Any], method: str) -> list[str]:
    """Evaluate only the stage compared (scored there too): the other stage's evaluation would change no curve, as
    evaluating draws no random numbers training uses and changes no state (the same curves and training records
    for every method of the spec, checked), and it costs about an eighth of a run's time."""
    compared = stage(spec, method)
    return [f"eval.stages=[{compared}]", f"eval.primary.stage={compared}"]


def our_overrides(spec: Mapping[str, Any], method: str, partition: str, seed: int) -> list[str]:
    return [*setting_overrides(spec, partition, method), *compared_stage_overrides(spec, method),
            *spec["methods"][method]["ours"], f"seed={seed}"]


def curve_from_records(rounds_jsonl: str | Path, stage: str = "post") -> list[float]:
    """Per round, the test accuracy pooled over all clients (``weighted_acc``, %) at ``stage``."""
    curve: dict[int, float] = {}
    with open(rounds_jsonl) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") == "eval" and rec.get("stage") == stage and rec.get("split") == "test":
                curve[int(rec["round"])] = float(rec["weighted_acc"])
    return [curve[r] for r in sorted(curve)]


@dataclass(frozen=True)
class Stats:
    best: float   # mean over seeds of each seed's best round
    final: float  # mean over seeds of the last round
    tail: float = float("nan")  # mean over seeds of the mean of the last TAIL rounds (less noisy than final)
    # sample standard deviations over seeds of the same per-seed values (nan for one seed): the between-seed spread
    sd_best: float = float("nan")
    sd_final: float = float("nan")
    sd_tail: float = float("nan")


TAIL = 5


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def stats(curves: Mapping[str, Sequence[float]]) -> Stats:
    runs = list(curves.values())
    if not runs or any(len(c) == 0 for c in runs):
        raise ValueError("no learning curve to summarise")
    best, sd_best = _mean_sd([max(c) for c in runs])
    final, sd_final = _mean_sd([c[-1] for c in runs])
    tail, sd_tail = _mean_sd([sum(c[-TAIL:]) / len(c[-TAIL:]) for c in runs])
    return Stats(best=best, final=final, tail=tail, sd_best=sd_best, sd_final=sd_final, sd_tail=sd_tail)


def verdict(ours: Stats, theirs: Stats, tol: float, method_tol: float | tuple[float, float],
            note: str | None = None) -> tuple[bool, str]:
    """(passes, the verdict's words): agree within the common tolerance ``tol``; else explained by ``note`` within
    the method's own (wider) tolerance, (best, final) or one number for both; else a difference, which fails."""
    own = method_tol if isinstance(method_tol, tuple) else (method_tol, method_tol)
    d_best, d_final = abs(ours.best - theirs.best), abs(ours.final - theirs.final)
    if max(d_best, d_final) <= tol:
        return True, f"agree (within {tol:g})"
    if note and d_best <= own[0] and d_final <= own[1]:
        return True, f"explained (within {_within(own)}): {note}"
    return False, f"DIFFERS (beyond {_within(own)})"


def reference_path(results: Path, method: str, partition: str) -> Path:
    return results / method / f"reference_{partition}.json"


def load_reference(results: Path, method: str, partition: str) -> dict[str, Any]:
    path = reference_path(results, method, partition)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run scripts/crosscheck_external.py for {method} first")
    return json.loads(path.read_text())


def run_ours(spec: Mapping[str, Any], jobs: Sequence[tuple[str, str, int]], out_dir: Path, workers: int = 2,
             extra: Sequence[str] = ()) -> dict[tuple[str, str, int], list[float]]:
    """Train every (method, partition, seed) in its own fresh folder under ``out_dir``; their curves."""

    def one(job: tuple[str, str, int]) -> list[float]:
        method, partition, seed = job
        out = out_dir / f"{method}-{partition}-s{seed}"
        cmd = [sys.executable, "-m", "bench.experiment.run", *our_overrides(spec, method, partition, seed), *extra,
               f"out_dir={out}", "exp=crosscheck", "quiet=true", "logger.wandb.mode=disabled", "threads=1"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"our run {method}/{partition}/seed {seed} failed:\n{' '.join(cmd)}\n"
                               f"{proc.stderr[-3000:]}")
        found = sorted(out.glob("crosscheck/*/*/rounds.jsonl"))
        if len(found) != 1:
            raise RuntimeError(f"expected one run under {out}, found {len(found)}")
        return curve_from_records(found[0], stage(spec, method))

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return dict(zip(jobs, pool.map(one, jobs), strict=True))


def open_difference_held(spec: Mapping[str, Any], results: Path, row: Mapping[str, Any],
                         ours: Mapping[str, Sequence[float]]) -> str | None:
    """For a difference still under investigation (the method's ``open`` on the row's partition), the guard holds
    on our side: our best and final accuracy are within the common tolerance of our committed curves
    (``<method>/ours_<partition>.json``), so the difference from the reference is the known one, not a drift. Its
    words, or None (no ``open`` entry, no committed curves of ours, or ours moved)."""
    method, partition = row["method"], row["partition"]
    path = results / method / f"ours_{partition}.json"
    if not for_partition(spec, method, "open", partition) or not path.is_file():
        return None
    committed = {str(k): v for k, v in json.loads(path.read_text())["curves"].items()}
    if set(committed) != set(ours):
        return None
    now, before = stats(ours), stats(committed)
    d_best, d_final = now.best - before.best, now.final - before.final
    if max(abs(d_best), abs(d_final)) > float(spec["tolerance"]):
        return None
    return (f"a known difference, still open; ours unchanged from its committed curves (best {d_best:+.2f}, final "
            f"{d_final:+.2f})")


def training_overrides(overrides: Sequence[str]) -> dict[str, str]:
    """What ``overrides`` set, key -> value (the last one given wins, as in Hydra), without the choice of evaluated
    and scored stages (``compared_stage_overrides``): evaluating the other stage too changes no curve (checked for
    every method of the spec) and the curve is read at the compared stage whichever is scored, so runs that differ
    only in these, or in the order of their overrides, are the same runs."""
    settings = dict(str(o).split("=", 1) if "=" in str(o) else (str(o), "") for o in overrides)
    for key in ("eval.stages", "eval.primary.stage"):
        settings.pop(key, None)
    return settings


def same_settings_file(spec: Mapping[str, Any], results: Path, method: str, partition: str,
                       kind: str) -> dict[str, Any] | None:
    """``<method>/<kind>_<partition>.json`` (``ours``: our committed curves; ``seeds``: our recorded seeds) when it
    exists and its runs had the training settings the spec gives now (``training_overrides``); else None."""
    path = results / method / f"{kind}_{partition}.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    current = our_overrides(spec, method, partition, 0)[:-1]
    return doc if training_overrides(doc["overrides"]) == training_overrides(current) else None


def within_seed_noise(spec: Mapping[str, Any], results: Path, row: Mapping[str, Any],
                      ours: Mapping[str, Sequence[float]]) -> str | None:
    """For a cell beyond its tolerance, whether ours is still within its own seed noise of what it recorded: our
    best and final accuracy (means over the ``n`` seeds just run) lie within ``seed_noise_z`` standard errors of
    the mean of the ``N`` seeds recorded in ``<method>/seeds_<partition>.json`` (same training overrides, at least
    3 seeds), the standard error being sd * sqrt(1/n + 1/N) with sd the recorded seeds' between-seed standard
    deviation. On the machine that recorded the curves our runs repeat them bit for bit; on another CPU their last
    bits differ, and a curve that swings from round to round lands elsewhere within its seed noise, which is not a
    drift. Its words, or None (no ``seed_noise_z`` in the spec, no such seeds file, or ours moved further)."""
    z = spec.get("seed_noise_z")
    recorded = same_settings_file(spec, results, row["method"], row["partition"], "seeds")
    if z is None or recorded is None or len(recorded["curves"]) < 3:
        return None
    now, before = stats(ours), stats(recorded["curves"])
    scale = (1 / len(ours) + 1 / len(recorded["curves"])) ** 0.5
    moved = {"best": (now.best - before.best, float(z) * before.sd_best * scale),
             "final": (now.final - before.final, float(z) * before.sd_final * scale)}
    if any(abs(d) > bound for d, bound in moved.values()):
        return None
    return (f"beyond its tolerance here, within our seed noise: best / final {moved['best'][0]:+.2f} / "
            f"{moved['final'][0]:+.2f} from the mean of our {len(recorded['curves'])} recorded seeds (bound "
            f"{float(z):g} se: {moved['best'][1]:.2f} / {moved['final'][1]:.2f})")


def repeats_committed(spec: Mapping[str, Any], results: Path, method: str, partition: str,
                      ours: Mapping[str, Sequence[float]]) -> bool | None:
    """Whether our fresh curves equal our committed ones (``<method>/ours_<partition>.json``) bit for bit, every seed
    and round; None when there are none committed with the same training overrides and seeds. On the CPU that
    recorded them they do (runs are deterministic); on another CPU they may not, which the tolerances allow."""
    committed = same_settings_file(spec, results, method, partition, "ours")
    if committed is None or set(map(str, committed["curves"])) != set(ours):
        return None
    return all(list(committed["curves"][s]) == list(ours[s]) for s in ours)


def figure(path: Path, method: str, partition: str, ours: Mapping[str, Sequence[float]],
           theirs: Mapping[str, Sequence[float]], external: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for label, curves, color in (("ours", ours, "tab:blue"), (external, theirs, "tab:orange")):
        for i, (seed, c) in enumerate(sorted(curves.items())):
            ax.plot(range(1, len(c) + 1), c, color=color, alpha=0.85, lw=1.2,
                    ls="-" if i == 0 else "--", label=f"{label} seed {seed}")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy, pooled (%)")
    ax.set_title(f"{method} — {partition}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare(spec: Mapping[str, Any], method: str, partition: str, ours: Mapping[str, Sequence[float]],
            reference: Mapping[str, Any]) -> dict[str, Any]:
    """One row of the agreement table."""
    theirs = {str(k): v for k, v in reference["curves"].items()}
    if len(theirs) != len(ours):
        raise ValueError(f"{method}/{partition}: {len(ours)} seed(s) of ours against {len(theirs)} repetition(s) in "
                         "the reference: compare as many on both sides (--seeds, or rerun "
                         "scripts/crosscheck_external.py with the same seeds)")
    lengths = {len(c) for c in [*ours.values(), *theirs.values()]}
    if len(lengths) != 1:
        raise ValueError(f"{method}/{partition}: curves of different lengths {sorted(lengths)}: the reference was "
                         "made with other rounds than conf/crosscheck.yaml's; rerun scripts/crosscheck_external.py")
    o, t = stats(ours), stats(theirs)
    tol = tolerance(spec, method, partition)
    ok, words = verdict(o, t, float(spec["tolerance"]), tol, for_partition(spec, method, "note", partition))
    known = for_partition(spec, method, "open", partition)
    if not ok and known:  # what is known of a difference not explained yet
        words = f"{words}: {known}"
    return {"method": method, "partition": partition, "external": reference["external"]["repo"],
            "commit": reference["external"]["commit"], "algo": reference["external"]["algo"],
            "seeds": len(ours), "ours_best": o.best, "ours_final": o.final, "theirs_best": t.best,
            "theirs_final": t.final, "ours_tail": o.tail, "theirs_tail": t.tail,
            "d_best": o.best - t.best, "d_final": o.final - t.final, "d_tail": o.tail - t.tail,
            "sd": {side: {k: None if math.isnan(v) else v for k, v in
                          (("best", x.sd_best), ("final", x.sd_final), ("tail", x.sd_tail))}
                   for side, x in (("ours", o), ("theirs", t))},  # None: one seed, no spread
            "tolerance": tol[0] if tol[0] == tol[1] else {"best": tol[0], "final": tol[1]}, "ok": ok,
            "verdict": words}


QUANTITIES = ("best", "final", f"last{TAIL}")


def per_seed(curve: Sequence[float]) -> dict[str, float]:
    """One seed's best round, last round and mean of the last ``TAIL`` rounds."""
    return dict(zip(QUANTITIES, (max(curve), curve[-1], sum(curve[-TAIL:]) / len(curve[-TAIL:])), strict=True))


def spread(ours: Mapping[str, Sequence[float]], theirs: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Each side's per-seed values, mean and sd; per quantity Δ = ours − theirs and its standard error (pooled
    standard deviation of both sides' seeds)."""
    sides = {"ours": ours, "theirs": theirs}
    if any(len(c) < 2 for c in sides.values()):
        raise ValueError("a spread needs at least two seeds on each side")
    out: dict[str, Any] = {}
    for side, curves in sides.items():
        values = {s: per_seed(c) for s, c in curves.items()}
        out[side] = {"per_seed": values, **{q: dict(zip(("mean", "sd"), _mean_sd([v[q] for v in values.values()]),
                                                        strict=True))
                                            for q in QUANTITIES}}
    n_o, n_t = len(ours), len(theirs)
    out["delta"] = {}
    for q in QUANTITIES:
        o, t = out["ours"][q], out["theirs"][q]
        pooled = (((n_o - 1) * o["sd"] ** 2 + (n_t - 1) * t["sd"] ** 2) / (n_o + n_t - 2)) ** 0.5
        out["delta"][q] = {"delta": o["mean"] - t["mean"], "pooled_sd": pooled,
                           "se": pooled * (1 / n_o + 1 / n_t) ** 0.5}
    return out


def their_curves(results: Path, method: str, partition: str) -> dict[str, list[float]]:
    """Theirs: the committed reference's repetitions and the extra ones kept in ``reference_seeds_<partition>.json``
    (if any), by seed."""
    curves = {str(k): v for k, v in load_reference(results, method, partition)["curves"].items()}
    extra = results / method / f"reference_seeds_{partition}.json"
    if extra.is_file():
        more = {str(k): v for k, v in json.loads(extra.read_text())["curves"].items()}
        clash = sorted(set(more) & set(curves), key=int)
        if clash:
            raise ValueError(f"{extra} repeats the reference's seed(s) {', '.join(clash)}")
        curves.update(more)
    return {s: curves[s] for s in sorted(curves, key=int)}


def recorded_seeds(spec: Mapping[str, Any], results: Path, method: str, partition: str) -> dict[str, Any] | None:
    """Δ = ours − theirs over every seed of ours recorded in ``<method>/seeds_<partition>.json`` and every
    repetition of theirs (``their_curves``), with the standard error of each difference, when the seeds were recorded
    with the training overrides the spec gives now; else None."""
    doc = same_settings_file(spec, results, method, partition, "seeds")
    if doc is None:
        return None
    theirs = their_curves(results, method, partition)
    delta = spread(doc["curves"], theirs)["delta"]
    return {"ours": len(doc["curves"]), "theirs": len(theirs),
            **{q: {"delta": delta[q]["delta"], "se": delta[q]["se"]} for q in ("best", "final")}}


def _all_seeds(row: Mapping[str, Any]) -> str:
    seeds = row.get("all_seeds")
    if not seeds:
        return "–"
    return (f"{seeds['best']['delta']:+.2f} ({seeds['best']['se']:.2f}) / {seeds['final']['delta']:+.2f} "
            f"({seeds['final']['se']:.2f}); {seeds['ours']}, {seeds['theirs']}")


def _spread(row: Mapping[str, Any]) -> str:
    sd = row.get("sd")
    if not sd or sd["ours"]["best"] is None:
        return "–"
    return "; ".join(f"{sd[side]['best']:.2f} / {sd[side]['final']:.2f}" for side in ("theirs", "ours"))


def table_markdown(spec: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    s = spec["setting"]
    lines = [
        "# Cross-checks against independent implementations",
        "",
        "Written by `python -m bench.experiment.crosscheck --write` (`make crosscheck` checks, writes nothing). "
        "Setting "
        f"(both sides, `conf/crosscheck.yaml`): real Fashion-MNIST, {s['num_clients']} clients with "
        f"{s['n_train_per_client']} train / {s['n_test_per_client']} test samples each (our split, partition seed "
        f"{s['data_seed']}, exported with `python -m bench.experiment.partition export --format pfllib`), PFLlib's "
            "FedAvgCNN "
        f"(our `cnn_fedavg`), SGD lr {s['lr']}, batch {s['batch_size']} (last partial batch dropped), "
        f"{s['epochs']} local epoch(s), {s['rounds']} rounds, all clients every round, seeds {s['seeds']}. "
        "Metric: test accuracy pooled over all clients' test samples (weighted by test size), of the model each "
        "client holds after the round's aggregation; best = mean over seeds of each seed's best round, final = "
        f"mean over seeds of the last round, last {TAIL} = mean over seeds of the last {TAIL} rounds' mean (shown, "
        "not part of the verdict); seed sd = the sample standard deviation over seeds of each seed's best / final "
        "accuracy, theirs and ours (the between-seed spread); all recorded seeds = Δ over every seed of ours in "
        "`seeds_<partition>.json` (the table's and more) and every repetition of theirs, with the standard error of "
        "the difference (pooled sd of both sides; not part of the verdict). Δ = ours − theirs, in points. "
        "Verdict: agree when both |Δ best| and |Δ final| are within the common tolerance; else explained (the "
        "method's note, within its "
        "own tolerance); else differs. `make crosscheck` reruns our side and fails a cell beyond its tolerance "
        "unless our side stays within its own seed noise of the seeds recorded in `seeds_<partition>.json` "
        f"({spec.get('seed_noise_z', 'no')} standard errors; on the CPU that recorded the curves our runs repeat "
        "them bit for bit, on another one they land elsewhere within that noise).",
        "",
        "| method | partition | external code (commit) | theirs best / final | ours best / final | Δ best | "
        "Δ final | Δ last 5 | seed sd best / final: theirs; ours | all recorded seeds: Δ best (se) / Δ final (se); "
        "seeds ours, theirs | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['partition']} | {r['external']} `{r['algo']}` ({r['commit'][:10]}) | "
            f"{r['theirs_best']:.2f} / {r['theirs_final']:.2f} | {r['ours_best']:.2f} / {r['ours_final']:.2f} | "
            f"{r['d_best']:+.2f} | {r['d_final']:+.2f} | {r.get('d_tail', float('nan')):+.2f} | {_spread(r)} | "
            f"{_all_seeds(r)} | "
            f"{r['verdict']} |")
    done = {(r["method"], r["partition"]) for r in rows}
    pending = [f"{m}/{p}" for m in spec["methods"] for p in method_partitions(spec, m) if (m, p) not in done]
    if pending:
        lines += ["", "Configured in `conf/crosscheck.yaml`, not run on both sides yet: " + ", ".join(pending) + "."]
    missing = [m for m in spec.get("no_public_code", {})]
    if missing:
        lines += ["", "Methods with no public implementation to check against: "
                  + "; ".join(f"{m} ({why})" for m, why in spec["no_public_code"].items()) + "."]
    own = {m: v["settings"] for m, v in spec["methods"].items() if v.get("settings")}
    if own:
        lines += ["", "Methods with their own settings (where the algorithm needs them; `conf/crosscheck.yaml`): "
                  + "; ".join(f"{m}: {text}" for m, text in own.items()) + "."]
    unchecked = spec.get("not_checked") or {}
    if unchecked:
        lines += ["", "Not cross-checked yet: " + "; ".join(f"{m} ({why})" for m, why in unchecked.items()) + "."]
    lines += ["", "Figures: `results/crosscheck/figures/<method>-<partition>.png` (both sides' learning curves per "
              "seed); "
              "curves and exact settings: `reference_<partition>.json` (theirs) and `ours_<partition>.json`; our side "
              "with more seeds, where two could not tell a difference from noise: `seeds_<partition>.json` (with "
              "theirs' extra repetitions of `reference_seeds_<partition>.json` where there are some)."]
    return "\n".join(lines) + "\n"


def select(spec: Mapping[str, Any], methods: Sequence[str] | None, which: str, results: Path,
           partitions: Sequence[str] | None) -> list[tuple[str, str]]:
    """The (method, partition) cells to check: those with a committed reference among the chosen ones."""
    if which == "ci":
        names = list(spec.get("ci") or [])
        first = next(iter(spec["partitions"]))
        parts_for = {m: [first] for m in names}
    else:
        names = list(methods or spec["methods"])
        parts_for = {m: method_partitions(spec, m) for m in names}
    unknown = [m for m in names if m not in spec["methods"]]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}: choose from {', '.join(spec['methods'])}")
    cells = [(m, p) for m in names for p in parts_for[m] if partitions is None or p in partitions]
    explicit = methods is not None or which == "ci"
    have = [(m, p) for m, p in cells if reference_path(results, m, p).is_file()]
    if explicit and len(have) != len(cells):
        lost = [f"{m}/{p}" for m, p in cells if (m, p) not in have]
        raise FileNotFoundError(f"no reference curves for {', '.join(lost)} under {results}: run "
                                "scripts/crosscheck_external.py for them first")
    if len(have) != len(cells):
        print("no reference yet (not checked): " + ", ".join(f"{m}/{p}" for m, p in cells if (m, p) not in have),
              file=sys.stderr)
    if not have:
        raise FileNotFoundError(f"no reference curves under {results}: run scripts/crosscheck_external.py first")
    return have


def write_outputs(spec: Mapping[str, Any], results: Path, rows: Sequence[Mapping[str, Any]],
                  curves: Mapping[tuple[str, str], Mapping[str, Sequence[float]]] | None = None
                  ) -> list[dict[str, Any]]:
    """Write our curves and figures for the freshly run cells (``curves``), then rebuild ``table.json`` and
    ``README.md`` from every ``<method>/ours_<partition>.json`` under ``results`` that has a reference: the fresh
    rows as given, the others compared again from their files (so a changed tolerance or note shows). The rows."""
    seeds = [int(s) for s in spec["setting"]["seeds"]]
    for (m, p), ours in (curves or {}).items():
        (results / m).mkdir(parents=True, exist_ok=True)
        (results / m / f"ours_{p}.json").write_text(json.dumps(
            {"method": m, "partition": p, "overrides": our_overrides(spec, m, p, seeds[0])[:-1],
             "seeds": seeds, "metric": f"weighted_acc, stage {stage(spec, m)}, every evaluation", "curves": ours},
            indent=1) + "\n")
        ref = load_reference(results, m, p)
        figure(results / "figures" / f"{m}-{p}.png", m, p, ours, ref["curves"], ref["external"]["repo"])
    fresh = {(r["method"], r["partition"]): r for r in rows}
    all_rows = []
    for f in sorted(results.glob("*/ours_*.json")):
        o = json.loads(f.read_text())
        key = (o["method"], o["partition"])
        if key in fresh:
            all_rows.append(dict(fresh[key]))
        elif o["method"] in spec["methods"] and reference_path(results, *key).is_file():
            all_rows.append(compare(spec, *key, o["curves"], load_reference(results, *key)))
    order = {m: i for i, m in enumerate(spec["methods"])}
    all_rows.sort(key=lambda r: (order.get(r["method"], 999), r["partition"]))
    for row in all_rows:
        row["all_seeds"] = recorded_seeds(spec, results, row["method"], row["partition"])
    (results / "table.json").write_text(json.dumps(all_rows, indent=1) + "\n")
    (results / "README.md").write_text(table_markdown(spec, all_rows))
    return all_rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default=str(SPEC))
    parser.add_argument("--results", default=str(RESULTS), help="where the reference curves live")
    parser.add_argument("--methods", nargs="+", help="default: every method with a reference")
    parser.add_argument("--partitions", nargs="+")
    parser.add_argument("--set", choices=("all", "ci"), default="all", help="ci: the spec's reduced set")
    parser.add_argument("--seeds", nargs="+", type=int,
                        help="our seeds instead of the spec's (the references under --results must have as many)")
    parser.add_argument("--out-dir", help="our runs' folder (default: a fresh temporary one, removed after)")
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel (one thread each)")
    parser.add_argument("--write", action="store_true", help="write our curves, figures and the table to --results")
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing: rebuild table.json and README.md under --results from the curves there "
                             "(ours_*.json, reference_*.json) and the spec's tolerances and notes")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides for every one of our runs (tests)")
    args = parser.parse_args(argv)
    with config_phase():
        spec = load_spec(args.spec)
        if args.seeds:
            if len(set(args.seeds)) != len(args.seeds):
                raise ValueError(f"--seeds {args.seeds} repeats a seed: give each seed once")
            spec = {**spec, "setting": {**spec["setting"], "seeds": list(args.seeds)}}
        results = Path(args.results)
        if args.table_only:
            if not sorted(results.glob("*/ours_*.json")):
                raise FileNotFoundError(f"no curves of ours (<method>/ours_<partition>.json) under {results}: "
                                        "run with --write first")
        else:
            cells = select(spec, args.methods, args.set, results, args.partitions)
            refs = {(m, p): load_reference(results, m, p) for m, p in cells}
    if args.table_only:
        rows = write_outputs(spec, results, [])
        print(f"wrote {results / 'table.json'} and {results / 'README.md'}: {len(rows)} row(s)")
        return 0
    seeds = [int(s) for s in spec["setting"]["seeds"]]
    jobs = [(m, p, s) for m, p in cells for s in seeds]
    with tempfile.TemporaryDirectory(prefix="crosscheck-") as tmp:
        curves = run_ours(spec, jobs, Path(args.out_dir or tmp), args.workers, args.extra)
    rows, ours_curves = [], {}
    for m, p in cells:
        ours = {str(s): curves[(m, p, s)] for s in seeds}
        ours_curves[(m, p)] = ours
        row = compare(spec, m, p, ours, refs[(m, p)])
        rows.append(row)
        print(f"{m:10s} {p:6s} ours {row['ours_best']:6.2f}/{row['ours_final']:6.2f}  theirs "
              f"{row['theirs_best']:6.2f}/{row['theirs_final']:6.2f}  Δ {row['d_best']:+.2f}/{row['d_final']:+.2f}  "
              f"{row['verdict']}")
    held = {(r["method"], r["partition"]): open_difference_held(spec, results, r, ours_curves[(r["method"],
                                                                                              r["partition"])])
            or within_seed_noise(spec, results, r, ours_curves[(r["method"], r["partition"])])
            for r in rows if not r["ok"]}
    for (m, p), words in held.items():
        if words:
            print(f"{m}/{p}: {words}")
    same = [repeats_committed(spec, results, m, p, ours_curves[(m, p)]) for m, p in cells]
    print(f"our side repeats its committed curves bit for bit in {same.count(True)} of {len(cells)} cell(s)"
          + (f" ({same.count(None)} with none committed from the same settings)" if None in same else ""))
    if args.write:
        write_outputs(spec, results, rows, ours_curves)
    drifted = [r for r in rows if not r["ok"] and not held[(r["method"], r["partition"])]]
    if drifted:
        print("crosscheck FAILED: " + ", ".join(f"{r['method']}/{r['partition']}" for r in drifted)
              + " beyond tolerance", file=sys.stderr)
        return 1
    noise = [key for key, words in held.items() if words]
    print(f"crosscheck passed: {len(rows)} cell(s)" + (f", {len(noise)} of them beyond tolerance and within seed "
                                                        "noise or a known open difference" if noise else ""))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
