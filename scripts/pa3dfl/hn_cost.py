"""Pa3dFL Table 9: the cost of the server's hypernetwork per round, ours beside the paper's (results/pa3dfl/table9.*).

    python scripts/pa3dfl/hn_cost.py [--models cnn_cifar100 resnet18_gn] [--depths 1 2 3] [--repeats 5]
                                     [--repeats-for resnet18_gn=2]
                                     [--embed-dim 64] [--hidden-dim 64] [--num-clients 100] [--participation 0.2]
                                     [--out results/pa3dfl]

What is measured, for each model and encoder depth D (Table 9: a (64, 64, D) hypernetwork = embedding 64, hidden
width 64, D encoder layers) on the federation of the paper's setup (100 clients, participation 0.2 = 20 participants
per round, Hetero capacities r_i ~ U[0.01, 1] with R1 = T / 16):

- the method is built as a run builds it: the composed config (``method=pa3dfl model=<model> capacity.setting=hetero
  ...``) through ``bench.builder.build_without_data`` (the zoo's model decomposed by ``Pa3dFL.extend_model``, the
  full worker, a factory of the narrower workers, a federation without data: no data set is read, nothing here
  needs it), and every round is the engine's (``Engine.round`` without evaluation);
- generation per round: ``client_model(cid)`` for the round's 20 participants (the hypernetwork generates every V
  and the local head at full width, Eqs. 9-10, and they are pruned to the client's width);
- update per round: ``upload`` of the 20 participants (each a forward of the hypernetwork with gradients and the
  backward of <Prune(gen_i), Delta_i> / 20, the vector-Jacobian product of Eq. 8, accumulated in the hypernetwork's
  .grad) and ``aggregate`` (gradient-norm clip and SGD step). These are the method's own hooks, so they also hold
  the method's cheap non-hypernetwork work (adding U, biases and norms into Eq. 6's mean, keeping the trained vector):
  O(model size) copies and adds beside the hypernetwork's O(hidden x model size) products;
- wall-clock seconds with ``time.perf_counter`` around those calls; one warm-up round, then the median over
  ``--repeats`` rounds (each with the participants the engine samples for that round); local training is replaced
  by the received vector plus small noise, made outside the timed calls;
- the hypernetwork's parameter count and memory (float32 bytes, MB = 1e6 bytes) and the process's peak resident set
  size (``ru_maxrss``: the model, the narrower workers, the hypernetwork, its gradients and temporaries, and the
  Python/torch runtime). Each configuration runs in its own subprocess, so peaks do not carry over.

Everything runs on the CPU with ``--threads`` torch threads (default 1). The paper's numbers
(conf/paper/pa3dfl/hn_cost.csv) come from a GPU (its unit is read as seconds); they are printed beside ours, never
mixed in.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this tree's code, also in the measuring subprocess, not an installed checkout's
if TYPE_CHECKING:
    from bench.experiment.result import Result
PAPER_CSV = ROOT / "conf" / "paper" / "pa3dfl" / "hn_cost.csv"
PAPER_FILE = str(PAPER_CSV.relative_to(ROOT))
#: the header's lines in the order a measurement writes them (the JSON stores its keys sorted)
HEADER_KEYS = ("machine", "threads", "torch", "python", "load average at start", "command", "setup", "wall seconds")
#: where the paper's numbers were when a table9.json that does not record ``paper`` was measured
PAPER_FILE_BEFORE = "conf/paper/pa3dfl_hn_cost.csv"
#: our config name -> (classes, input channels, image size, the paper's label)
MODELS: dict[str, tuple[int, int, int, str]] = {
    "cnn_cifar100": (100, 3, 32, "CNN, CIFAR-100"),
    "resnet18_gn": (10, 3, 32, "ResNet-18, CIFAR-10"),
    "small_cnn": (10, 1, 16, "(tests only)"),
}
DEFAULT_MODELS = ("cnn_cifar100", "resnet18_gn")
MB = 1e6


@dataclass(frozen=True)
class Setting:
    """One configuration of the measurement."""

    model: str
    depth: int
    embed_dim: int = 64
    hidden_dim: int = 64
    num_clients: int = 100
    participation: float = 0.2
    repeats: int = 5
    seed: int = 0
    overrides: tuple[str, ...] = ()  # more Hydra overrides (e.g. model options for a tiny test model)

    @property
    def participants(self) -> int:
        """As the engine rounds it: floor(participation N + 1/2), at least 1."""
        return max(1, int(self.participation * self.num_clients + 0.5))


# ------------------------------------------------------------------------------------------------- building
def build(setting: Setting) -> Any:
    """The Pa3dFL experiment of ``setting`` built without data through the project's builder
    (``bench.builder.build_without_data``), its method set up from the initial model."""
    from bench.builder import InputShape, build_without_data
    from bench.experiment.compose import compose_config, to_container

    classes, channels, size, _ = MODELS[setting.model]
    cfg = to_container(compose_config([
        "method=pa3dfl", f"model={setting.model}", "capacity.setting=hetero", f"num_clients={setting.num_clients}",
        f"participation={setting.participation}", f"method.embed_dim={setting.embed_dim}",
        f"method.hidden_dim={setting.hidden_dim}", f"method.encoder_depth={setting.depth}", f"seed={setting.seed}",
        *setting.overrides]))
    experiment = build_without_data(cfg, InputShape(classes, channels, size))
    experiment.method.setup(experiment.fed.worker.read())
    return experiment


class Clock:
    """Wall-clock (``time.perf_counter``) and this process's CPU seconds (``time.process_time``) of timed blocks,
    summed: the CPU seconds are what the work costs, the wall seconds also what other processes took from it."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def __enter__(self) -> Clock:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall += time.perf_counter() - self._wall
        self.cpu += time.process_time() - self._cpu


def one_round(engine: Any, round_: int) -> dict[str, float]:
    """Wall and CPU seconds of the generation and of the update of round ``round_`` run by the engine
    (``Engine.round`` without evaluation, with the participants it samples), local training replaced by a small
    perturbation of the received model (the update needs a model that moved, not a trained one)."""
    method = engine.method
    generation, update = Clock(), Clock()

    def timed(clock: Clock, hook: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            with clock:
                return hook(*args)

        return call

    def perturb(task: Any, worker: Any) -> float:
        noise = torch.randn(task.start.shape, generator=task.generator, dtype=task.start.dtype)
        worker.load(task.start + 1e-3 * noise)
        return 0.0

    hooks = {"client_model": timed(generation, method.client_model), "upload": timed(update, method.upload),
             "aggregate": timed(update, method.aggregate), "train_client": perturb}
    vars(method).update(hooks)  # shadows the class's hooks on this one object, for this round
    try:
        engine.round(round_, evaluate=False)
    finally:
        for name in hooks:
            delattr(method, name)
    return {"generation_s": generation.wall, "update_s": update.wall, "generation_cpu_s": generation.cpu,
            "update_cpu_s": update.cpu}


def rss_mb() -> float:
    """This process's peak resident set size (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB


TIMES = ("generation_s", "update_s", "generation_cpu_s", "update_cpu_s")


def measure(setting: Setting) -> dict[str, Any]:
    """Everything Table 9 reports for one setting, measured in this process."""
    baseline = rss_mb()
    built = time.perf_counter()
    experiment = build(setting)
    build_seconds = time.perf_counter() - built
    method, engine = experiment.method, experiment.engine()
    net = method.state["hn"]["net"]
    sizes = [dec[-1].out_features for dec in net.decoders]
    params = sum(p.numel() for p in net.parameters())
    one_round(engine, 1)  # warm-up: narrower workers, layouts, first touch of the gradients' memory
    rounds = [one_round(engine, t) for t in range(2, setting.repeats + 2)]
    return {
        **asdict(setting), "participants": setting.participants, "generated_layers": len(sizes),
        "generated_entries": sum(sizes), "model_params": method.fed.worker.size,
        "hn_params": params, "hn_mb": sum(p.numel() * p.element_size() for p in net.parameters()) / MB,
        **{key: statistics.median(r[key] for r in rounds) for key in TIMES},
        **{key[:-2] + "_all_s": [r[key] for r in rounds] for key in TIMES},
        "peak_rss_mb": rss_mb(), "rss_before_build_mb": baseline, "build_s": build_seconds,
        "threads": torch.get_num_threads(),
    }


# ------------------------------------------------------------------------------------------------ subprocess
def hn_params_by_sizes(num_clients: int, embed_dim: int, hidden_dim: int, depth: int, sizes: Sequence[int]) -> int:
    """The hypernetwork's parameters from its layer sizes: embeddings N e, encoder e h + h and (D - 1)(h h + h), one
    temperature per generated tensor and one decoder (h + 1)|V_l| per generated tensor."""
    return (num_clients * embed_dim + embed_dim * hidden_dim + hidden_dim + (depth - 1) * (hidden_dim + 1) * hidden_dim
            + len(sizes) + sum((hidden_dim + 1) * n for n in sizes))


def available_mb() -> float | None:
    """MemAvailable of /proc/meminfo (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / MB
    except OSError:
        pass
    return None


def estimate_mb(setting: Setting) -> float:
    """A generous estimate of the subprocess's peak: the hypernetwork's weights, gradients and the temporary of one
    accumulated gradient (3 x its float32 bytes), plus 1.5 GB for the models, workers and runtime. The model's
    generated entries come from its plain weights (an upper bound: |V_l| <= the dense weight), built on the
    meta device."""
    from bench.builder import model_builder
    from bench.experiment.compose import compose_config, to_container

    classes, channels, size, _ = MODELS[setting.model]
    cfg = to_container(compose_config([f"model={setting.model}", *setting.overrides]))
    with torch.device("meta"):
        module = model_builder(cfg, classes, channels, size)(1.0)
    sizes = [m.weight.numel() for m in module.body.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    sizes.append(module.head.weight.numel() + module.head.bias.numel())
    params = hn_params_by_sizes(setting.num_clients, setting.embed_dim, setting.hidden_dim, setting.depth, sizes)
    return 3 * 4 * params / MB + 1500.0


def run_subprocess(setting: Setting, threads: int, timeout: float = 3600.0) -> dict[str, Any]:
    """:func:`measure` of ``setting`` in a fresh Python process (its own peak RSS), niced, with ``threads``."""
    args = [sys.executable, str(Path(__file__).resolve()), "--one", "--models", setting.model, "--depths",
            str(setting.depth), "--embed-dim", str(setting.embed_dim), "--hidden-dim", str(setting.hidden_dim),
            "--num-clients", str(setting.num_clients), "--participation", str(setting.participation),
            "--repeats", str(setting.repeats), "--seed", str(setting.seed), "--threads", str(threads)]
    if setting.overrides:
        args += ["--config", *setting.overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "WANDB_MODE": "offline"}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT,
                          preexec_fn=lambda: os.nice(5))
    if proc.returncode != 0:
        raise RuntimeError(f"{setting.model} depth {setting.depth} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------------- paper
def load_paper(path: Path = PAPER_CSV) -> dict[tuple[str, int, str], float]:
    """(our model name, depth, metric) -> the paper's value."""
    with open(path, newline="") as f:
        return {(r["model"], int(r["depth"]), r["metric"]): float(r["value"]) for r in csv.DictReader(f)}


# ---------------------------------------------------------------------------------------------------- output
COLUMNS = ("model", "paper_model", "embed_dim", "hidden_dim", "depth", "num_clients", "participants", "status",
           "generation_s", "update_s", "generation_cpu_s", "update_cpu_s", "hn_params", "hn_mb", "peak_rss_mb",
           "generated_entries", "repeats", "paper_generation_s", "paper_optimization_s", "note")


def fmt(value: Any, digits: int = 3) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}" if abs(value) < 100 else f"{value:.1f}"


def table9_result(rows: Sequence[Mapping[str, Any]], header: Mapping[str, Any], notes: Sequence[str],
                  paper: str = PAPER_FILE) -> Result:
    """Table 9 as a result: per model and encoder depth our generation and update time per round beside the
    paper's (``paper``: the file of its numbers), the hypernetwork's size and the peak memory."""
    from bench.experiment.result import Result, bullets, grid, heading

    intro = ("Ours measured here on the CPU; the columns labelled **paper** are Pa3dFL's Table 9 "
             f"({paper}), measured on a GPU, unit read as seconds. They are not comparable in "
             "absolute terms: compare how each grows with the depth and with the model.")
    head = ["model", "HN (embed, hidden, depth)", "generation s/round (ours, wall)", "update s/round (ours, wall)",
            "generation CPU s/round (ours)", "update CPU s/round (ours)", "generation s/round (paper)",
            "optimization s/round (paper)", "HN parameters", "HN MB (float32)", "peak RSS MB", "status"]
    body = [[f"{r['model']} ({r['paper_model']})", f"({r['embed_dim']}, {r['hidden_dim']}, {r['depth']})",
             fmt(r.get("generation_s")), fmt(r.get("update_s")), fmt(r.get("generation_cpu_s")),
             fmt(r.get("update_cpu_s")), fmt(r.get("paper_generation_s"), 2),
             fmt(r.get("paper_optimization_s"), 2), fmt(r.get("hn_params")), fmt(r.get("hn_mb"), 1),
             fmt(r.get("peak_rss_mb"), 0), r["status"]] for r in rows]
    keys = [k for k in HEADER_KEYS if k in header] + [k for k in header if k not in HEADER_KEYS]
    blocks = [bullets([f"**{k}**: {header[k]}" for k in keys], kind="facts"), grid(head, body, "table"),
              heading("Notes"), bullets(notes, kind="notes")]
    skipped = [f"{r['model']} depth {r['depth']}: {r['note']}" for r in rows if r.get("note")]
    if skipped:
        blocks.append(bullets(skipped, kind="notes"))
    return Result("Pa3dFL Table 9: hypernetwork cost per round", [intro], blocks)


def write_result(out: Path, measured: Mapping[str, Any]) -> Result:
    """``table9.md``, ``.csv`` and ``.json`` (``measured``: its header, notes and rows, the file of the paper's
    numbers, and the result) under ``out``, each written atomically, from what was measured."""
    from bench.experiment.result import to_markdown
    from common.verified_io import atomic_write_json, atomic_write_text

    result = table9_result(measured["rows"], measured["header"], measured["notes"],
                           measured.get("paper", PAPER_FILE_BEFORE))
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "table9.md", to_markdown(result))
    atomic_write_text(out / "table9.csv", to_csv(measured["rows"]))
    atomic_write_json(out / "table9.json", {**measured, "result": result.as_json()})
    return result


NOTES = (
    "generation = `Pa3dFL.client_model` for the round's participants (the hypernetwork generates every V and the "
    "local head at full width, then they are pruned to the client's width); update = `Pa3dFL.upload` of every "
    "participant (the hypernetwork's forward with gradients and the vector-Jacobian product of Eq. 8) + "
    "`Pa3dFL.aggregate` (clip + SGD step). Both are the method's own hooks: the update also holds the O(model size) "
    "work of Eq. 6's mean and of keeping each trained vector.",
    "wall = time.perf_counter; CPU = time.process_time of the measuring process (what the work costs on one thread; "
    "the wall time also holds what the other jobs on this machine took from it).",
    "Median over the repeated rounds after one warm-up round; every round has the participants the engine samples "
    "for it (seeded). The per-round values are in table9.json.",
    "HN parameters = embeddings (clients x embed) + encoder + one temperature and one decoder Linear(hidden, |V_l|) "
    "per generated tensor (every decomposed layer's V and the local head). |V_l| is at most the layer's dense "
    "weight (linear R2 = R1: equal; conv R2 <= R1 k^2), so the decoders hold at most about (hidden + 1) x the "
    "model's parameters.",
    "peak RSS = the measuring subprocess's ru_maxrss: the hypernetwork, its gradients (and one gradient's temporary "
    "while it is accumulated), the full and narrower client models, and the Python/torch runtime (rss_before_build_mb "
    "in table9.json).",
    "The paper ran on a GPU (its Table 9 unit did not survive the text extraction; seconds assumed).",
)


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(COLUMNS), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in COLUMNS})
    return buffer.getvalue()


def run_table(settings: Sequence[Setting], threads: int, out: Path, command: str,
              log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Measure every setting (one subprocess each, one after another) and write table9.{md,csv,json} to ``out``."""
    from bench.experiment.provenance import cpu_name

    load = os.getloadavg()
    started = time.perf_counter()
    paper = load_paper()
    rows = []
    for s in settings:
        base = {"model": s.model, "paper_model": MODELS[s.model][3], "embed_dim": s.embed_dim,
                "hidden_dim": s.hidden_dim, "depth": s.depth, "num_clients": s.num_clients,
                "participants": s.participants, "repeats": s.repeats,
                "paper_generation_s": paper.get((s.model, s.depth, "generation_s")),
                "paper_optimization_s": paper.get((s.model, s.depth, "optimization_s")), "note": ""}
        need, free = estimate_mb(s), available_mb()
        if free is not None and need > 0.8 * free:
            rows.append({**base, "status": "skipped",
                         "note": f"needs about {need:.0f} MB, {free:.0f} MB available: run it on a larger machine"})
            log(f"skipped {s.model} depth {s.depth}: {rows[-1]['note']}")
            continue
        result = run_subprocess(s, threads)
        rows.append({**base, **result, "status": "measured"})
        log(f"{s.model:<13} depth {s.depth}: generation {result['generation_s']:.3f} s "
            f"({result['generation_cpu_s']:.3f} CPU s), update {result['update_s']:.3f} s "
            f"({result['update_cpu_s']:.3f} CPU s), HN {result['hn_params']:,} params ({result['hn_mb']:.1f} MB), "
            f"peak RSS {result['peak_rss_mb']:.0f} MB")
    header = {
        "machine": f"{cpu_name()}, {os.cpu_count()} logical CPUs, "
                   f"{(available_mb() or 0) / 1e3:.1f} GB available at the end (CPU only, no GPU used)",
        "threads": f"{threads} torch thread(s) per measuring subprocess (niced)",
        "torch": torch.__version__, "python": platform.python_version(),
        "load average at start": " ".join(f"{x:.2f}" for x in load) + " (1, 5, 15 min; other jobs were running)",
        "command": command,
        "setup": f"{settings[0].num_clients if settings else '-'} clients, participation "
                 f"{settings[0].participation if settings else '-'}, Hetero capacities r_i ~ U[0.01, 1] (R1 = T/16), "
                 "hypernetwork hn_lr 0.001, clip 50 (conf/method/pa3dfl.yaml)",
        "wall seconds": f"{time.perf_counter() - started:.0f}",
    }
    write_result(out, {"header": header, "notes": list(NOTES), "rows": rows, "paper": PAPER_FILE})
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(MODELS))
    p.add_argument("--depths", nargs="+", type=int, default=[1, 2, 3], help="encoder depths (default: %(default)s)")
    p.add_argument("--embed-dim", type=int, default=64)
    p.add_argument("--hidden-dim", type=int, default=64)
    p.add_argument("--num-clients", type=int, default=100)
    p.add_argument("--participation", type=float, default=0.2)
    p.add_argument("--repeats", type=int, default=5, help="timed rounds after one warm-up (default: %(default)s)")
    p.add_argument("--repeats-for", nargs="+", default=[], metavar="MODEL=N",
                   help="timed rounds of one model instead (a ResNet-18 round takes minutes on one CPU thread)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    p.add_argument("--config", nargs="+", default=[], metavar="OVERRIDE", help="more Hydra overrides")
    p.add_argument("--out", type=Path, default=Path("results/pa3dfl"), help="output folder (default: %(default)s)")
    p.add_argument("--rerender", action="store_true",
                   help="measure nothing: rewrite the Markdown, CSV and result of <out>/table9.json from its rows")
    p.add_argument("--one", action="store_true", help="measure the single given setting here, print JSON (internal)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from bench.experiment.result import rerender_from_json

    args = parser().parse_args(argv)
    if args.rerender:
        return rerender_from_json(args.out / "table9.json", lambda measured: write_result(args.out, measured))
    repeats = dict.fromkeys(args.models, args.repeats)
    for item in args.repeats_for:
        model, _, count = item.partition("=")
        if model not in MODELS or not count.isdigit():
            parser().error(f"--repeats-for {item!r} is invalid: give MODEL=N with MODEL one of {list(MODELS)}")
        repeats[model] = int(count)
    if min(args.depths) < 1 or min(repeats.values()) < 1 or args.threads < 1 or args.num_clients < 1:
        parser().error("--depths, --repeats, --threads and --num-clients must be >= 1")
    torch.set_num_threads(args.threads)
    settings = [Setting(m, d, args.embed_dim, args.hidden_dim, args.num_clients, args.participation, repeats[m],
                        args.seed, tuple(args.config)) for m in args.models for d in args.depths]
    if args.one:
        if len(settings) != 1:
            parser().error("--one measures exactly one model and one depth")
        print(json.dumps(measure(settings[0])))
        return 0
    cli = sys.argv[1:] if argv is None else list(argv)
    command = "python " + shlex.join(["scripts/pa3dfl/hn_cost.py", *cli]) + " (from the repository root)"
    run_table(settings, args.threads, args.out, command, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(args.out / "table9.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
