"""FedCAC figures from run records (one command each; PNG + PDF under results/fedcac/figures/).

    python scripts/fedcac/figures.py fig3 [--scale mini]   # selection schemes    (from results/fedcac/fig3*.csv)
    python scripts/fedcac/figures.py fig4 [--scale mini]   # collaboration schemes
    python scripts/fedcac/figures.py fig5 [--scale mini]   # tau sweep
    python scripts/fedcac/figures.py fig6 [--scale mini]   # beta sweep
    python scripts/fedcac/figures.py fig7 [--scale mini]   # overlap matrix of 15 clients beside their class mixes
    python scripts/fedcac/figures.py fig7 --run RUN_DIR    # ... of any FedCAC run that recorded overlap matrices
    python scripts/fedcac/figures.py fig8 [--scale mini]   # Dirichlet partitions, alpha 0.01 / 0.1 / 0.5 / 1.0
    python scripts/fedcac/figures.py fig1a [--scale mini]  # angle between two clients' updates, several alpha
    python scripts/fedcac/figures.py fig1b [--scale mini]  # last-layer sensitivity, 4:4:1:1 class mix
    python scripts/fedcac/figures.py all [--scale mini]    # every figure whose records exist (make plots)

Figs. 3-6 read the table CSVs written by ``python -m bench.experiment.table conf/paper/fedcac/figN.yaml``; Fig. 7 reads
the runs of ``conf/paper/fedcac/fig7.yaml`` (``make fedcac-fig7``); Fig. 8 builds the partitions of
``conf/paper/fedcac/fig8.yaml`` (no training); Figs. 1a and 1b train the cells of ``fig1a.yaml`` / ``fig1b.yaml``
(seeded; a ``--dry-run`` of ``bench.experiment.table`` checks those setups at paper scale). Figs. 1a, 1b, 7 and 8 state
the paper's claim and whether ours holds under the figure and in ``<figure>.caption.txt`` beside it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from bench.builder import build_experiment  # noqa: E402
from bench.experiment.plots import STYLE, save, write_caption  # noqa: E402
from bench.experiment.spec import output_base  # noqa: E402
from common.verified_io import read_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = Path("results/fedcac/figures")


def table_csv(name: str, scale: str) -> pd.DataFrame:
    path = output_base("fedcac", name, scale).with_suffix(".csv")
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run python -m bench.experiment.table conf/paper/fedcac/{name}.yaml "
                                f"--scale {scale} first")
    return pd.read_csv(path)


def bars(name: str, scale: str, title: str) -> list[Path]:
    """Grouped bars: one group per column (data set), one bar per row (scheme), error bar = std."""
    frame = table_csv(name, scale)
    columns, methods = list(dict.fromkeys(frame["column"])), list(dict.fromkeys(frame["method"]))
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(columns), 3.0))
        width = 0.8 / len(methods)
        for i, method in enumerate(methods):
            sub = frame[frame["method"] == method].set_index("column").loc[columns]
            ax.bar(np.arange(len(columns)) + i * width, sub["mean"], width, yerr=sub["std"].fillna(0), label=method)
        ax.set_xticks(np.arange(len(columns)) + 0.4 - width / 2, columns)
        ax.set_ylabel("mean client test accuracy (%)")
        ax.set_title(title + (" (mini stand-in)" if scale == "mini" else ""))
        ax.legend(fontsize=7)
        return save(fig, OUT / f"{name}{'' if scale == 'paper' else '_' + scale}")


def sweep(name: str, scale: str, param: str) -> list[Path]:
    """Accuracy against a hyperparameter (rows named "<param>=<value>"), one line per data set."""
    frame = table_csv(name, scale)
    frame["value"] = [float(re.sub(rf"^{param}=", "", m)) for m in frame["method"]]
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(4.0, 3.0))
        for column, sub in frame.groupby("column", sort=False):
            sub = sub.sort_values("value")
            ax.errorbar(sub["value"], sub["mean"], yerr=sub["std"].fillna(0), marker="o", capsize=2, label=column)
        ax.set_xlabel(param)
        ax.set_ylabel("mean client test accuracy (%)")
        ax.legend(fontsize=7)
        return save(fig, OUT / f"{name}{'' if scale == 'paper' else '_' + scale}")


# ------------------------------------------------------------------------------------------- spec-held setups
def spec_path(name: str) -> Path:
    return ROOT / "conf" / "paper" / "fedcac" / f"{name}.yaml"


def spec_cells(name: str, scale: str) -> list[tuple[str, dict]]:
    """(column, config) of every cell of ``conf/paper/fedcac/<name>.yaml`` at ``scale`` (its first seed only)."""
    from bench.experiment.spec import cell_config, expand, load_spec

    cells = expand(load_spec(spec_path(name)), scale)
    first = min(c.seed for c in cells)
    return [(c.column, cell_config(c)) for c in cells if c.seed == first]


def suffix(scale: str) -> str:
    return "" if scale == "paper" else f"_{scale}"


def finish(fig: plt.Figure, base: Path, claims: str) -> list[Path]:
    """The claim text under the figure and beside it (``<base>.caption.txt``, the results page's caption)."""
    fig.text(0.0, -0.02, claims, fontsize=7.5, va="top", wrap=True)
    return [*save(fig, base), write_caption(base, claims)]


def verdict(ok: bool) -> str:
    return "holds" if ok else "does not hold"


# -------------------------------------------------------------------------------------- Fig. 7: overlap matrix
def mix_relation(mixes: np.ndarray, i: int, j: int) -> str:
    """How two clients' class mixes relate: "same" mix, "share" a class, or "disjoint"."""
    a, b = mixes[i] / mixes[i].sum(), mixes[j] / mixes[j].sum()
    if np.allclose(a, b):
        return "same"
    return "share" if ((a > 0) & (b > 0)).any() else "disjoint"


def fig7_claims(matrices: list[np.ndarray], mixes: np.ndarray, scale: str) -> str:
    """The paper's App. A claims against the seeds' last overlap matrices (client ids as in the spec's mixes)."""
    n = len(mixes)
    groups: dict[str, list[float]] = {"same": [], "share": [], "disjoint": []}
    top1 = []
    for m in matrices:
        for i, j in itertools.combinations(range(n), 2):
            groups[mix_relation(mixes, i, j)].append(float(m[i, j]))
        top1.append(max((j for j in range(n) if j != 0), key=lambda j, m=m: (m[0, j], -j)))
    mean = {k: float(np.mean(v)) for k, v in groups.items()}
    ordered = mean["same"] > mean["share"] > mean["disjoint"]
    like = ""
    if n > 9:  # the spec's clients 8 and 9 hold the truck, like client 0's automobile
        others = [j for j in range(1, n) if mix_relation(mixes, 0, j) == "disjoint" and j not in (8, 9)]
        pair = float(np.mean([m[0, [8, 9]].mean() for m in matrices]))
        rest = float(np.mean([m[0, others].mean() for m in matrices]))
        like = (f" Client 0 with 8-9: {pair:.3f} vs its other disjoint clients {rest:.3f}" + (
            "" if scale == "paper" else " (in the Fashion-MNIST stand-in classes 1 and 9 are trouser and ankle boot, "
            "not a like pair, so this part is not tested here)") + ".")
    return ("Paper (App. A, Fig. 7): clients with similar data have overlapping critical-parameter locations; client 0 "
            "overlaps most with client 1 (same mix), then with 10 and 14 (a shared class) and 8-9 (truck, like its "
            "automobile).\n"
            f"Ours ({len(matrices)} seed(s), last recorded round; mean overlap of the pairs): same mix "
            f"{mean['same']:.3f}, a shared class {mean['share']:.3f}, disjoint {mean['disjoint']:.3f}: "
            f"ordered as the paper says: {verdict(ordered)}. Client 0's top partner is client 1 in "
            f"{sum(t == 1 for t in top1)} of {len(top1)} seeds." + like)


def fig7(run: Path, scale: str = "mini", seeds: list[Path] | None = None) -> list[Path]:
    """The last recorded overlap matrix of a FedCAC run beside its clients' train class distribution; the caption
    tests the paper's claims over ``seeds`` (runs of the same cell, default: this run) when the run's partition has
    given class mixes (``partition=class_mix``)."""
    def last(r: Path) -> dict:
        records = [x for x in read_jsonl(r / "rounds.jsonl") if x.get("kind") == "method" and "overlap_matrix" in x]
        if not records:
            raise ValueError(f"{r} has no overlap matrix: run FedCAC with method.overlap_matrix_every > 0")
        return records[-1]

    record = last(run)
    counts = pd.read_csv(run / "partition" / "class_counts.csv")
    train = counts[counts["part"] == "train"].set_index("client").filter(like="class_")
    with plt.rc_context(STYLE):
        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(8.4, 3.6), layout="constrained")
        ax0.grid(False)
        ax1.grid(False)
        shown = np.array(record["overlap_matrix"], dtype=float)
        np.fill_diagonal(shown, np.nan)  # O_ii = 1 would flatten the colour scale of the pairs
        im = ax0.imshow(shown, cmap="viridis")
        ax0.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax0.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax0.set_title(f"overlap O_ij (i != j), round {record['round']}")
        ax0.set_xlabel("client j")
        ax0.set_ylabel("client i")
        fig.colorbar(im, ax=ax0, fraction=0.046)
        im1 = ax1.imshow(train.to_numpy() / train.to_numpy().sum(1, keepdims=True), cmap="Reds", aspect="auto")
        fig.colorbar(im1, ax=ax1, fraction=0.046)
        ax1.set_title("class proportions (train)")
        ax1.set_xlabel("class")
        ax1.set_ylabel("client")
        conf = yaml.safe_load((run / "config.yaml").read_text())
        if conf["partition"]["scheme"] != "class_mix":
            return save(fig, OUT / f"fig7_{run.name}")
        mixes = np.array(conf["partition"]["mixes"], dtype=float)
        matrices = [np.array(last(r)["overlap_matrix"]) for r in (seeds or [run])]
        return finish(fig, OUT / f"fig7{suffix(scale)}", fig7_claims(matrices, mixes, scale))


def fig7_runs(scale: str, runs: str = "runs", results: str = "results") -> list[Path]:
    """The finished runs (seed order) of the Fig. 7 spec at ``scale``: from its table's manifest where it lists
    them, else from their composed configs (:func:`bench.experiment.manifest.cell_dirs`)."""
    from bench.core.records import RunDir
    from bench.experiment.manifest import cell_dirs
    from bench.experiment.spec import expand, load_spec

    spec = load_spec(spec_path("fig7"))
    found = cell_dirs(spec, scale, expand(spec, scale, out_dir=runs), results).values()
    return [r for r in found if RunDir(r).is_complete()]


# ------------------------------------------------------------------------------------------ Fig. 8: partitions
def fig8_stats(counts: np.ndarray, twin: float = 0.1) -> dict[str, float]:
    """Classes held per client (mean), the mean total-variation distance between two clients' class distributions
    (how much clients differ), and the share of clients with a near twin (another client within ``twin``)."""
    q = counts / counts.sum(1, keepdims=True)
    tv = 0.5 * np.abs(q[:, None, :] - q[None, :, :]).sum(-1)
    off = ~np.eye(len(q), dtype=bool)
    nearest = np.where(off, tv, np.inf).min(1)
    return {"classes_held": float((counts > 0).sum(1).mean()), "mean_tv": float(tv[off].mean()),
            "twins": float((nearest < twin).mean())}


def fig8_claims(stats: list[tuple[str, dict[str, float]]]) -> str:
    tv = [s["mean_tv"] for _, s in stats]
    twins = [s["twins"] for _, s in stats]
    fall = all(a > b for a, b in itertools.pairwise(tv))
    variety = twins[0] > twins[-1] and all(a >= b for a, b in itertools.pairwise(twins))
    return ("Paper (App. B, Fig. 8): at small alpha clients differ greatly but their variety is low (very similar "
            "clients are common); as alpha grows the differences shrink and the variety grows.\n"
            "Ours (seed 0): mean total-variation distance between two clients "
            + ", ".join(f"{tv_:.2f}" for tv_ in tv) + f" for {', '.join(c for c, _ in stats)}: shrinks with alpha: "
            f"{verdict(fall)}. Clients with a near twin (distance < 0.1): "
            + ", ".join(f"{t:.0%}" for t in twins) + f": variety grows with alpha: {verdict(variety)}. "
            "Classes held per client (mean): " + ", ".join(f"{s['classes_held']:.1f}" for _, s in stats) + ".")


def fig8(scale: str = "mini") -> list[Path]:
    """The partitions of the Fig. 8 spec's columns (seed 0) as dot plots side by side (size = samples)."""
    from bench.experiment.partition import partition_of, train_counts

    panels = []
    for column, cfg in spec_cells("fig8", scale):
        partition, pool, origin = partition_of(cfg)
        panels.append((column, cfg["dataset"]["name"], origin, train_counts(partition, pool)))
    stats = [(column, fig8_stats(counts)) for column, _, _, counts in panels]
    base = OUT / f"fig8{suffix(scale)}"
    rows = [{"column": column, "client": i, **{f"class_{c}": int(v) for c, v in enumerate(row)}}
            for column, _, _, counts in panels for i, row in enumerate(counts)]
    base.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(base.with_suffix(".csv"), index=False)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.4), layout="constrained", sharey=True)
        for ax, (column, dataset, origin, counts) in zip(np.atleast_1d(axes), panels, strict=True):
            clients, classes = np.nonzero(counts)
            ax.scatter(clients, classes, s=counts[clients, classes] / counts.max() * 120, color="tab:red", alpha=0.8)
            ax.set_xticks(range(0, len(counts), 2))
            ax.set_yticks(range(counts.shape[1]))
            ax.set_xlabel("client")
            ax.set_title(f"{column} ({dataset}, from {origin})", fontsize=8)
        np.atleast_1d(axes)[0].set_ylabel("class")
        fig.suptitle("Fig. 8: Dirichlet partitions, 20 clients" + (" (mini stand-in)" if scale == "mini" else ""))
        return [*finish(fig, base, fig8_claims(stats)), base.with_suffix(".csv")]


# ------------------------------------------------------------------------------ Figs. 1a, 1b: trained mechanisms
def fig1a(scale: str, rounds: int | None = None) -> list[Path]:
    """Angle between the two FedAvg clients' model updates in each round, one curve per column (alpha) of the
    Fig. 1a spec; ``rounds`` (default: the spec's) cuts the training short."""
    curves = []
    for column, cfg in spec_cells("fig1a", scale):
        experiment = build_experiment(cfg)
        engine = experiment.engine()
        experiment.method.setup(experiment.fed.worker.read())
        angles = []
        for t in range(1, (rounds or int(cfg["rounds"])) + 1):
            updates: list[torch.Tensor] = []
            engine.round(t, evaluate=False, on_client=lambda task, worker, out=updates: out.append(
                (worker.vector - task.start)[worker.param_mask]))
            cos = torch.nn.functional.cosine_similarity(updates[0], updates[1], dim=0).clamp(-1, 1)
            angles.append(float(torch.rad2deg(torch.arccos(cos))))
        curves.append((column, cfg["partition"]["alpha"], angles))
    base = OUT / f"fig1a{suffix(scale)}"
    rises = []
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(4.2, 3.0))
        for _column, alpha, angles in curves:
            ax.plot(range(1, len(angles) + 1), angles, label=f"alpha={alpha}")
            third = max(1, len(angles) // 3)
            rises.append((alpha, float(np.mean(angles[-third:]) - np.mean(angles[:third]))))
        ax.set_xlabel("round")
        ax.set_ylabel("angle between client updates (deg)")
        ax.legend()
        claims = ("Paper (Sec. 1, Fig. 1a): for every alpha the angle between the two clients' updates grows as "
                  "training goes on.\nOurs (last third of the rounds minus the first third): "
                  + ", ".join(f"alpha={a}: {r:+.1f} deg" for a, r in rises)
                  + f": grows for every alpha: {verdict(all(r > 0 for _, r in rises))}.")
        base.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame([{"alpha": a, "round": t + 1, "angle": v} for _, a, angles in curves
                      for t, v in enumerate(angles)]).to_csv(base.with_suffix(".csv"), index=False)
        return [*finish(fig, base, claims), base.with_suffix(".csv")]


def fig1b(scale: str, epochs: int | None = None) -> list[Path]:
    """Eq. 5 sensitivity of the last layer's weights after one round of local training on the Fig. 1b spec's class
    mix (4:4:1:1); ``epochs`` (default: the spec's) shortens the training."""
    [(_, cfg)] = spec_cells("fig1b", scale)
    if epochs is not None:
        cfg = {**cfg, "train": {**cfg["train"], "epochs": int(epochs)}}
    mix = np.array(cfg["partition"]["mixes"][0], dtype=float)
    experiment = build_experiment(cfg)
    experiment.method.setup(experiment.fed.worker.read())
    trained: list[tuple[torch.Tensor, torch.Tensor]] = []
    experiment.engine().round(1, evaluate=False, on_client=lambda task, worker: trained.append(
        (task.start.clone(), worker.read())))
    (start, end), head = trained[0], experiment.fed.worker.entry(last_weight(experiment.fed.worker.module))
    after = end[head.slice]
    sens = ((after - start[head.slice]).abs() * after.abs()).view(head.shape)
    rows = sens.mean(1).numpy()
    classes = [int(c) for c in np.flatnonzero(mix)]
    major = [c for c in classes if mix[c] == mix.max()]
    minor = [c for c in classes if mix[c] < mix.max()]
    absent = [c for c in range(len(mix)) if mix[c] == 0]
    flat = np.sort(sens.flatten().numpy())
    spread = float(np.quantile(flat, 0.9) / max(np.quantile(flat, 0.5), 1e-30))
    ordered = rows[major].min() > rows[minor].max() and rows[minor].min() > rows[absent].max()
    claims = ("Paper (Sec. 1, Fig. 1b): the sensitivities within one layer differ significantly, and the rows of the "
              "classes with more samples are more sensitive.\n"
              f"Ours: the 90th percentile of the layer's sensitivities is {spread:.1f}x their median (differ: "
              f"{verdict(spread > 2)}, read as at least 2x); row means: 4-share classes "
              + ", ".join(f"{rows[c]:.2e}" for c in major) + ", 1-share " + ", ".join(f"{rows[c]:.2e}" for c in minor)
              + f", absent classes at most {rows[absent].max():.2e}: more samples, more sensitive: {verdict(ordered)}.")
    data = experiment.data
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.0, 2.6))
        im = ax.imshow(sens.numpy(), aspect="auto", cmap="magma")
        ax.set_yticks(range(len(data.classes)), [f"{c}{f' ({int(mix[i])})' if mix[i] else ''}" for i, c in
                                                 enumerate(data.classes)], fontsize=6)
        ax.set_xlabel("feature")
        ax.set_ylabel("class (share held)")
        fig.colorbar(im, ax=ax, fraction=0.03)
        base = OUT / f"fig1b{suffix(scale)}"
        base.parent.mkdir(parents=True, exist_ok=True)
        base.with_suffix(".json").write_text(json.dumps({"classes": classes, "shares": [int(mix[c]) for c in classes],
                                                         "row_mean": rows.tolist()}))
        return [*finish(fig, base, claims), base.with_suffix(".json")]


def last_weight(model: torch.nn.Module) -> str:
    """The name of the classifier's last weight (the last 2-D parameter)."""
    return [name for name, p in model.named_parameters() if p.dim() == 2][-1]


def every_figure(scale: str, rounds: int | None, epochs: int | None, runs: str = "runs") -> list[Path]:
    """Figs. 3-6 whose table CSVs exist, Fig. 7 from the Fig. 7 spec's runs, Fig. 8, and Figs. 1a-1b."""
    paths: list[Path] = []
    for name, draw in (("fig3", lambda: bars("fig3", scale, "critical-parameter selection")),
                       ("fig4", lambda: bars("fig4", scale, "collaboration schemes")),
                       ("fig5", lambda: sweep("fig5", scale, "tau")), ("fig6", lambda: sweep("fig6", scale, "beta"))):
        if output_base("fedcac", name, scale).with_suffix(".csv").exists():
            paths += draw()
        else:
            print(f"skipped {name}: no table yet (make fedcac-{name} SCALE={scale})")
    found = fig7_runs(scale, runs)
    if found:
        paths += fig7(found[0], scale, found)
    else:
        print(f"skipped fig7: no finished run of conf/paper/fedcac/fig7.yaml (make fedcac-fig7 SCALE={scale})")
    return paths + fig8(scale) + fig1a(scale, rounds) + fig1b(scale, epochs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=["fig1a", "fig1b", "fig3", "fig4", "fig5", "fig6", "fig7", "fig8", "all"])
    parser.add_argument("--scale", default="mini", choices=["mini", "medium", "paper"])
    parser.add_argument("--run", type=Path, help="fig7: a FedCAC run directory instead of the Fig. 7 spec's runs")
    parser.add_argument("--rounds", type=int, help="fig1a rounds (default: the spec's)")
    parser.add_argument("--epochs", type=int, help="fig1b local epochs (default: the spec's)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for fig1a/fig1b's training (fixed, so the figures do not depend on load)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    def seven() -> list[Path]:
        if args.run is not None:
            return fig7(args.run, args.scale)
        found = fig7_runs(args.scale)
        if not found:
            parser.error(f"no finished run of conf/paper/fedcac/fig7.yaml at --scale {args.scale}: run "
                         f"make fedcac-fig7 SCALE={args.scale} first, or give --run RUN_DIR")
        return fig7(found[0], args.scale, found)

    paths = {
        "fig3": lambda: bars("fig3", args.scale, "critical-parameter selection"),
        "fig4": lambda: bars("fig4", args.scale, "collaboration schemes"),
        "fig5": lambda: sweep("fig5", args.scale, "tau"),
        "fig6": lambda: sweep("fig6", args.scale, "beta"),
        "fig7": seven,
        "fig8": lambda: fig8(args.scale),
        "fig1a": lambda: fig1a(args.scale, args.rounds),
        "fig1b": lambda: fig1b(args.scale, args.epochs),
        "all": lambda: every_figure(args.scale, args.rounds, args.epochs),
    }[args.figure]()
    print("\n".join(map(str, paths)))


if __name__ == "__main__":
    main()
