"""Write the claims ledgers: every paper's claims judged at one scale from the runs that exist
(:mod:`bench.experiment.claims`; trains nothing).

Command line (writes ``results/<paper>/[<scale>/]claims.{json,md}``)::

    python -m bench.experiment.ledger [fedcac pa3dfl ...] --scale medium [--out-dir runs] [--results results]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from bench.experiment.claims import (
    PAPERS,
    Evidence,
    _spec,
    combine,
    comparisons,
    evidence_of,
    load_claims,
    scale_block,
    standin_of_claim,
    summary_line,
    thresholds,
    write_ledger,
)
from bench.experiment.spec import SCALES


def gather(spec: dict[str, Any], scale: str, out_dir: str = "runs", results_dir: str = "results") -> Evidence:
    """The evidence of ``spec`` at ``scale`` from the runs that exist (the table's manifest, else composed)."""
    from bench.experiment.collect import collect
    from bench.experiment.manifest import cell_dirs
    from bench.experiment.spec import expand
    from bench.experiment.tuning import with_tuned

    spec = with_tuned(spec, scale, results_dir)
    cells = expand(spec, scale, None, out_dir)
    dirs = cell_dirs(spec, scale, cells, results_dir)
    frame, _ = collect(spec, scale, dirs)
    return evidence_of(spec, scale, frame, dirs)


def ledger(paper: str, scale: str, out_dir: str = "runs", results_dir: str = "results",
           conf: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every claim of ``paper`` with its verdict at ``scale``: ``{id, quote, section, scale, verdict, reason,
    cells}``."""
    conf = conf or thresholds()
    evidence: dict[str, Evidence] = {}
    entries = []
    for claim in load_claims(paper):
        entry = {"id": claim["id"], "quote": claim["quote"], "section": claim["section"], "scale": scale,
                 "kind": claim["kind"], "spec": claim.get("spec")}
        if claim.get("spec") is None:
            entries.append({**entry, "verdict": "cannot test", "reason": f"not built: {claim['untestable']}",
                            "cells": []})
            continue
        spec = _spec(paper, claim["spec"])
        if scale != "paper" and not scale_block(spec, scale):
            entries.append({**entry, "verdict": "cannot test",
                            "reason": f"not built: {claim['spec']} has no {scale} scale (scales.{scale})",
                            "cells": []})
            continue
        if claim["spec"] not in evidence:
            evidence[claim["spec"]] = gather(spec, scale, out_dir, results_dir)
        found = evidence[claim["spec"]]
        if not any(found.values.values()) and not any(found.state(r["name"], c) for r in found.spec["rows"]
                                                      for c in found.columns):
            entries.append({**entry, "verdict": "cannot test", "cells": [],
                            "reason": standin_of_claim(claim, found) or
                            f"no runs: {claim['spec']} has no finished run at the {scale} scale here"})
            continue
        cells = comparisons(claim, found, conf)
        verdict, reason = combine(cells)
        entries.append({**entry, "verdict": verdict, "reason": reason, "cells": cells})
    return entries


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("papers", nargs="*", default=list(PAPERS), help=f"papers (default: all of {PAPERS})")
    parser.add_argument("--scale", default="mini", choices=SCALES)
    parser.add_argument("--out-dir", default="runs", help="where the run directories are")
    parser.add_argument("--results", default="results", help="where the ledgers go")
    args = parser.parse_args(argv)
    for paper in args.papers:
        if paper not in PAPERS:
            parser.error(f"paper {paper!r} is not one of {', '.join(PAPERS)}")
        entries = ledger(paper, args.scale, args.out_dir, args.results)
        path = write_ledger(paper, args.scale, entries, args.results)
        print(f"wrote {path}: {summary_line(paper, args.scale, entries)}")


if __name__ == "__main__":
    main()
