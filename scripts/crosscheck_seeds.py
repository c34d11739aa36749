"""Our side of one cross-check with more seeds than the table's, to tell a difference from seed noise.

    python scripts/crosscheck_seeds.py --method fedbn --seeds 2 3 [--partition pat] [--out-dir /tmp/runs]

Runs our side (the overrides of ``bench.experiment.crosscheck``) for the extra seeds, adds the table's seeds from
``results/crosscheck/<method>/ours_<partition>.json`` (runs are deterministic, so those are not run again, nor an
extra seed that the existing ``seeds_<partition>.json`` holds from the same overrides), and writes
``results/crosscheck/<method>/seeds_<partition>.json``: every seed's curve, each side's per-seed best / final /
last-5 accuracy with their mean and between-seed standard deviation, and per quantity Δ = ours − theirs with the
standard error of that difference (pooled standard deviation of both sides' seeds). Theirs are the committed
reference's repetitions and, where ``reference_seeds_<partition>.json`` exists (``scripts/crosscheck_external.py
--seeds ... --extra``), its extra repetitions too.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.experiment.crosscheck import (  # noqa: E402
    RESULTS,
    SPEC,
    load_spec,
    our_overrides,
    run_ours,
    spread,
    stage,
    their_curves,
    training_overrides,
)


def kept_curves(previous: Mapping[str, Any] | None, overrides: Sequence[str],
                seeds: Sequence[int]) -> dict[str, list[float]]:
    """Our curves of ``seeds`` that an earlier ``seeds_<partition>.json`` (``previous``) holds from the same
    overrides: runs are deterministic, so those are not run again."""
    if previous is None or training_overrides(previous.get("overrides", [])) != training_overrides(overrides):
        return {}
    return {str(s): previous["curves"][str(s)] for s in seeds if str(s) in previous["curves"]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", required=True)
    parser.add_argument("--seeds", nargs="+", type=int, required=True, help="seeds beyond the table's")
    parser.add_argument("--partition", default="pat")
    parser.add_argument("--spec", default=str(SPEC))
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--out-dir", help="our runs' folder (default: a temporary one)")
    parser.add_argument("--workers", type=int, default=1, help="our runs at the same time (one thread each)")
    args = parser.parse_args(argv)
    spec = load_spec(args.spec)
    results = Path(args.results)
    m, p = args.method, args.partition
    table = json.loads((results / m / f"ours_{p}.json").read_text())["curves"]
    try:
        theirs = their_curves(results, m, p)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    clash = sorted(set(map(str, args.seeds)) & set(table))
    if clash:
        raise SystemExit(f"error: seed(s) {', '.join(clash)} are the table's already: give other --seeds")
    overrides = our_overrides(spec, m, p, 0)[:-1]
    out = results / m / f"seeds_{p}.json"
    kept = kept_curves(json.loads(out.read_text()) if out.is_file() else None, overrides, args.seeds)
    with tempfile.TemporaryDirectory(prefix="crosscheck-seeds-") as tmp:
        jobs = [(m, p, s) for s in args.seeds if str(s) not in kept]
        new = run_ours(spec, jobs, Path(args.out_dir or tmp), args.workers) if jobs else {}
    curves = {**table, **kept, **{str(s): new[(m, p, s)] for _, _, s in jobs}}
    curves = {s: curves[s] for s in sorted(curves, key=int)}
    doc = {"method": m, "partition": p, "overrides": overrides,
           "seeds": [int(s) for s in curves], "table_seeds": [int(s) for s in table],
           "metric": f"weighted_acc, stage {stage(spec, m)}, every round; theirs: the committed reference's "
                     "repetitions" + (f" and the extra ones of reference_seeds_{p}.json"
                                      if (results / m / f"reference_seeds_{p}.json").is_file() else ""),
           "theirs_seeds": [int(s) for s in theirs],
           "command": f"python scripts/crosscheck_seeds.py --method {m} --partition {p} --seeds "
                      + " ".join(map(str, args.seeds)),
           "curves": curves, **spread(curves, theirs)}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for q, d in doc["delta"].items():
        print(f"{m} {p} {q}: ours {doc['ours'][q]['mean']:.2f} (sd {doc['ours'][q]['sd']:.2f}, {len(curves)} seeds) "
              f"theirs {doc['theirs'][q]['mean']:.2f} (sd {doc['theirs'][q]['sd']:.2f}, {len(theirs)})  "
              f"Δ {d['delta']:+.2f} (se {d['se']:.2f})")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
