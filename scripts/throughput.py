"""Wall-clock of a whole table (``make table2``) and whether two runs of it computed the same records.

    python scripts/throughput.py run --label after [--tree DIR] [--out /tmp/throughput] [-- launcher.max_concurrent=2]
    python scripts/throughput.py compare /tmp/throughput/runs_before /tmp/throughput/runs_after

``run`` times ``python -m bench.experiment.table conf/paper/fedcac/table2.yaml --scale mini --launcher local`` run from
``--tree`` (a copy of the project, e.g. with the launcher of another commit; default: this one) into fresh
``<out>/runs_<label>`` and ``<out>/results_<label>``, with the load averages before and after (the machine may be
shared) and the CPU time of all its processes (user + system: less sensitive to the load than the wall-clock),
and writes ``<out>/<label>.json``. ``compare`` checks every run of one output folder against the same
run of the other: ``rounds.jsonl`` and ``summary.json`` byte for byte (``summary.json`` without its ``code``
identity when the trees differ in git state); timing files are not records. Exit status 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TABLE = ["-m", "bench.experiment.table", "conf/paper/fedcac/table2.yaml", "--scale", "mini", "--launcher", "local"]


def load() -> str:
    """The 1, 5 and 15 minute load averages (as ``uptime`` shows them)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(label: str, tree: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    runs, results = out / f"runs_{label}", out / f"results_{label}"
    if runs.exists():
        raise SystemExit(f"{runs} exists: a timing needs a fresh output folder; remove it or choose another --label")
    # relative to the tree (the table's working directory): the same command whatever the folders are called
    command = [sys.executable, *TABLE, "--out-dir", os.path.relpath(runs, tree), "--results",
               os.path.relpath(results, tree), *(["--", *extra] if extra else [])]
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(tree),
           "PFL_DATA_ROOT": os.environ.get("PFL_DATA_ROOT", str(ROOT / "data"))}
    out.mkdir(parents=True, exist_ok=True)
    before = load()
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall = time.time() - start
    used = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process of the table that was waited for
    cpu_s = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
    (out / f"{label}.log").write_text(proc.stdout + proc.stderr)
    result = {"label": label, "command": " ".join(command[1:]), "tree": str(tree), "wall_s": round(wall, 1),
              "cpu_s": round(cpu_s, 1), "load_before": before, "load_after": load(), "returncode": proc.returncode,
              "runs": len(list(runs.rglob("summary.json"))), "started": time.strftime("%Y-%m-%d %H:%M:%S",
                                                                                       time.localtime(start))}
    (out / f"{label}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def records(run_dir: Path, drop_code: bool) -> tuple[bytes, bytes]:
    summary = (run_dir / "summary.json").read_bytes()
    if drop_code:
        summary = json.dumps({k: v for k, v in json.loads(summary).items() if k != "code"}, sort_keys=True).encode()
    return (run_dir / "rounds.jsonl").read_bytes(), summary


def compare(a: Path, b: Path) -> dict[str, Any]:
    found = [{p.parent.relative_to(root) for p in root.rglob("summary.json") if ".stale" not in p.parts}
             for root in (a, b)]
    codes = {json.loads(p.read_text()).get("code", {}).get("hash")
             for root in (a, b) for p in root.rglob("summary.json")}
    drop_code = False
    differ = []
    for rel in sorted(found[0] & found[1]):
        first, second = records(a / rel, False), records(b / rel, False)
        if first != second and first[0] == second[0]:  # maybe only the code identity (git state) differs
            drop_code = True
            first, second = records(a / rel, True), records(b / rel, True)
        if first != second:
            differ.append(str(rel))
    return {"compared": len(found[0] & found[1]), "identical": len(found[0] & found[1]) - len(differ),
            "differ": differ, "only_in_first": sorted(map(str, found[0] - found[1])),
            "only_in_second": sorted(map(str, found[1] - found[0])), "code_hashes": len(codes),
            "summary_code_field_ignored": drop_code}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    timed = sub.add_parser("run", help="time the table into fresh output folders")
    timed.add_argument("--label", required=True)
    timed.add_argument("--tree", type=Path, default=ROOT, help="the project copy to run (its bench, conf)")
    timed.add_argument("--out", type=Path, default=Path("/tmp/throughput"))
    timed.add_argument("extra", nargs="*", help="overrides after '--' (launcher.max_concurrent=2, ...)")
    same = sub.add_parser("compare", help="are the records of two output folders identical")
    same.add_argument("first", type=Path)
    same.add_argument("second", type=Path)
    args = parser.parse_args(argv)
    if args.what == "run":
        result = run(args.label, args.tree.resolve(), args.out.resolve(), args.extra)
    else:
        result = compare(args.first, args.second)
    print(json.dumps(result, indent=1))
    keys = ("returncode", "differ", "only_in_first", "only_in_second")
    return 1 if any(result.get(key) for key in keys) else 0


if __name__ == "__main__":
    sys.exit(main())
