"""Cross-check FedAMP's server step against two independent implementations, on the models our FedAMP uploads.

    python scripts/crosscheck_fedamp_attention.py --flgo-fedamp <easyFL>/resources/algorithm/fedamp.py \
        --fling <Fling checkout> [--out results/crosscheck/fedamp/attention.json]

Our FedAMP trains on a federation of class-sharing pairs (6 clients of digits, clients 2k and 2k+1 holding the
same two classes) in both attention forms; every round, the participants' flat parameter vectors it hands to its
attention step are kept. On those same vectors:

- FLGo's FedAMP (``WwZzz/easyFL`` ``resources/algorithm/fedamp.py``, ``Server.get_weights``; needs ``flgo==0.4.4``)
  computes xi with ``heur=True`` (HeurFedAMP, our ``attention=cosine``: ``sigma`` there is our ``cos_scale``,
  ``sa`` our ``self_weight``) and ``heur=False`` (our ``attention=distance``: ``alpha`` our alpha_k of the round);
- Fling's FedAMP (``FLAIR-Community/Fling`` @8f1e924, ``fling/component/group/fedamp_group.py``,
  ``FedAMPServerGroup.aggregate``, the framework FedCAC's authors run FedAMP in; needs Fling's package and its
  imports: easydict, timm, einops, tensorboard) builds every client's cloud model u_i in the distance form.

Each external model is a module with one parameter, the flat vector (both codes flatten a model's parameters or its
state dict; ours excludes buffers, so a model with BatchNorm statistics would add them on FLGo's side: the
federation's model here has none). Written to ``--out``: per form and round, the largest absolute difference of
xi (FLGo) and of u_i (Fling) from ours, and whether every one is within ``--tolerance``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.experiment.compose import compose_config  # noqa: E402
from bench.experiment.run import execute  # noqa: E402
from methods import fedamp  # noqa: E402

PAIRS = [[1.0 if c in (2 * (i // 2), 2 * (i // 2) + 1) else 0.0 for c in range(10)] for i in range(6)]
SETTING = ["dataset=digits", "partition=class_mix", f"partition.mixes={json.dumps(PAIRS)}", "partition.n_train=40",
           "partition.n_test=10", "num_clients=6", "rounds=4", "model=small_cnn", "model.options.norm=none",
           "train.epochs=1", "train.batch_size=10", "train.lr=0.1", "method=fedamp", "quiet=true", "cache_dir=null",
           "logger.wandb.mode=disabled"]
#: our overrides per form: FLGo's HeurFedAMP values; a distance form whose sigma is on this model's d^2 scale
FORMS = {"cosine": ["method.attention=cosine", "method.start=cloud"],
         "distance": ["method.sigma=0.3", "method.alpha_k=0.05", "method.lam=0.01"]}


def our_inputs(form: str, out_dir: Path) -> tuple[fedamp.FedAMPHyper, list[tuple[int, torch.Tensor]]]:
    """Train our FedAMP in ``form``; the (round, participants' parameter vectors) of every attention step."""
    seen: list[tuple[int, torch.Tensor]] = []
    original = fedamp.FedAMP.weights

    def capture(self: fedamp.FedAMP, round_: int, models: torch.Tensor) -> torch.Tensor:
        seen.append((round_, models.detach().clone()))
        capture.hp = self.hp  # type: ignore[attr-defined]
        return original(self, round_, models)

    fedamp.FedAMP.weights = capture  # type: ignore[method-assign]
    try:
        execute(compose_config([*SETTING, *FORMS[form], f"out_dir={out_dir / form}"]))
    finally:
        fedamp.FedAMP.weights = original  # type: ignore[method-assign]
    if not seen:
        sys.exit(f"no attention step recorded for {form}: delete {out_dir / form} (a finished run is reused)")
    return capture.hp, seen  # type: ignore[attr-defined]


def vector_module(base: type[nn.Module], size: int) -> type[nn.Module]:
    """A module class (constructible without arguments, as FLGo's model arithmetic needs) with one parameter."""

    class Vector(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(size))

    return Vector


def as_modules(cls: type[nn.Module], models: torch.Tensor) -> list[nn.Module]:
    out = []
    for row in models:
        module = cls()
        module.w.data.copy_(row.float())
        out.append(module)
    return out


@functools.cache
def flgo_module(path: Path) -> Any:
    """FLGo's FedAMP file as a module (loaded once)."""
    spec = importlib.util.spec_from_file_location("flgo_fedamp", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@functools.cache
def fling_group(checkout: Path) -> type:
    """Fling's FedAMP server group class, imported from ``checkout`` (once)."""
    sys.path.insert(0, str(checkout))
    from fling.component.group.fedamp_group import FedAMPServerGroup

    return FedAMPServerGroup


def flgo_weights(path: Path, hp: fedamp.FedAMPHyper, alpha: float, models: torch.Tensor) -> torch.Tensor:
    module = flgo_module(path)
    from flgo.utils.fmodule import FModule

    server = module.Server.__new__(module.Server)
    heur = hp.attention == "cosine"
    server.sigma = hp.cos_scale if heur else hp.sigma
    server.alpha = alpha
    server.sa = hp.self_weight if hp.self_weight is not None else 1.0 / len(models)
    return server.get_weights(as_modules(vector_module(FModule, models.shape[1]), models), heur=heur).double()


def fling_clouds(checkout: Path, alpha: float, sigma: float, round_: int, models: torch.Tensor) -> torch.Tensor:
    FedAMPServerGroup = fling_group(checkout)  # noqa: N806 (a class)
    from easydict import EasyDict

    n = len(models)
    group = FedAMPServerGroup.__new__(FedAMPServerGroup)
    group.args = EasyDict({"client": {"client_num": n}, "learn": {"alphaK": alpha, "sigma": sigma, "device": "cpu",
                                                                   "decay_frequency": 30, "decay_rate": 0.1}})
    group.alphaK, group.sigma, group.lamda = alpha, sigma, 1.0  # what its __init__ sets from args
    cls = vector_module(nn.Module, models.shape[1])
    group.clients = [SimpleNamespace(model=m, fed_keys=["w"]) for m in as_modules(cls, models)]
    group.client_ws = [None] * n
    group.client_us = [cls() for _ in range(n)]
    group.aggregate(round_ - 1)  # Fling's train_round is 0-based; only its alphaK decay reads it
    return torch.stack([u.w.detach() for u in group.client_us]).double()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flgo-fedamp", type=Path, required=True, help="easyFL's resources/algorithm/fedamp.py")
    parser.add_argument("--fling", type=Path, required=True, help="a Fling checkout at 8f1e924 (its FedAMP group)")
    parser.add_argument("--runs", type=Path, default=Path("/tmp/crosscheck_fedamp_runs"))
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest accepted absolute difference")
    parser.add_argument("--out", type=Path, default=ROOT / "results/crosscheck/fedamp/attention.json")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"setting": SETTING, "forms": {}, "tolerance": args.tolerance}
    ok = True
    for form in FORMS:
        hp, steps = our_inputs(form, args.runs)
        rows = []
        for round_, models in steps:
            method = SimpleNamespace(hp=hp, alpha=lambda r, hp=hp: fedamp.FedAMP.alpha(SimpleNamespace(hp=hp), r))
            alpha = method.alpha(round_)
            ours = fedamp.FedAMP.weights(method, round_, models)  # type: ignore[arg-type]
            row = {"round": round_, "flgo_xi_max_abs_diff": float((flgo_weights(args.flgo_fedamp, hp, alpha, models)
                                                                  - ours).abs().max()),
                   "top_partner": fedamp.attention_spread(ours, list(range(len(models))))["xi_top_partner"]}
            if form == "distance":
                clouds = ours @ models.double()
                theirs = fling_clouds(args.fling, alpha, hp.sigma, round_, models)
                row["fling_u_max_abs_diff"] = float((theirs - clouds).abs().max())
            ok &= all(v <= args.tolerance for k, v in row.items() if k.endswith("diff"))
            rows.append(row)
        report["forms"][form] = {"overrides": FORMS[form], "rounds": rows}
    report["agree"] = ok
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({f: [{k: v for k, v in r.items() if k != "top_partner"} for r in d["rounds"]]
                      for f, d in report["forms"].items()}, indent=1))
    print(f"{'agree' if ok else 'DIFFER'} (tolerance {args.tolerance:g}) -> {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
