"""The demo: one column of a paper table, trained here, beside the paper's numbers, with a figure and a web page.

``conf/demo/demo.yaml`` names a table spec, a scale and the columns to run (FedCAC Table 1's first column at the mini
scale: FedCAC against its six baselines on the real Fashion-MNIST). The cells are exactly those of
``make <paper>-<table>``, run, collected and rendered through the same path (``bench.experiment.cells``,
``bench.experiment.collect``, ``bench.experiment.render``), but every file goes under ``--out`` (default
``results/demo``), so no committed result changes:

- ``<out>/<paper>/<table>.md`` (+ ``.csv``, ``.tex``, ``.stats.json``): ours (mean ± std over seeds) beside the
  paper's, the paired differences against the paper's method with their sign marks, Kendall's tau of the ordering;
- ``<out>/<paper>/figures/curves/<table>_<column>.png`` (+ ``.pdf``): learning curves, mean ± std over seeds;
- ``<out>/index.html``: the results page (``bench.experiment.report``) of all of it;
- ``<out>/runs/``: the run records (finished runs are reused by a second ``make demo``).

Usage: ``python scripts/demo.py [--out results/demo] [--config conf/demo/demo.yaml] [--seeds 0 1]
[--launcher local] [-- extra Hydra overrides ...]``. Exits 1 when a run failed or did not train.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
# the code of this script's own tree, also when the venv's editable install points at another checkout
sys.path.insert(0, str(ROOT))

from bench.experiment.cells import run_cells  # noqa: E402
from bench.experiment.collect import collect  # noqa: E402
from bench.experiment.errors import config_phase, run_cli  # noqa: E402
from bench.experiment.launch import load_launcher  # noqa: E402
from bench.experiment.plots import spec_curves  # noqa: E402
from bench.experiment.render import write_table  # noqa: E402
from bench.experiment.report import build  # noqa: E402
from bench.experiment.spec import expand, label, load_spec, scale_columns  # noqa: E402
from bench.experiment.tuning import tune  # noqa: E402

CONFIG = ROOT / "conf" / "demo" / "demo.yaml"
CONFIG_KEYS = {"spec", "scale", "columns", "seeds"}


def demo_spec(config: dict[str, Any]) -> dict[str, Any]:
    """The table spec that ``config`` names, restricted to its ``columns`` at its ``scale``."""
    unknown = sorted(set(config) - CONFIG_KEYS)
    if unknown:
        raise ValueError(f"demo config has unknown key(s) {unknown}; it takes {sorted(CONFIG_KEYS)}")
    spec = load_spec(ROOT / config["spec"])
    scale = config["scale"]
    known = [c["name"] for c in scale_columns(spec, scale)]
    wanted = list(config.get("columns") or known)
    if not set(wanted) <= set(known):
        raise ValueError(f"demo config: columns={wanted} names a column {spec['paper']}/{label(spec)} does not "
                         f"run at scale {scale}; its columns: {known}")
    spec.setdefault("scales", {}).setdefault(scale, {})["columns"] = wanted
    return spec


def intro(spec: dict[str, Any], config: dict[str, Any], runs: int, trained: int, seconds: float) -> list[str]:
    """The paragraphs at the top of the demo's page: what ran (``trained`` of the ``runs`` now, the others reused)
    and where the whole table comes from."""
    columns = ", ".join(config.get("columns") or [])
    rows = ", ".join(r["name"] for r in spec["rows"] if not r.get("unavailable"))
    return [
        f"**{spec['paper']} {label(spec)}** ({spec.get('title', '')}), column(s) {columns}, at the "
        f"**{config['scale']}** scale: {rows}; {runs} runs, {trained} of them trained now on this machine "
        f"({'the others reused from earlier; ' if trained < runs else ''}{seconds:.0f} s for the whole demo: "
        f"`make demo`, `{config['spec']}`).",
        "Our numbers stand beside the paper's published ones; below the table, the paper's method minus each other "
        "row, paired over seeds, with ✓ where the sign agrees with the paper's difference, and Kendall's tau between "
        "our ordering of the rows and the paper's. The mini scale is a small stand-in: orderings, not absolute "
        f"numbers, are what to compare. The whole table: `make {spec['paper']}-{label(spec)}` "
        f"(results/{spec['paper']}/{label(spec)}.md).",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/demo", help="where everything goes (default: results/demo)")
    parser.add_argument("--config", default=str(CONFIG), help="the demo's config (default: conf/demo/demo.yaml)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the config's, else the spec's")
    parser.add_argument("--launcher", default="local", help="conf/launcher/<name>.yaml: local, inline or slurm")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every cell, e.g. rounds=10")
    argv = list(sys.argv[1:] if argv is None else argv)
    after = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.overrides += after
    out = Path(args.out)
    started, wall_start = time.monotonic(), time.time()
    with config_phase():
        if not Path(args.config).is_file():
            raise FileNotFoundError(f"demo config {args.config} does not exist: give --config conf/demo/demo.yaml")
        config = OmegaConf.to_container(OmegaConf.load(args.config), resolve=True)
        spec = demo_spec(config)  # type: ignore[arg-type]
        launcher = load_launcher(args.launcher)
        scale = config["scale"]  # type: ignore[index]
        seeds = args.seeds if args.seeds is not None else config.get("seeds")  # type: ignore[union-attr]
    if spec.get("tuning"):  # rows searched on validation data first, as bench.experiment.table does
        spec = tune(spec, scale, launcher, str(out / "runs"), args.overrides, str(out))
    with config_phase():
        cells = expand(spec, scale, seeds, str(out / "runs"), args.overrides)
    dirs = run_cells(cells, launcher=launcher, spec=spec, scale=scale)
    trained = sum(1 for d in set(dirs.values()) if (d / "summary.json").exists()
                  and (d / "summary.json").stat().st_mtime >= wall_start)
    frame, problems = collect(spec, scale, dirs)
    table = write_table(spec, scale, frame, problems, out)
    curves = spec_curves(spec, scale, str(out / "runs"), str(out), seeds, args.overrides)
    figures = [p for p in curves if p.suffix == ".png"]
    seconds = time.monotonic() - started
    page = build(out, out / "index.html", title="pflrepro demo",
                 intro=intro(spec, config, len(cells), trained, seconds))  # type: ignore[arg-type]
    print(table.read_text())
    cpu = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    print(f"wrote {table}, {', '.join(map(str, figures))} and {page} in {seconds:.0f} s ({cpu:.0f} CPU-s)")
    print(f"open it: {page.resolve().as_uri()}")
    unfinished = [p for p in problems if not p.startswith("not run: ")]
    if unfinished:
        print(f"{len(unfinished)} runs did not finish or did not train; the table lists them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
