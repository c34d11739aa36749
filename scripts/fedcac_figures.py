"""FedCAC figures from run records (one command each; PNG + PDF under results/fedcac/figures/).

    python scripts/fedcac_figures.py fig3 [--scale mini]   # selection schemes    (from results/fedcac/fig3*.csv)
    python scripts/fedcac_figures.py fig4 [--scale mini]   # collaboration schemes
    python scripts/fedcac_figures.py fig5 [--scale mini]   # tau sweep
    python scripts/fedcac_figures.py fig6 [--scale mini]   # beta sweep
    python scripts/fedcac_figures.py fig7 --run RUN_DIR    # overlap matrix next to the clients' class mix
    python scripts/fedcac_figures.py fig8 --run RUN_DIR    # partition dot plot of a run
    python scripts/fedcac_figures.py fig1a [--scale mini]  # angle between two clients' updates, several alpha
    python scripts/fedcac_figures.py fig1b [--scale mini]  # last-layer sensitivity, 4:4:1:1 class mix
    python scripts/fedcac_figures.py all [--scale mini]    # every figure whose records exist (make plots)

Figs. 3-6 read the table CSVs written by ``python -m bench.table conf/paper/fedcac/figN.yaml``; Fig. 7 and
8 read one FedCAC run directory; Figs. 1a and 1b train what they plot (seeded, CPU-sized at mini scale).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from bench.builder import build_experiment  # noqa: E402
from bench.compose import compose_config, to_container  # noqa: E402
from bench.plots import STYLE, save  # noqa: E402
from bench.spec import output_base  # noqa: E402
from common.verified_io import read_jsonl  # noqa: E402

OUT = Path("results/fedcac/figures")


def table_csv(name: str, scale: str) -> pd.DataFrame:
    path = output_base("fedcac", name, scale).with_suffix(".csv")
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run python -m bench.table conf/paper/fedcac/{name}.yaml "
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


def fig7(run: Path) -> list[Path]:
    """The last recorded overlap matrix of a FedCAC run beside its clients' train class distribution."""
    records = [r for r in read_jsonl(run / "rounds.jsonl") if r.get("kind") == "method" and "overlap_matrix" in r]
    if not records:
        raise ValueError(f"{run} has no overlap matrix: run FedCAC with method.overlap_matrix_every > 0")
    last = records[-1]
    counts = pd.read_csv(run / "partition" / "class_counts.csv")
    train = counts[counts["part"] == "train"].set_index("client").filter(like="class_")
    with plt.rc_context(STYLE):
        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(8.4, 3.6), layout="constrained")
        ax0.grid(False)
        ax1.grid(False)
        im = ax0.imshow(np.array(last["overlap_matrix"]), cmap="viridis")
        ax0.set_title(f"overlap O_ij, round {last['round']}")
        ax0.set_xlabel("client j")
        ax0.set_ylabel("client i")
        fig.colorbar(im, ax=ax0, fraction=0.046)
        im1 = ax1.imshow(train.to_numpy() / train.to_numpy().sum(1, keepdims=True), cmap="Reds", aspect="auto")
        fig.colorbar(im1, ax=ax1, fraction=0.046)
        ax1.set_title("class proportions (train)")
        ax1.set_xlabel("class")
        ax1.set_ylabel("client")
        return save(fig, OUT / f"fig7_{run.name}")


def fig8(run: Path) -> list[Path]:
    png = run / "partition" / "partition.png"
    if not png.exists():
        raise FileNotFoundError(f"{png} not found: is {run} a run directory?")
    image = plt.imread(png)
    fig, ax = plt.subplots(figsize=(image.shape[1] / 120, image.shape[0] / 120))
    ax.imshow(image)
    ax.axis("off")
    return save(fig, OUT / f"fig8_{run.name}")


def _config(scale: str, overrides: list[str]) -> dict:
    base = ["dataset=digits", "model=small_cnn", "num_clients=2", "train.batch_size=20", "train.lr=0.05",
            "train.momentum=0.9", "partition.n_train=100", "partition.n_test=20", "cache_dir=null"]
    if scale == "paper":
        base = ["dataset=cifar10", "model=resnet8", "num_clients=2", "train.batch_size=100", "train.lr=0.1",
                "train.momentum=0.9", "train.epochs=5", "partition.n_train=500", "partition.n_test=100"]
    return to_container(compose_config([*base, *overrides]))


def fig1a(scale: str, rounds: int) -> list[Path]:
    """Angle between two FedAvg clients' model updates over rounds, for several Dirichlet alphas."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(4.2, 3.0))
        for alpha in (0.1, 0.5, 1.0):
            experiment = build_experiment(_config(scale, ["partition=dirichlet", f"partition.alpha={alpha}",
                                                          "method=fedavg"]))
            engine = experiment.engine()
            experiment.method.setup(experiment.fed.worker.read())
            angles = []
            for t in range(1, rounds + 1):
                updates = []
                engine.round(t, evaluate=False, on_client=lambda task, worker, out=updates: out.append(
                    (worker.vector - task.start)[worker.param_mask]))
                cos = torch.nn.functional.cosine_similarity(updates[0], updates[1], dim=0).clamp(-1, 1)
                angles.append(float(torch.rad2deg(torch.arccos(cos))))
            ax.plot(range(1, rounds + 1), angles, label=f"alpha={alpha}")
        ax.set_xlabel("round")
        ax.set_ylabel("angle between client updates (deg)")
        ax.legend()
        return save(fig, OUT / f"fig1a{'' if scale == 'paper' else '_mini'}")


def fig1b(scale: str, epochs: int) -> list[Path]:
    """Eq. 5 sensitivity of the last layer's weights after local training on a 4:4:1:1 class mix."""
    cfg = _config(scale, ["partition=pathological", "partition.classes_per_client=4", "num_clients=1",
                          "method=local", f"train.epochs={epochs}"])
    data = build_experiment(cfg).data
    client = data.client(0)
    labels = data.labels[client.train]
    classes = sorted(set(labels.tolist()))
    keep = []
    for share, c in zip((4, 4, 1, 1), classes, strict=True):
        members = client.train[labels == c]
        keep.append(members[: max(1, len(members) * share // 4)])
    mixed = torch.cat(keep)
    splits = ({"train": mixed, "val": client.val, "test": client.test},)
    data = type(data)(data.images, data.labels, splits, data.classes, data.train_transform, data.test_transform,
                      data.partition, data.pool_labels_full)
    experiment = build_experiment(cfg, data=data)
    experiment.method.setup(experiment.fed.worker.read())
    trained: list[tuple[torch.Tensor, torch.Tensor]] = []
    experiment.engine().round(1, evaluate=False, on_client=lambda task, worker: trained.append(
        (task.start.clone(), worker.read())))
    (start, end), head = trained[0], experiment.fed.worker.entry("head.weight")
    after = end[head.slice]
    sens = ((after - start[head.slice]).abs() * after.abs()).view(head.shape)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.0, 2.6))
        im = ax.imshow(sens.numpy(), aspect="auto", cmap="magma")
        ax.set_yticks(range(len(data.classes)), [f"{c}{' *' if i in classes else ''}" for i, c in
                                                 enumerate(data.classes)], fontsize=6)
        ax.set_xlabel("feature")
        ax.set_ylabel("class (* held, 4:4:1:1)")
        fig.colorbar(im, ax=ax, fraction=0.03)
        (OUT / "fig1b.json").parent.mkdir(parents=True, exist_ok=True)
        (OUT / "fig1b.json").write_text(json.dumps({"classes": classes, "shares": [4, 4, 1, 1],
                                                    "row_mean": sens.mean(1).tolist()}))
        return save(fig, OUT / f"fig1b{'' if scale == 'paper' else '_mini'}")


def first_fedcac_run(scale: str, runs: Path = Path("runs")) -> Path | None:
    """A finished FedCAC run of Table 2 (Dirichlet; it records overlap matrices), if there is one."""
    found = sorted(p.parent for p in (runs / "fedcac" / "table2" / scale / "fedcac").glob("*/summary.json"))
    return found[0] if found else None


def every_figure(scale: str, rounds: int, epochs: int) -> list[Path]:
    """Figs. 3-6 whose table CSVs exist, Figs. 7-8 from a Table 2 FedCAC run, and Figs. 1a-1b."""
    paths: list[Path] = []
    for name, draw in (("fig3", lambda: bars("fig3", scale, "critical-parameter selection")),
                       ("fig4", lambda: bars("fig4", scale, "collaboration schemes")),
                       ("fig5", lambda: sweep("fig5", scale, "tau")), ("fig6", lambda: sweep("fig6", scale, "beta"))):
        if output_base("fedcac", name, scale).with_suffix(".csv").exists():
            paths += draw()
        else:
            print(f"skipped {name}: no table yet (make fedcac-{name} SCALE={scale})")
    run = first_fedcac_run(scale)
    if run is None:
        print(f"skipped fig7, fig8: no FedCAC run of Table 2 yet (make table2 SCALE={scale})")
    else:
        paths += fig7(run) + fig8(run)
    return paths + fig1a(scale, rounds) + fig1b(scale, epochs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=["fig1a", "fig1b", "fig3", "fig4", "fig5", "fig6", "fig7", "fig8", "all"])
    parser.add_argument("--scale", default="mini", choices=["mini", "medium", "paper"])
    parser.add_argument("--run", type=Path, help="run directory (fig7, fig8)")
    parser.add_argument("--rounds", type=int, default=30, help="fig1a rounds")
    parser.add_argument("--epochs", type=int, default=5, help="fig1b local epochs")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for fig1a/fig1b's training (fixed, so the figures do not depend on load)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.figure in ("fig7", "fig8") and args.run is None:
        parser.error(f"{args.figure} needs --run RUN_DIR (a FedCAC run directory)")
    paths = {
        "fig3": lambda: bars("fig3", args.scale, "critical-parameter selection"),
        "fig4": lambda: bars("fig4", args.scale, "collaboration schemes"),
        "fig5": lambda: sweep("fig5", args.scale, "tau"),
        "fig6": lambda: sweep("fig6", args.scale, "beta"),
        "fig7": lambda: fig7(args.run),
        "fig8": lambda: fig8(args.run),
        "fig1a": lambda: fig1a(args.scale, args.rounds),
        "fig1b": lambda: fig1b(args.scale, args.epochs),
        "all": lambda: every_figure(args.scale, args.rounds, args.epochs),
    }[args.figure]()
    print("\n".join(map(str, paths)))


if __name__ == "__main__":
    main()
