"""Run the external side of a cross-check and write its reference curves (their numbers, never their code).

    python scripts/crosscheck_external.py --checkout /tmp/PFLlib --methods fedavg fedper [--partitions pat] \
        [--python /tmp/pflvenv/bin/python]
    python scripts/crosscheck_external.py --code heterofl --checkout /tmp/HeteroFL --methods heterofl
    python scripts/crosscheck_external.py --code fedrolex --checkout /tmp/FedRolex --methods fedrolex
    python scripts/crosscheck_external.py --code pfedhn --checkout /tmp/pFedHN --methods pfedhn
    python scripts/crosscheck_external.py --code pfedgate --checkout /tmp/pFedGate --methods pfedgate \
        --python /tmp/xgate_venv/bin/python
    python scripts/crosscheck_external.py --code pfedgate --checkout /tmp/pFedGate --methods pfedgate \
        --python /tmp/xgate_venv/bin/python --partitions pat --seeds 2 3 --extra

For each method and partition of ``conf/crosscheck.yaml`` this exports our split with the images exactly as our
runs see them into ``<checkout>/dataset/<name>/`` (``bench.experiment.partition.export_pfllib``), runs the external code
unmodified through its own command line with the shared setting (rounds, clients, lr, batch size, local epochs,
CPU, one repetition per seed; a method whose ``external`` says ``norm: bn`` runs through
``scripts/pfllib_bn_cnn.py``, which gives main.py a FedAvgCNN with BatchNorm), reads the per-round test accuracy
it saves, and writes
``results/crosscheck/<method>/reference_<partition>.json``: the curves per repetition, the external commit, the
exact command and the setting. The external code needs its own dependencies (PFLlib: torch, numpy, scikit-learn,
h5py, calmsize; pFedHN and FedSelect: torch, numpy; HeteroFL and FedRolex: torch, torchvision, numpy, PyYAML,
anytree, tensorboard); ``--python`` names the interpreter that has them. ``--seeds 2 3 --extra`` (not PFLlib) runs
more repetitions of theirs beside the table's and adds them to ``reference_seeds_<partition>.json`` (their curves
only), which ``scripts/crosscheck_seeds.py`` counts in the between-seed spread; the table's reference is untouched.

``--code heterofl`` / ``--code fedrolex`` run the official HeteroFL / FedRolex code (a checkout of it) through
``scripts/crosscheck_heterofl.py``, one run per seed, on the same export, with the clients' widths, the conv
widths and the training settings read from our run's config (``nested_command``, which refuses a config of ours
that is not their algorithm).

``--code pfedhn`` runs the official pFedHN trainer (AvivSham/pFedHN ``experiments/pfedhn/trainer.py``, one run per
seed with its ``--seed``) through ``scripts/crosscheck_pfedhn.py``, which gives it the exported split and
1-channel networks. The official trainer updates the hypernetwork after every single client (one client drawn at
random per step), so a round of the shared setting is ``num_clients`` steps: it runs ``rounds x num_clients`` steps
and evaluates every ``num_clients`` steps (after 21, 41, ..., 581 and 600 steps for 20 clients, see ``per_round``);
our side runs one client per round for as many rounds and evaluates every ``num_clients`` rounds (the method's
``ours``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.core.capacity import WidthRule, client_capacities, shared_width_rule  # noqa: E402
from bench.experiment.compose import compose_config, to_container  # noqa: E402
from bench.experiment.crosscheck import (  # noqa: E402
    RESULTS,
    SPEC,
    load_spec,
    method_partitions,
    our_overrides,
    setting_overrides,
    stage,
)
from bench.experiment.partition import export_pfllib  # noqa: E402

BN_LAUNCHER = Path(__file__).resolve().parent / "pfllib_bn_cnn.py"
NESTED_LAUNCHER = Path(__file__).resolve().parent / "crosscheck_heterofl.py"
PFEDHN_LAUNCHER = Path(__file__).resolve().parent / "crosscheck_pfedhn.py"
FEDSELECT_LAUNCHER = Path(__file__).resolve().parent / "crosscheck_fedselect.py"
FJORD_LAUNCHER = Path(__file__).resolve().parent / "crosscheck_fjord.py"
PFEDGATE_LAUNCHER = Path(__file__).resolve().parent / "crosscheck_pfedgate.py"
#: the folder of each external code base that must be unmodified and that its code runs from (the rest of a
#: snapshot may lack data files)
CODE_DIR = {"pfllib": "system", "pfedhn": "experiments", "fedselect": ".", "heterofl": "src", "fedrolex": ".",
            "fjord": "baselines/fjord", "pfedgate": "."}
#: what our side must set for the official HeteroFL / FedRolex code to be the same algorithm: its gradient clipping
#: (train_classifier_fed.py and resnet_client.py: clip_grad_norm_(..., 1)), its BatchNorm handling (HeteroFL's sBN:
#: train_classifier_fed.py stats(); FedRolex's main_resnet.py evaluates models that track no statistics: batch
#: statistics) and its scaler; FedRolex's server rolls the window backward (resnet_server.py:101-109) and
#: averages as our weights=update_counts does (its combine with the launcher's --weighting avg)
NESTED_NEEDS = {"heterofl": {"train.grad_clip": 1.0, "method.static_bn": "sbn", "method.scaler": True},
                "fedrolex": {"train.grad_clip": 1.0, "method.static_bn": "batch", "method.scaler": True,
                             "method.window": "backward", "method.weights": "update_counts"}}


def git_commit(checkout: Path, code_dir: str = "system") -> str:
    out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"error: {checkout} is not a git checkout (need its commit for the reference)")
    # only the code counts: a snapshot may lack the large data files PFLlib commits under dataset/
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no", "--",
                            code_dir], capture_output=True, text=True).stdout.strip()
    if dirty:
        raise SystemExit(f"error: {checkout}/{code_dir} has local changes; the external code must run unmodified")
    return out.stdout.strip()


def pfllib_dataset_name(partition: str) -> str:
    # PFLlib builds its CNN for (Fashion-)MNIST when the data set's name contains "MNIST" (system/main.py)
    return f"FMNIST_crosscheck_{partition}"


def same_file(a: Path, b: Path) -> bool:
    """Same content (an .npz by its arrays: its zip entries carry the time they were written)."""
    if not b.is_file():
        return False
    if a.suffix != ".npz":
        return a.read_bytes() == b.read_bytes()
    x, y = (np.load(p, allow_pickle=True)["data"].tolist() for p in (a, b))
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def export_split(spec: Mapping[str, Any], partition: str, final: Path) -> Path:
    """Our split of ``partition`` exported into the folder ``final`` (PFLlib's layout); the folder."""
    conf = to_container(compose_config([*setting_overrides(spec, partition), "method=fedavg", "seed=0"]))
    # written aside and moved in whole: another run of this script may be reading the folder (PFLlib re-reads a
    # client's file every round), so an existing folder is kept when identical and never rewritten
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = export_pfllib(conf, final.parent / f".{final.name}.tmp-{os.getpid()}")
    if final.exists():
        same = all(same_file(f, final / f.relative_to(tmp)) for f in tmp.rglob("*") if f.is_file())
        shutil.rmtree(tmp)
        if not same:
            raise SystemExit(f"error: {final} holds another split than conf/crosscheck.yaml's; remove it first")
    else:
        tmp.rename(final)
    return final


#: external codes that read our split by its name under ``<checkout>/dataset/`` (the others are handed the folder)
READS_BY_NAME = ("pfllib", "heterofl", "fedrolex")


def export_folder(code: str, partition: str, checkout: Path) -> Path:
    """Where the split goes in the external checkout (PFLlib reads ``dataset/<name>`` by name)."""
    if code in READS_BY_NAME:
        return checkout / "dataset" / pfllib_dataset_name(partition)
    return checkout / "data" / f"crosscheck_{partition}"


def pfllib_command(spec: Mapping[str, Any], method: str, python: str, data_name: str) -> list[str]:
    """PFLlib's ``main.py`` command line for one method with the shared setting (run from ``system/``)."""
    s = spec["setting"]
    ext = spec["methods"][method]["external"]
    norm = ext.get("norm", "none")
    if norm not in ("none", "bn"):
        raise SystemExit(f"error: {method}: external norm {norm!r} is invalid: use 'none' or 'bn'")
    # PFLlib has no BatchNorm FedAvgCNN: `norm: bn` runs main.py through the launcher that substitutes one
    launcher = [str(BN_LAUNCHER)] if norm == "bn" else []
    return [python, "-u", *launcher, "main.py", "-data", data_name, "-m", "CNN", "-algo", ext["algo"], "-dev", "cpu",
            "-nc", str(s["num_clients"]), "-ncl", "10", "-jr", "1", "-gr", str(s["rounds"]), "-lr", str(s["lr"]),
            "-lbs", str(s["batch_size"]), "-ls", str(s["epochs"]), "-eg", "1", "-t", str(len(s["seeds"])),
            "-go", f"crosscheck_{method}", *[str(a) for a in ext.get("args", [])]]


def run_pfllib(spec: Mapping[str, Any], method: str, partition: str, checkout: Path, python: str,
               data_name: str) -> tuple[dict[str, list[float]], dict[str, list[float]], list[str], float]:
    """Run PFLlib's ``main.py`` for one method on one exported split; per repetition, accuracy (%) per round."""
    s = spec["setting"]
    ext = spec["methods"][method]["external"]
    goal = f"crosscheck_{method}"
    seeds = [str(x) for x in s["seeds"]]
    cmd = pfllib_command(spec, method, python, data_name)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    start = time.time()
    log = checkout / "system" / f"{goal}_{partition}.log"
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=checkout / "system", stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed (exit {proc.returncode}); see {log}")
    curves, extra = {}, {}
    for i, seed in enumerate(seeds):
        h5 = checkout / "results" / f"{data_name}_{ext['algo']}_{goal}_{i}.h5"
        read = "import h5py, json, sys; print(json.dumps(h5py.File(sys.argv[1], 'r')['rs_test_acc'][:].tolist()))"
        acc = [100.0 * float(a) for a in json.loads(subprocess.run([python, "-c", read, str(h5)], check=True,
                                                                     capture_output=True, text=True).stdout)]
        # PFLlib evaluates at the start of every round, after sending the models: entry 0 is the untrained model,
        # entry t the models after t rounds of training and aggregation (our round t, stage post). A method that
        # evaluates twice per round (Ditto: the global, then the personalized models, serverditto.py train) says
        # which entry of each round is its personalized one (`entry`, of `per_round`).
        # `trailing`: evaluations after the last round (FedBABU's fine-tuned models, serverbabu.py train), kept aside.
        per_round, entry, trailing = int(ext.get("per_round", 1)), int(ext.get("entry", 0)), int(ext.get("trailing", 0))
        if trailing:
            extra[seed], acc = acc[len(acc) - trailing:], acc[:len(acc) - trailing]
        acc = acc[entry::per_round]
        if len(acc) != int(s["rounds"]) + 1:
            raise SystemExit(f"error: {h5} holds {len(acc)} evaluations, expected rounds + 1 = {s['rounds'] + 1}")
        curves[seed] = acc[1:]
    shown = [f"<pflrepro>/scripts/{BN_LAUNCHER.name}" if c == str(BN_LAUNCHER) else c for c in cmd[1:]]
    return curves, extra, shown, time.time() - start


def with_seeds(spec: dict[str, Any], seeds: Sequence[int] | None, code: str = "pfllib") -> dict[str, Any]:
    """``spec`` with its seeds replaced by ``seeds``: for PFLlib its repetitions, so 0..n-1 only; the other codes
    take any seeds (each run gets its own ``--seed``)."""
    if not seeds:
        return spec
    if code == "pfllib" and list(seeds) != list(range(len(seeds))):
        raise SystemExit(f"error: --seeds {' '.join(map(str, seeds))} is invalid: PFLlib's repetitions are "
                         f"0..n-1 in order (e.g. --seeds {' '.join(map(str, range(len(seeds))))})")
    return {**spec, "setting": {**spec["setting"], "seeds": list(seeds)}}


def our_config(spec: Mapping[str, Any], method: str, partition: str) -> dict[str, Any]:
    return to_container(compose_config(our_overrides(spec, method, partition, int(spec["setting"]["seeds"][0]))))


def client_widths(conf: Mapping[str, Any]) -> list[float]:
    """p_i per client of our run ``conf`` (as ``Federation.client_widths`` gives them)."""
    capacities = client_capacities(conf.get("capacity"), int(conf["num_clients"]), int(conf["data_seed"]))
    rule = shared_width_rule(conf.get("capacity")) or WidthRule(conf["method"]["width_rule"],
                                                                conf["method"]["width_step"])
    return rule.widths(capacities)


def _get(conf: Mapping[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        conf = conf[key]
    return conf


def nested_command(spec: Mapping[str, Any], method: str, partition: str, python: str, data: Path, seed: int,
                   out: Path) -> list[str]:
    """The launcher's command line for the official HeteroFL / FedRolex code, from our run's config: the same
    widths per client, conv widths, rounds, lr, batch size and local epochs; refuses a config of ours that is not
    their algorithm (``NESTED_NEEDS``, the model, label masking)."""
    s = spec["setting"]
    ext = spec["methods"][method]["external"]
    conf = our_config(spec, method, partition)
    model = conf["model"]
    if model["name"] != "cnn_heterofl" or model["options"]["norm"] != "bn" or float(model["width"]) != 1.0:
        raise SystemExit(f"error: {method}: the official code's Conv is our cnn_heterofl with norm bn at width 1, not "
                         f"{model['name']} {model['options']}: set the method's `model:` in conf/crosscheck.yaml")
    needs = {**NESTED_NEEDS[ext["code"]], "method.label_mask": bool(ext.get("mask", True))}
    wrong = [f"{k}={_get(conf, k)!r} (theirs: {v!r})" for k, v in needs.items() if _get(conf, k) != v]
    if wrong:
        raise SystemExit(f"error: {method}: our side differs from the official code: {', '.join(wrong)}")
    return [python, "-u", str(NESTED_LAUNCHER), "--code", ext["code"], "--data", str(data),
            "--widths", *[f"{w:g}" for w in client_widths(conf)],
            "--channels", *[str(int(c)) for c in model["options"]["channels"]], "--rounds", str(s["rounds"]),
            "--lr", str(s["lr"]), "--batch-size", str(s["batch_size"]), "--epochs", str(s["epochs"]),
            "--seed", str(seed), "--mask", str(int(bool(ext.get("mask", True)))), "--out", str(out)]


def run_nested(spec: Mapping[str, Any], method: str, partition: str, checkout: Path, python: str,
               data_name: str) -> tuple[dict[str, list[float]], dict[str, Any], list[str], float]:
    """Run the official HeteroFL / FedRolex code once per seed through the launcher (the seeds at the same time, one
    thread each); per seed, accuracy per round."""
    ext = spec["methods"][method]["external"]
    cwd = checkout / CODE_DIR[ext["code"]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    curves, extra, shown = {}, {}, []
    start = time.time()
    runs = []
    for seed in spec["setting"]["seeds"]:
        out = cwd / f"crosscheck_{method}_{partition}_s{seed}.json"
        cmd = nested_command(spec, method, partition, python, checkout / "dataset" / data_name, int(seed), out)
        log = cwd / f"crosscheck_{method}_{partition}_s{seed}.log"
        with open(log, "w") as f:
            runs.append((seed, out, cmd, log, subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                                               env=env)))
    for seed, out, cmd, log, proc in runs:
        if proc.wait() != 0:
            raise SystemExit(f"error: {' '.join(cmd)} failed (exit {proc.returncode}); see {log}")
        result = json.loads(out.read_text())
        curves[str(seed)] = result["curve"]
        extra[str(seed)] = result["their_metrics"]
        shown = ["<pflrepro>/scripts/" + NESTED_LAUNCHER.name if c == str(NESTED_LAUNCHER) else
                 "<checkout>/dataset/" + data_name if c == str(checkout / "dataset" / data_name) else
                 "<seed>" if c == str(seed) and cmd[i - 1] == "--seed" else
                 f"crosscheck_{method}_{partition}_s<seed>.json" if c == str(out) else c
                 for i, c in enumerate(cmd)][1:]
    return curves, extra, shown, time.time() - start


def pfedhn_command(spec: Mapping[str, Any], method: str, python: str, split: Path, seed: int,
                   save: Path) -> list[str]:
    """The official pFedHN trainer's command line for one seed, through our launcher (run from the checkout)."""
    s = spec["setting"]
    n = int(s["num_clients"])
    # --data-name cifar10 picks CNNHyper / CNNTarget with 10 outputs (trainer.py); the launcher gives them 1-channel
    # inputs and our split. One client per step: rounds x num_clients steps, evaluated every num_clients steps.
    return [python, "-u", str(PFEDHN_LAUNCHER), "--split", str(split), "--",
            "--data-name", "cifar10", "--data-path", str(split), "--num-nodes", str(n),
            "--num-steps", str(int(s["rounds"]) * n), "--batch-size", str(s["batch_size"]), "--eval-every", str(n),
            "--save-path", str(save), "--seed", str(seed),
            *[str(a) for a in spec["methods"][method]["external"].get("args", [])]]


def per_round(evaluations: Sequence[float], rounds: int) -> list[float]:
    """The official trainer's test accuracies (fractions) with ``--eval-every num_clients`` -> % per round.

    It evaluates after step indices 0, n, 2n, ... (``step % eval_every == 0``, trainer.py:187), i.e. after 1, n + 1,
    ..., (rounds - 1) n + 1 steps, and once more after the last step: entry r (r = 1..rounds) is our round r, one
    step (a single client's update) later than ours but for the last, which is exact. (Evaluating after every step
    to hit n, 2n, ... exactly would cost rounds x n evaluations.)"""
    if len(evaluations) != rounds + 1:
        raise SystemExit(f"error: {len(evaluations)} evaluations, expected rounds + 1 = {rounds + 1}")
    return [100.0 * float(a) for a in evaluations[1:]]


def run_pfedhn(spec: Mapping[str, Any], method: str, partition: str, checkout: Path, python: str,
               split: Path) -> tuple[dict[str, list[float]], dict[str, list[float]], list[str], float]:
    """Run the official pFedHN trainer on the exported split, one process per seed (in parallel); per seed,
    accuracy (%) per round."""
    s = spec["setting"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    start, curves, runs = time.time(), {}, {}
    for seed in [int(x) for x in s["seeds"]]:
        save = checkout / "crosscheck_results" / f"{method}_{partition}_seed{seed}"
        shutil.rmtree(save, ignore_errors=True)
        cmd = pfedhn_command(spec, method, python, split, seed, save)
        log = checkout / f"crosscheck_{method}_{partition}_seed{seed}.log"
        with open(log, "w") as f:
            runs[seed] = (subprocess.Popen(cmd, cwd=checkout, stdout=f, stderr=subprocess.STDOUT, env=env), cmd,
                          log, save)
    for seed, (proc, cmd, log, save) in runs.items():
        if proc.wait() != 0:
            raise SystemExit(f"error: {' '.join(cmd)} failed (exit {proc.returncode}); see {log}")
        found = sorted(save.glob(f"results_*_inner_steps_seed_{seed}.json"))
        if len(found) != 1:
            raise SystemExit(f"error: expected one results file under {save}, found {len(found)}")
        acc = json.loads(found[0].read_text())["test_avg_acc"]
        curves[str(seed)] = per_round(acc, int(s["rounds"]))
    shown = [f"<pflrepro>/scripts/{PFEDHN_LAUNCHER.name}" if c == str(PFEDHN_LAUNCHER) else c for c in cmd[1:]]
    shown = [c.replace(str(checkout) + "/", "") for c in shown]
    return curves, {}, shown, time.time() - start


def fedselect_command(spec: Mapping[str, Any], method: str, python: str, split: Path, seed: int,
                      num_classes: int) -> list[str]:
    """The official FedSelect command line for one seed, through our launcher (run from the checkout)."""
    s = spec["setting"]
    # --frac 1.0: every client every round (fedselect.py run_base_experiment draws them once, in a random order)
    return [python, "-u", str(FEDSELECT_LAUNCHER), "--split", str(split), "--",
            "--num_users", str(s["num_clients"]), "--frac", "1.0", "--com_rounds", str(s["rounds"]),
            "--lr", str(s["lr"]), "--local_bs", str(s["batch_size"]), "--num_classes", str(num_classes),
            "--seed", str(seed), *[str(a) for a in spec["methods"][method]["external"].get("args", [])]]


def fedselect_curve(log: str, rounds: int, test_sizes: Sequence[int]) -> list[float]:
    """The pooled test accuracy (%) per round from what fedselect.py prints after every round's local training
    (``Client Accs: tensor([...])``: each client's accuracy, in the code's own client order)."""
    rows = re.findall(r"Client Accs:\s+tensor\(\[([^\]]*)\]\)", log)
    if len(rows) != rounds:
        raise SystemExit(f"error: the log holds {len(rows)} rounds of client accuracies, expected {rounds}")
    if len(set(test_sizes)) != 1:
        # the printed order is fedselect.py's random client order, so only equal test sizes pool without it
        raise SystemExit(f"error: clients have unequal test sizes {sorted(set(test_sizes))}: the pooled accuracy "
                         "cannot be read from fedselect.py's output")
    curve = []
    for row in rows:
        accs = [float(a) for a in row.split(",")]
        if len(accs) != len(test_sizes):
            raise SystemExit(f"error: a round lists {len(accs)} client accuracies, expected {len(test_sizes)}")
        curve.append(100.0 * sum(accs) / len(accs))
    return curve


def run_fedselect(spec: Mapping[str, Any], method: str, partition: str, checkout: Path, python: str,
                  split: Path) -> tuple[dict[str, list[float]], dict[str, list[float]], list[str], float]:
    """Run the official FedSelect code on the exported split, one process per seed (in parallel); per seed,
    accuracy (%) per round."""
    s = spec["setting"]
    info = json.loads((split / "config.json").read_text())
    sizes = [sum(c["test"]) for c in info["class_counts"]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    start, curves, runs = time.time(), {}, {}
    for seed in [int(x) for x in s["seeds"]]:
        cmd = fedselect_command(spec, method, python, split, seed, int(info["num_classes"]))
        log = checkout / f"crosscheck_{method}_{partition}_seed{seed}.log"
        err = log.with_suffix(".err")  # its progress bars, and any error
        with open(log, "w") as f, open(err, "w") as e:
            runs[seed] = (subprocess.Popen(cmd, cwd=checkout, stdout=f, stderr=e, env=env), cmd, log, err)
    for seed, (proc, cmd, log, err) in runs.items():
        if proc.wait() != 0:
            raise SystemExit(f"error: {' '.join(cmd)} failed (exit {proc.returncode}); see {err}")
        curves[str(seed)] = fedselect_curve(log.read_text(), int(s["rounds"]), sizes)
    shown = [f"<pflrepro>/scripts/{FEDSELECT_LAUNCHER.name}" if c == str(FEDSELECT_LAUNCHER) else c for c in cmd[1:]]
    shown = [c.replace(str(checkout) + "/", "") for c in shown]
    return curves, {}, shown, time.time() - start


def require_plain_cnn_fedavg(method: str, model: Mapping[str, Any], why: str) -> None:
    """Refuse (exit) our side's model unless it is cnn_fedavg without norm layers at width 1, which ``why`` needs."""
    if model["name"] != "cnn_fedavg" or model["options"].get("norm", "none") != "none" or float(model["width"]) != 1:
        raise SystemExit(f"error: {method}: {why} (norm none, width 1), not {model['name']} {model['options']}")


def fjord_command(spec: Mapping[str, Any], method: str, partition: str, python: str, split: Path, seed: int,
                  out: Path) -> list[str]:
    """The launcher's command line for Flower's FjORD baseline, from our run's config: the same width per client and
    sampled widths, rounds, lr, batch size, local epochs and distillation; refuses a config of ours that is not the
    baseline's algorithm (its model, distillation weight 1 at temperature 1, no scaler)."""
    from methods.fjord import sample_pool

    s = spec["setting"]
    conf = our_config(spec, method, partition)
    model, hp = conf["model"], conf["method"]
    require_plain_cnn_fedavg(method, model, "the launcher builds our cnn_fedavg from the baseline's ordered-dropout "
                             "layers")
    wrong = [f"method.{k}={hp[k]!r} (theirs: {v!r})" for k, v in
             {"name": "fjord", "distill_weight": 1.0, "temperature": 1.0, "scaler": False}.items() if hp[k] != v]
    if wrong:
        raise SystemExit(f"error: {method}: our side differs from the baseline: {', '.join(wrong)}")
    widths = client_widths(conf)
    return [python, "-u", str(FJORD_LAUNCHER), "--split", str(split), "--widths", *[f"{w:g}" for w in widths],
            "--p-s", *[f"{p:g}" for p in sample_pool(hp["sample_widths"], widths)], "--rounds", str(s["rounds"]),
            "--lr", str(s["lr"]), "--batch-size", str(s["batch_size"]), "--epochs", str(s["epochs"]),
            "--seed", str(seed), *([] if hp["distill"] else ["--no-distill"]), "--out", str(out),
            *[str(a) for a in spec["methods"][method]["external"].get("args", [])]]


def launch_per_seed(spec: Mapping[str, Any], method: str, partition: str, cwd: Path, env: Mapping[str, str],
                    command: Any) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Run a launcher once per seed of the setting (in parallel, ``command(seed, out)`` its command line, run in
    ``cwd``): each seed's JSON output, and the command as the reference shows it (paths and the seed generic)."""
    runs = {}
    for seed in [int(x) for x in spec["setting"]["seeds"]]:
        out = cwd / f"crosscheck_{method}_{partition}_s{seed}.json"
        cmd = command(seed, out)
        log = cwd / f"crosscheck_{method}_{partition}_s{seed}.log"
        with open(log, "w") as f:  # its progress bars and warnings too
            runs[seed] = (subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=dict(env)), cmd, log,
                          out)
    results = {}
    for seed, (proc, cmd, log, out) in runs.items():
        if proc.wait() != 0:
            raise SystemExit(f"error: {' '.join(cmd)} failed (exit {proc.returncode}); see {log}")
        results[seed] = json.loads(out.read_text())
    return results, cmd


def run_fjord(spec: Mapping[str, Any], method: str, partition: str, checkout: Path, python: str,
              split: Path) -> tuple[dict[str, list[float]], dict[str, Any], list[str], float]:
    """Run Flower's FjORD baseline on the exported split through the launcher, one process per seed (in parallel);
    per seed, accuracy (%) per round."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    start = time.time()
    results, cmd = launch_per_seed(spec, method, partition, checkout / CODE_DIR["fjord"], env,
                                   lambda seed, out: fjord_command(spec, method, partition, python, split, seed, out))
    curves = {str(seed): r["curve"] for seed, r in results.items()}
    extra = {str(seed): r["their_metrics"] for seed, r in results.items()}
    shown = [f"<pflrepro>/scripts/{FJORD_LAUNCHER.name}" if c == str(FJORD_LAUNCHER) else
             "<seed>" if i > 0 and cmd[i - 1] == "--seed" else
             f"crosscheck_{method}_{partition}_s<seed>.json" if c.endswith(".json") else
             c.replace(str(checkout) + "/", "<checkout>/") for i, c in enumerate(cmd)][1:]
    return curves, extra, shown, time.time() - start


#: what the official pFedGate code hard-codes, which our side must set to be its algorithm: its SGD for model and gate
#: (utils/optim.py get_optimizer: momentum 0.9, weight decay 5e-4), built once per client (run_experiment.py:58: the
#: momentum carries over between rounds), the model's and the gate's gradient-norm clip (gated_learner.py fit_batch:
#: max_norm=10), the gate's initial output shift (BatchNorm1d's: 0) and its input (the whole image)
PFEDGATE_NEEDS = {"train.optimizer": "sgd", "train.momentum": 0.9, "train.weight_decay": 0.0005,
                  "method.gate_momentum": 0.9, "method.gate_weight_decay": 0.0005, "train.keep_optimizer_state": True,
                  "train.grad_clip": 10.0, "method.gate_clip": 10.0, "method.gate_bias": 0.0,
                  "capacity.setting": "ideal", "participation": 1.0}


def pfedgate_command(spec: Mapping[str, Any], method: str, partition: str, python: str, split: Path, seed: int,
                     out: Path) -> list[str]:
    """The official ``run_experiment.py`` command line for one seed, through our launcher (run from the checkout),
    from our run's config: sparsity, blocks per tensor, gate lr, rounds, lr, batch size and local epochs; refuses a
    config of ours that is not the official algorithm (``PFEDGATE_NEEDS``, our cnn_fedavg, one sparsity for all) or
    that compares another stage than the official evaluation's (``pre``)."""
    s = spec["setting"]
    conf = our_config(spec, method, partition)
    model, hp = conf["model"], conf["method"]
    require_plain_cnn_fedavg(method, model, "the launcher resizes the official CNN to our cnn_fedavg")
    wrong = [f"{k}={_get(conf, k)!r} (theirs: {v!r})" for k, v in PFEDGATE_NEEDS.items() if _get(conf, k) != v]
    if hp["name"] != "pfedgate" or hp["sparsity"] is None:
        wrong.append(f"method {hp['name']} with sparsity {hp.get('sparsity')!r} (theirs: pfedgate, one sparsity)")
    first = np.load(split / "train" / "0.npz", allow_pickle=True)["data"].tolist()["x"]
    image = int(first.shape[-1])
    if hp.get("gate_pool") != image:
        wrong.append(f"method.gate_pool={hp.get('gate_pool')!r} (theirs: the whole {image}x{image} image)")
    if stage(spec, method) != "pre":  # every client sampled: none gets the new average before write_logs
        wrong.append(f"stage {stage(spec, method)!r} (theirs: each client's model after its local training, before "
                     "the new average reaches it; set stage: pre)")
    if wrong:
        raise SystemExit(f"error: {method}: our side differs from the official code: {', '.join(wrong)}")
    # run_experiment.py trains n_rounds + 1 rounds (its loop runs while current_round <= n_rounds)
    return [python, "-u", str(PFEDGATE_LAUNCHER), "--split", str(split), "--out", str(out), "--",
            "emnist", "pFedGate", "--n_learners", "1", "--device", "cpu", "--optimizer", "sgd", "--verbose", "1",
            "--log_freq", "1", "--expname", f"crosscheck_{method}_{partition}_s{seed}",
            "--n_rounds", str(int(s["rounds"]) - 1), "--bz", str(s["batch_size"]), "--local_steps", str(s["epochs"]),
            "--lr_model", str(s["lr"]), "--lr_gating", str(hp["gate_lr"]), "--sparse_factor", f"{hp['sparsity']:g}",
            "--fine_grained_block_split", str(hp["blocks_per_tensor"]), "--seed", str(seed),
            *[str(a) for a in spec["methods"][method]["external"].get("args", [])]]


def pfedgate_curve(evaluations: Sequence[Sequence[float]], rounds: int) -> tuple[list[float], float]:
    """The launcher's ``[round, accuracy %]`` evaluations (round 0: the initial model) -> (rounds 1..rounds, the
    initial model's accuracy)."""
    if [int(r) for r, _ in evaluations] != list(range(rounds + 1)):
        raise SystemExit(f"error: evaluations after rounds {[int(r) for r, _ in evaluations]}, expected 0..{rounds}")
    return [float(a) for _, a in evaluations[1:]], float(evaluations[0][1])


def run_pfedgate(spec: Mapping[str, Any], method: str, partition: str, checkout: Path, python: str,
                 split: Path) -> tuple[dict[str, list[float]], dict[str, float], list[str], float]:
    """Run the official pFedGate code on the exported split through the launcher, one process per seed (in
    parallel); per seed, accuracy (%) per round, and the initial model's."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "WANDB_MODE": "disabled"}
    start = time.time()
    results, cmd = launch_per_seed(spec, method, partition, checkout, env,
                                   lambda seed, out: pfedgate_command(spec, method, partition, python, split, seed,
                                                                      out))
    curves, initial = {}, {}
    for seed, r in results.items():
        curves[str(seed)], initial[str(seed)] = pfedgate_curve(r["evaluations"], int(spec["setting"]["rounds"]))
    shown = [f"<pflrepro>/scripts/{PFEDGATE_LAUNCHER.name}" if c == str(PFEDGATE_LAUNCHER) else
             "<seed>" if i > 0 and cmd[i - 1] == "--seed" else
             f"crosscheck_{method}_{partition}_s<seed>" + Path(c).suffix if f"{method}_{partition}_s" in c else
             c.replace(str(checkout) + "/", "") for i, c in enumerate(cmd)][1:]
    return curves, initial, shown, time.time() - start


def extra_reference_path(results: Path, method: str, partition: str) -> Path:
    """Where extra repetitions of theirs (beyond the table's seeds) are kept: beside the table's reference."""
    return results / method / f"reference_seeds_{partition}.json"


def merge_extra_repetitions(previous: Mapping[str, Any] | None, ref: Mapping[str, Any],
                            table_seeds: Sequence[Any]) -> dict[str, Any]:
    """``ref`` (new repetitions of theirs) added to ``previous`` (the extra repetitions kept so far, or None): their
    curves (and per-seed extras) side by side, sorted by seed, each seed's command and seconds kept. Refuses a seed of
    the table's (those are the committed reference's) or one already kept, and repetitions of another commit,
    setting (other than its seeds) or command."""
    new = [str(s) for s in ref["curves"]]
    clash = sorted(set(new) & {str(s) for s in table_seeds}, key=int)
    if clash:
        raise SystemExit(f"error: seed(s) {', '.join(clash)} are the table's: extra repetitions need other --seeds")
    merged = {k: v for k, v in ref.items() if k not in ("curves", "seconds", *EXTRA_KEY.values())}
    merged["setting"] = {k: v for k, v in ref["setting"].items() if k != "seeds"}
    runs = {s: {"seconds": ref["seconds"]} for s in new}
    curves = dict(ref["curves"])
    extras = {key: dict(ref[key]) for key in set(EXTRA_KEY.values()) if key in ref}
    if previous is not None:
        for key in ("external", "setting", "our_split", "metric"):
            if previous[key] != merged[key]:
                raise SystemExit(f"error: the kept extra repetitions have another {key} than these: "
                                 f"{previous[key]!r} vs {merged[key]!r}")
        again = sorted(set(new) & set(previous["curves"]), key=int)
        if again:
            raise SystemExit(f"error: seed(s) {', '.join(again)} are kept already as extra repetitions")
        curves = {**previous["curves"], **curves}
        runs = {**previous["runs"], **runs}
        for key in set(EXTRA_KEY.values()):
            if key in previous or key in extras:
                extras[key] = {**previous.get(key, {}), **extras.get(key, {})}
    order = sorted(curves, key=int)
    merged["seeds"] = [int(s) for s in order]
    merged["table_seeds"] = [int(s) for s in table_seeds]
    merged["runs"] = {s: runs[s] for s in order}
    merged["curves"] = {s: curves[s] for s in order}
    for key, values in extras.items():
        merged[key] = {s: values[s] for s in sorted(values, key=int)}
    return merged


RUNNERS = {
    "pfllib": {"run": run_pfllib, "cwd": "system/",
               "metric": "rs_test_acc (test accuracy pooled over all clients), entries 1..rounds, in %",
               "seeds_are": "PFLlib's -t repetitions 0..n-1 (no seed option; torch.manual_seed(0) at start)"},
    "pfedhn": {"run": run_pfedhn, "cwd": "./",
               "metric": "test_avg_acc (test accuracy pooled over all clients, of the models the hypernetwork "
                         "generates) after steps num_clients + 1, 2 num_clients + 1, ..., (rounds - 1) num_clients "
                         "+ 1 and rounds x num_clients (entries 1..rounds), in %",
               "seeds_are": "the trainer's --seed (set_seed: numpy, random, torch)"},
    "fedselect": {"run": run_fedselect, "cwd": "./",
                  "metric": "the per-client test accuracies fedselect.py prints after every round's local training "
                            "(before the server average; our stage pre), averaged over clients of equal test "
                            "size (= pooled), in %",
                  "seeds_are": "fedselect.py's --seed (setup_seed: torch, numpy, random)"},
    "fjord": {"run": run_fjord, "cwd": CODE_DIR["fjord"] + "/",
              "metric": "test accuracy pooled over all clients of each client's width-max_p submodel of the new "
                        "global model, evaluated by the baseline's FjORDClient.evaluate on the client's test samples "
                        "after the round's aggregation (scripts/crosscheck_fjord.py), rounds 1..rounds, in %",
              "seeds_are": "the launcher's --seed (torch, numpy and random seeded as fjord/main.py main)"},
    "pfedgate": {"run": run_pfedgate, "cwd": "./",
                 "metric": "the pooled test accuracy pFedGateAggregator.write_logs computes after each round "
                           "(side_info['global_metric']: each client's gated model on its test samples, weighted by "
                           "test size; scripts/crosscheck_pfedgate.py), rounds 1..rounds, in %",
                 "seeds_are": "run_experiment.py's --seed (torch, random and numpy seeded at the start)"},
    **{code: {"run": run_nested, "cwd": CODE_DIR[code] + "/",
              "metric": "test accuracy pooled over all clients of the model each client holds after the round (its "
                        "width's model with its slice of the new global model; scripts/crosscheck_heterofl.py), rounds "
                        "1..rounds, in %",
              "seeds_are": "their seed (torch.manual_seed at the start of the run)"}
       for code in ("heterofl", "fedrolex")},
}
#: what a runner's second result is, kept in the reference: PFLlib's evaluations after the last round (FedBABU's
#: fine-tuned models), the nested codes' own metrics
EXTRA_KEY = {"pfllib": "trailing", "pfedhn": "trailing", "fedselect": "trailing", "heterofl": "their_metrics",
             "fedrolex": "their_metrics", "fjord": "their_metrics", "pfedgate": "initial"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", required=True, help="a git checkout of the external code")
    parser.add_argument("--code", choices=sorted(RUNNERS), default="pfllib", help="which external code it is")
    parser.add_argument("--methods", nargs="+", help="default: every method whose external code is --code")
    parser.add_argument("--partitions", nargs="+")
    parser.add_argument("--python", default=sys.executable, help="the interpreter for the external code")
    parser.add_argument("--spec", default=str(SPEC))
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--seeds", nargs="+", type=int,
                        help="repetitions instead of the spec's seeds: PFLlib's are 0..n-1 (its -t n, one after the "
                             "other from torch.manual_seed(0)), the other codes' any seeds; write them to another "
                             "--results folder, or add them as --extra repetitions")
    parser.add_argument("--extra", action="store_true",
                        help="the --seeds (none of the table's; not PFLlib) are extra repetitions of theirs: added to "
                             "<results>/<method>/reference_seeds_<partition>.json (read by scripts/crosscheck_seeds.py "
                             "for the between-seed spread); the table's reference_<partition>.json stays as it is")
    args = parser.parse_args(argv)
    if args.extra and (not args.seeds or args.code == "pfllib"):
        raise SystemExit("error: --extra needs --seeds and an external code that takes any seed (not pfllib)")
    spec = load_spec(args.spec)
    table_seeds = list(spec["setting"]["seeds"])
    spec = with_seeds(spec, args.seeds, args.code)
    checkout = Path(args.checkout).resolve()
    commit = git_commit(checkout, CODE_DIR[args.code])
    runner = RUNNERS[args.code]
    methods = args.methods or [m for m, v in spec["methods"].items() if v["external"]["code"] == args.code]
    exported: dict[str, Path] = {}
    for method in methods:
        if method not in spec["methods"]:
            raise SystemExit(f"error: unknown method {method!r}; conf/crosscheck.yaml has {', '.join(spec['methods'])}")
        ext = spec["methods"][method]["external"]
        if ext["code"] != args.code:
            raise SystemExit(f"error: {method}'s external code is {ext['code']!r}, not --code {args.code}; run it "
                             f"with --code {ext['code']} and a checkout of {spec['external'][ext['code']]['repo']}")
        for partition in method_partitions(spec, method):
            if args.partitions and partition not in args.partitions:
                continue
            if partition not in exported:
                exported[partition] = export_split(spec, partition, export_folder(args.code, partition, checkout))
            data = exported[partition].name if args.code in READS_BY_NAME else exported[partition]
            curves, extra, cmd, seconds = runner["run"](spec, method, partition, checkout, args.python, data)
            out = Path(args.results) / method / f"reference_{partition}.json"
            if args.extra:
                out = extra_reference_path(Path(args.results), method, partition)
            out.parent.mkdir(parents=True, exist_ok=True)
            ref = {"method": method, "partition": partition,
                   "external": {"repo": spec["external"][ext["code"]]["repo"], "commit": commit,
                                "algo": ext["algo"], "command": cmd, "cwd": runner["cwd"]},
                   **({"model": "FedAvgCNN with BatchNorm2d after each conv (scripts/pfllib_bn_cnn.py)"}
                      if ext.get("norm", "none") == "bn" else {}),
                   **({"model": "the official CNNHyper / CNNTarget with in_channels=1 on the images zero-padded to "
                               "32x32 (scripts/crosscheck_pfedhn.py)"} if args.code == "pfedhn" else {}),
                   **({"model": "PFLlib's FedAvgCNN (our cnn_fedavg) in place of ResNet-18, classifier named fc "
                               "(scripts/crosscheck_fedselect.py)"} if args.code == "fedselect" else {}),
                   "setting": spec["setting"], "our_split": spec["partitions"][partition],
                   "metric": runner["metric"], "seeds_are": runner["seeds_are"],
                   "platform": {"python": platform.python_version(), "machine": platform.machine()},
                   **({"model": "PFLlib's FedAvgCNN (our cnn_fedavg) built from the baseline's ordered-dropout layers "
                               "(scripts/crosscheck_fjord.py)"} if args.code == "fjord" else {}),
                   **({"model": "the official AdaptedLeafCNN1 with FC 512 and 10 outputs (= our cnn_fedavg; "
                               "scripts/crosscheck_pfedgate.py)"} if args.code == "pfedgate" else {}),
                   **({"model": "their Conv (models/conv.py), BatchNorm, scaler; conv widths and per-client rates as "
                               "in the command"} if args.code in ("heterofl", "fedrolex") else {}),
                   "seconds": round(seconds, 1), "curves": curves, **({EXTRA_KEY[args.code]: extra} if extra else {})}
            if args.extra:
                previous = json.loads(out.read_text()) if out.is_file() else None
                ref = merge_extra_repetitions(previous, ref, table_seeds)
            out.write_text(json.dumps(ref, indent=1) + "\n")
            best = sum(max(c) for c in curves.values()) / len(curves)
            final = sum(c[-1] for c in curves.values()) / len(curves)
            print(f"{method} {partition}: best {best:.2f} final {final:.2f} ({seconds:.0f} s) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
