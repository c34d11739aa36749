"""FedC2I Figure 3 from run records: heatmaps of every client's influence vector lambda_m at chosen rounds;
Figure 4 from the data: example training images of five classes in every domain of Digit-5 and Office-10.

    python scripts/fedc2i/figures.py fig3 [--scale mini] [--seed 0] [--rounds 1 2 10 20]
    python scripts/fedc2i/figures.py fig3 --run RUN_DIR      # any FedC2I run directory
    python scripts/fedc2i/figures.py fig4 [--scale mini]     # mini: the stand-ins; paper: the real sets (data root)
    python scripts/fedc2i/figures.py all [--scale mini]      # Fig. 3 wherever its runs exist (make plots)

Each heatmap is one round: row m is client m's influence vector lambda_m (Eq. 5: how much each client's
upload lowers client m's loss, normalised to sum to one), as FedC2I records it every round (``kind: method``
records, ``influence``). Fig. 3 (a)-(d) is Digit-5 (the FedC2I run of Table 1), (e)-(h) Office-10 (Table 2).
Default rounds: the paper's (1, 2, 10, 20 of 20 for Digit-5; 1, 4, 10, 40 of 40 for Office-10) scaled to the
run's length, e.g. 1, 2, 3, 6 of the mini tables' 6 rounds. PNG + PDF under results/fedc2i/figures/.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from bench.core.data import load_sources  # noqa: E402
from bench.experiment.plots import STYLE, finished_run, heatmap, save  # noqa: E402
from bench.experiment.spec import output_base  # noqa: E402
from common.verified_io import read_jsonl  # noqa: E402
from datasets.sources import DataSourceError, ImageData  # noqa: E402

CONF = Path(__file__).resolve().parents[2] / "conf"
SPECS = CONF / "paper" / "fedc2i"
#: Fig. 3's panels: (table spec, the paper's rounds, the paper's round count)
PANELS = {"Digit-5": ("table1.yaml", (1, 2, 10, 20), 20), "Office-10": ("table2.yaml", (1, 4, 10, 40), 40)}


def scaled_rounds(paper_rounds: Sequence[int], paper_total: int, total: int) -> list[int]:
    """The paper's chosen rounds mapped onto a run of ``total`` rounds: the early ones (within the first tenth
    of the paper's run) kept as they are, the others scaled; the last stays last."""
    early = {r for r in paper_rounds if r <= max(1, paper_total // 10) and r <= total}
    late = {max(1, min(total, round(r * total / paper_total))) for r in paper_rounds if r > paper_total // 10}
    return sorted(early | late)


def influence_records(run: Path) -> dict[int, dict]:
    """Round -> FedC2I's method record (``influence`` [M][M], ``influence_clients``) of one run."""
    found = {r["round"]: r for r in read_jsonl(run / "rounds.jsonl") if r.get("kind") == "method" and "influence" in r}
    if not found:
        raise ValueError(f"{run} has no influence records: is it a FedC2I run (method=fedc2i)?")
    return found


def client_names(run: Path, count: int) -> list[str]:
    """The clients' domains (``dataset.domains``, one client per domain), else client numbers."""
    domains = OmegaConf.load(run / "config.yaml").dataset.get("domains") or []
    names = [str(d).removeprefix("standin_") for d in domains]
    return names[:count] if len(names) >= count else [f"client {i}" for i in range(count)]


def fig3(run: Path, rounds: Sequence[int] | None = None, name: str = "", out: Path | None = None) -> list[Path]:
    """One heatmap per chosen round of the influence vectors of every client of ``run``."""
    records = influence_records(run)
    total = max(records)
    if rounds is None:
        paper_rounds, paper_total = next(((r, t) for (_, r, t) in PANELS.values()), ((1, 2, 10, 20), 20))
        rounds = scaled_rounds(paper_rounds, paper_total, total)
    missing = [t for t in rounds if t not in records]
    if missing:
        raise ValueError(f"{run} has no influence record for rounds {missing}; it has rounds 1..{total}")
    labels = client_names(run, len(records[rounds[0]]["influence_clients"]))
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(rounds), figsize=(2.6 * len(rounds) + 0.8, 2.9), layout="constrained")
        axes = [axes] if len(rounds) == 1 else list(axes)
        for ax, t in zip(axes, rounds, strict=True):
            image = heatmap(ax, records[t]["influence"], labels, f"round {t}")
            ax.set_xlabel("client i (upload)")
        axes[0].set_ylabel("client m (influence vector)")
        fig.colorbar(image, ax=axes, fraction=0.02)
        fig.suptitle(f"FedC2I influence vectors lambda_m {name}".strip())
        target = out or output_base("fedc2i", "figures", "mini") / f"fig3_{run.name}"
        return save(fig, target)


#: Fig. 4's data sets: the dataset config at paper scale and the stand-in drawn at the mini and medium scales
FIG4_DATASETS = {"Digit-5": ("digit5", "digit5_standin"), "Office-10": ("office10", "office10_standin")}
#: the paper shows five classes per data set without naming the choice; we show the first five labels
FIG4_CLASSES = 5


def dataset_config(name: str) -> dict:
    """``conf/dataset/<name>.yaml`` with its ``${dataset.*}`` interpolations resolved."""
    return OmegaConf.to_container(OmegaConf.create({"dataset": OmegaConf.load(CONF / "dataset" / f"{name}.yaml")}),
                                  resolve=True)["dataset"]


def class_examples(domains: Sequence[ImageData], classes: int = FIG4_CLASSES) -> list[list]:
    """[domain][class] -> the first training image ([C, H, W] in [0, 1]) of each of the first ``classes`` labels."""
    grid = []
    for part in domains:
        row = []
        for label in range(classes):
            (index,) = (part.labels == label).nonzero()[:1].flatten().tolist() or [None]
            if index is None:
                raise ValueError(f"domain {part.domain!r} has no training image of class {label}")
            row.append(part.images[index])
        grid.append(row)
    return grid


def fig4(scale: str, data_root: str | None, out_dir: Path | None = None) -> list[Path]:
    """One panel per data set: a row per domain, a column per class (the paper's Fig. 4 shows Digit-5 and Office-10
    with five classes each, to show the feature shift between domains). Below paper scale, the stand-ins."""
    paths: list[Path] = []
    for title, (paper_name, standin) in FIG4_DATASETS.items():
        cfg = dataset_config(paper_name if scale == "paper" else standin)
        train, _ = load_sources(cfg, data_root)
        grid = class_examples(train)
        names = train[0].classes[:FIG4_CLASSES]
        with plt.rc_context(STYLE):
            fig, axes = plt.subplots(len(grid), FIG4_CLASSES, figsize=(1.3 * FIG4_CLASSES + 1.2, 1.3 * len(grid)),
                                     layout="constrained", squeeze=False)
            for r, (part, row) in enumerate(zip(train, grid, strict=True)):
                for c, image in enumerate(row):
                    ax = axes[r][c]
                    pixels = image.permute(1, 2, 0).clamp(0, 1).numpy()
                    ax.imshow(pixels[..., 0] if pixels.shape[-1] == 1 else pixels, cmap="gray", vmin=0, vmax=1)
                    ax.set_xticks([])
                    ax.set_yticks([])
                    if r == 0:
                        ax.set_title(str(names[c]), fontsize=8)
                axes[r][0].set_ylabel(part.domain.removeprefix("standin_"), fontsize=8)
            note = "" if scale == "paper" else f" (stand-in {standin}, not {title})"
            fig.suptitle(f"{title}: one training image per class and domain{note}", fontsize=9)
            target = (out_dir or output_base("fedc2i", "figures", scale)) / f"fig4_{title.lower().replace('-', '')}"
            paths += save(fig, target)
    return paths


def every_figure(scale: str, seed: int, rounds: Sequence[int] | None = None) -> list[Path]:
    """Fig. 3 for every data set whose FedC2I table run exists (Digit-5: Table 1, Office-10: Table 2)."""
    paths: list[Path] = []
    for dataset, (spec, paper_rounds, paper_total) in PANELS.items():
        run = finished_run(SPECS / spec, scale, "FedC2I", seed=seed)
        if run is None:
            print(f"skipped fig3 {dataset}: no finished FedC2I run of {spec} seed {seed} "
                  f"(make fedc2i-{spec.removesuffix('.yaml')} SCALE={scale})")
            continue
        chosen = rounds or scaled_rounds(paper_rounds, paper_total, max(influence_records(run)))
        suffix = "" if scale == "paper" else " (mini stand-in)"
        paths += fig3(run, chosen, f"- {dataset}{suffix}, seed {seed}",
                      output_base("fedc2i", "figures", scale) / f"fig3_{dataset.lower().replace('-', '')}")
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=["fig3", "fig4", "all"])
    parser.add_argument("--scale", default="mini", choices=["mini", "medium", "paper"])
    parser.add_argument("--seed", type=int, default=0, help="which seed's run to draw")
    parser.add_argument("--rounds", type=int, nargs="+", help="rounds to draw (default: the paper's, scaled)")
    parser.add_argument("--run", type=Path, help="draw this FedC2I run directory instead of the table's")
    parser.add_argument("--data-root", default=os.environ.get("PFL_DATA_ROOT", "data"),
                        help="where the data sets live (default: $PFL_DATA_ROOT, else data/, as runs use)")
    parser.add_argument("--skip-missing", action="store_true", help="fig4: say so and exit 0 when data is absent")
    args = parser.parse_args(argv)
    if args.figure == "fig4":
        try:
            paths = fig4(args.scale, args.data_root)
        except DataSourceError as err:  # the real sets at paper scale live in the data root
            if not args.skip_missing:
                raise SystemExit(f"fig4 needs the {args.scale}-scale data: {err}") from err
            print(f"skipped fig4: {err}")
            paths = []
    elif args.run is not None:
        paths = fig3(args.run, args.rounds)
    else:
        paths = every_figure(args.scale, args.seed, args.rounds)
    print("\n".join(map(str, paths)))


if __name__ == "__main__":
    main()
