"""Run the official HeteroFL or FedRolex code on our exported split; per round, the accuracy of each client's model.

    cd <HeteroFL checkout>/src && python <this file> --code heterofl --data DIR --widths 1 0.5 ... --out FILE.json
    cd <FedRolex checkout>     && python <this file> --code fedrolex --data DIR --widths 1 0.5 ... --out FILE.json

(``scripts/crosscheck_external.py`` builds these commands from ``conf/crosscheck.yaml``.) Their training loop, server
(distribute / combine), model code, optimiser, gradient clipping and label masking run as they are, imported from
the checkout. Substituted around them, nothing inside:

- the data: ``fetch_dataset`` / ``split_dataset`` return our exported clients
  (``bench.experiment.partition.export_pfllib``: ``train/<i>.npz``, ``test/<i>.npz``, the images exactly as our runs
  see them); a client's ``label_split`` is the
  labels of its training data (what our ``label_mask`` calls the labels it owns);
- the settings their ``process_control`` fixes per data set (lr, momentum, weight decay, batch sizes, epochs,
  scheduler, conv widths, per-client model rates) are set right after it to the cross-check's;
- FedRolex: ``ray`` by an in-process stand-in that runs the clients one after the other, CUDA by the CPU, and the
  ResNet-18 its ``main_resnet.py`` builds by its own ``Conv`` (``models/conv.py``) with the layers renamed so that
  its server's ``split_model`` / ``combine``, which recognise layers by ``conv1`` / ``linear`` in their names,
  handle them;
- an evaluation after every round (its use of the global RNG undone, so their training is not changed by it).

Evaluation (our stage ``post``, accuracy pooled over all clients' test samples): after round t, client i's model is
their model class at the client's rate with the client's slice of the new global model (their ``distribute``;
FedRolex: the window of round t, the one the client just trained). HeteroFL (sBN): its statistics are recollected
as their ``stats()`` does for the global model (one pass over all training data, shuffled, their train batch size,
cumulative average), once per width, with the scalers in eval mode as at test time (their ``stats()`` only ever
runs the full-rate model, whose scaler divides by 1). FedRolex: none (its models track no statistics and are
evaluated so: each client's test set is one batch, as in our evaluation). Their own metrics (the full-width global
model: HeteroFL's ``Local-Accuracy`` with label masking at test time, ``Global-Accuracy``) are kept beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import types
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

SCRIPTS = {"heterofl": "train_classifier_fed.py", "fedrolex": "main_resnet.py"}


# ------------------------------------------------------------------------------------------ data
class ExportedClients(Dataset):
    """The union of our exported clients' samples of one part (train / test), as their data sets serve them."""

    classes_size = 10

    def __init__(self, folder: Path, part: str, num_clients: int) -> None:
        xs, ys, self.split = [], [], {}
        start = 0
        for cid in range(num_clients):
            data = np.load(folder / part / f"{cid}.npz", allow_pickle=True)["data"].tolist()
            xs.append(torch.from_numpy(data["x"]))
            ys.append(torch.from_numpy(data["y"]).long())
            self.split[cid] = list(range(start, start + len(data["y"])))
            start += len(data["y"])
        self.img, self.label = torch.cat(xs), torch.cat(ys)
        self.target = self.label.tolist()

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"img": self.img[index], "label": self.label[index]}


def owned_labels(dataset: ExportedClients) -> dict[int, list[int]]:
    """Per client, the sorted labels of its training samples (their ``label_split``)."""
    return {cid: sorted(set(dataset.label[idx].tolist())) for cid, idx in dataset.split.items()}


# ------------------------------------------------------------------------------------------ FedRolex stand-ins
class _Call:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.remote = fn


class _Actor:
    """A ray actor handle: ``actor.method.remote(...)`` calls the method at once and returns its result."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> _Call:
        return _Call(getattr(self._obj, name))


def ray_stand_in() -> types.ModuleType:
    """The part of ray FedRolex uses, in process: remote classes run synchronously, objects are passed as they are."""
    ray = types.ModuleType("ray")

    def remote(*args: Any, **kwargs: Any) -> Any:
        def wrap(cls: type) -> Any:
            return types.SimpleNamespace(remote=lambda *a, **k: _Actor(cls(*a, **k)))

        return wrap(args[0]) if args and isinstance(args[0], type) else wrap

    ray.remote = remote
    ray.init = lambda *a, **k: None
    ray.put = lambda obj: obj
    ray.get = lambda ref: list(ref) if isinstance(ref, list) else ref
    ray.kill = lambda actor: None
    return ray


LAYER_NAMES = {nn.Conv2d: "conv1", nn.BatchNorm2d: "n1", nn.ReLU: "relu", nn.MaxPool2d: "pool"}


def _on_cpu(cls: type) -> type:
    """``cls`` whose ``.cuda()`` and ``.to("cuda")`` leave the model on the CPU."""

    def to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        return self if args and str(args[0]).startswith("cuda") else cls.to(self, *args, **kwargs)

    return type(f"{cls.__name__}OnCPU", (cls,), {"to": to, "cuda": lambda self, *a, **k: self})


def renamed_conv(conv_factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """FedRolex's ``Conv`` with its ``blocks`` renamed ``layer<k>_conv1``, ``layer<k>_n1``, ..., ``linear``: its
    server recognises the layers it slices by ``conv1`` / ``linear`` in their names (``resnet_server.py``
    split_model, combine); the modules, their order and the forward are those of ``models/conv.py``. Calls to move
    it to CUDA keep it on the CPU."""

    def build(model_rate: float = 1, track: bool = False, cfg: Any = None) -> nn.Module:
        model = conv_factory(model_rate=model_rate, track=track)
        names, layer = [], 0
        for module in model.blocks:
            if isinstance(module, nn.Conv2d):
                layer += 1
            if isinstance(module, nn.Linear):
                name = "linear"
            elif isinstance(module, nn.AdaptiveAvgPool2d | nn.Flatten):
                name = type(module).__name__.lower()
            else:
                kind = LAYER_NAMES.get(type(module), type(module).__name__.lower())
                name = f"layer{layer}_{kind}"
            names.append(name)
        if len(set(names)) != len(names):
            raise RuntimeError(f"layer names are not unique: {names}")
        model.blocks = nn.Sequential(OrderedDict(zip(names, list(model.blocks), strict=True)))
        model.__class__ = _on_cpu(type(model))
        return model

    return build


# ------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def accuracy(model: nn.Module, dataset: ExportedClients, idx: Sequence[int]) -> tuple[int, int]:
    """(correct, total) of ``model`` (eval mode, no label mask) on the samples ``idx``, in one batch."""
    model.train(False)
    out = model({"img": dataset.img[list(idx)], "label": dataset.label[list(idx)]})["score"]
    return int((out.argmax(1) == dataset.label[list(idx)]).sum()), len(idx)


@torch.no_grad()
def recollect_like_stats(model: nn.Module, batches: Any) -> None:
    """Their ``stats()``: BatchNorm statistics (``track=True``, momentum None: cumulative average) from one pass,
    the norms in training mode and everything else (the scalers) in eval mode, as at test time."""
    model.train(False)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.train(True)
    for batch in batches:
        model(batch)


class Evaluator:
    """After each round: every client's model (see the module docstring), pooled accuracy (%)."""

    def __init__(self, code: str, train: ExportedClients, test: ExportedClients, widths: Sequence[float],
                 build: Callable[..., nn.Module], train_batches: Callable[[], Any]) -> None:
        self.code, self.train_set, self.test_set, self.widths = code, train, test, list(widths)
        self.build, self.train_batches = build, train_batches
        self.curve: list[float] = []
        self.theirs: list[dict[str, float]] = []

    def __call__(self, slices: Sequence[dict[str, torch.Tensor]]) -> None:
        rng = torch.get_rng_state()
        correct = total = 0
        by_width: dict[float, nn.Module] = {}
        for cid, state in enumerate(slices):
            width = self.widths[cid]
            if self.code == "heterofl":  # sBN: the same statistics for every client of a width (same prefix)
                if width not in by_width:
                    model = self.build(model_rate=width, track=True)
                    model.load_state_dict(state, strict=False)
                    recollect_like_stats(model, self.train_batches())
                    by_width[width] = model
                model = by_width[width]
            else:
                model = self.build(model_rate=width, track=False)
                model.load_state_dict(state)
            c, n = accuracy(model, self.test_set, self.test_set.split[cid])
            correct, total = correct + c, total + n
        torch.set_rng_state(rng)
        self.curve.append(100.0 * correct / total)
        print(f"crosscheck round {len(self.curve)}: pooled accuracy of the clients' models {self.curve[-1]:.2f}",
              flush=True)


# ------------------------------------------------------------------------------------------ main
def apply_setting(cfg: dict[str, Any], args: argparse.Namespace) -> None:
    """The cross-check's settings, over those ``process_control`` fixed for the data set."""
    if len(args.widths) != cfg["num_users"]:
        raise SystemExit(f"error: {len(args.widths)} widths for {cfg['num_users']} clients")
    cfg.update(optimizer_name="SGD", lr=args.lr, momentum=0.0, weight_decay=0.0, scheduler_name="None",
               batch_size={"train": args.batch_size, "test": 1000}, num_epochs={"global": args.rounds,
                                                                                   "local": args.epochs},
               model_rate=[float(w) for w in args.widths], device="cpu", conv={"hidden_size": list(args.channels)},
               data_shape=[1, 28, 28])


def recorded(cls: type, into: list[Any]) -> type:
    """``cls`` unchanged but for remembering each instance in ``into`` (their objects, read for the evaluation)."""

    class Recorded(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            into.append(self)

    return Recorded


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", choices=sorted(SCRIPTS), required=True)
    parser.add_argument("--data", required=True, help="our exported split (bench.experiment.partition.export_pfllib)")
    parser.add_argument("--widths", type=float, nargs="+", required=True, help="model rate per client, in order")
    parser.add_argument("--channels", type=int, nargs="+", required=True, help="the conv widths at rate 1")
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--mask", type=int, choices=(0, 1), default=1, help="their label masking (default on)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    script = Path(SCRIPTS[args.code])
    if not script.is_file():
        where = "src/ of the HeteroFL checkout" if args.code == "heterofl" else "the FedRolex checkout"
        raise SystemExit(f"error: no {script} here: run from {where}")
    sys.path.insert(0, os.getcwd())
    torch.set_num_threads(1)
    folder = Path(args.data)
    num_clients = json.loads((folder / "config.json").read_text())["num_clients"]
    train, test = ExportedClients(folder, "train", num_clients), ExportedClients(folder, "test", num_clients)
    label_split = owned_labels(train)
    control = f"1_{num_clients}_1_non-iid-2_fix_a1_bn_1_{args.mask}"

    if args.code == "fedrolex":
        sys.modules["ray"] = ray_stand_in()
    import data as their_data  # noqa: I001 (the checkout's modules, cwd first on sys.path: not ours)
    import utils as their_utils
    from config import cfg

    their_data.fetch_dataset = lambda data_name, subset: {"train": train, "test": test}
    their_data.split_dataset = lambda dataset, num_users, mode: (
        {"train": dict(train.split), "test": dict(test.split)}, dict(label_split))
    process_control = their_utils.process_control

    def process_control_then_setting() -> None:
        process_control()
        apply_setting(cfg, args)

    their_utils.process_control = process_control_then_setting
    if args.code == "heterofl":
        import fed
        import models

        build = models.conv
        feds: list[Any] = []
        fed.Federation = recorded(fed.Federation, feds)  # their Federation, remembered for the evaluation

        def slices() -> list[dict[str, torch.Tensor]]:
            return feds[-1].distribute(list(range(num_clients)))[0]

        argv_script = ["--data_name", "MNIST", "--model_name", "conv", "--control_name", control,
                       "--init_seed", str(args.seed), "--num_experiments", "1", "--device", "cpu"]
    else:
        import resnet_server
        from models import conv as their_conv
        from models import resnet

        build = renamed_conv(their_conv.conv)
        resnet.resnet18 = build
        servers: list[Any] = []
        resnet_server.ResnetServerRoll = recorded(resnet_server.ResnetServerRoll, servers)  # remembered likewise
        plain_to_device = their_utils.to_device
        their_utils.to_device = lambda data, device: plain_to_device(data, "cpu")

        def slices() -> list[dict[str, torch.Tensor]]:
            server = servers[-1]
            server.rounds -= 1  # the window of the round just trained (step() has moved it on)
            try:
                return server.distribute(list(range(num_clients)))[0]
            finally:
                server.rounds += 1

        argv_script = ["--data_name", "MNIST", "--model_name", "resnet18", "--control_name", control,
                       "--seed", str(args.seed), "--g_epochs", str(args.rounds), "--l_epochs", str(args.epochs),
                       "--device", "cpu", "--algo", "roll", "--weighting", "avg"]

    def train_batches() -> Any:
        loader = their_data.make_data_loader({"train": train})["train"]
        for batch in loader:
            yield their_utils.collate(batch)

    evaluate = Evaluator(args.code, train, test, args.widths, build, train_batches)
    sys.argv = [str(script), *argv_script]
    module = runpy.run_path(str(script), run_name="crosscheck")  # defines everything, runs nothing
    scope = module["main"].__globals__
    their_test = scope["test"]

    def test_then_evaluate(*a: Any, **k: Any) -> Any:
        result = their_test(*a, **k)
        logger = a[4]
        evaluate.theirs.append({name: float(logger.mean[f"test/{name}"]) for name in ("Local-Accuracy",
                                                                                       "Global-Accuracy")})
        evaluate(slices())
        return result

    scope["test"] = test_then_evaluate
    scope["main"]()
    if len(evaluate.curve) != args.rounds:
        raise SystemExit(f"error: {len(evaluate.curve)} evaluations for {args.rounds} rounds")
    out = {"curve": evaluate.curve, "their_metrics": evaluate.theirs, "widths": list(args.widths),
           "label_split": {str(k): v for k, v in label_split.items()}}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
