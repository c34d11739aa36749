"""Run the official pFedHN trainer unmodified on one of our exported client splits.

    cd <pFedHN checkout> && python <this file> --split <exported folder> -- <trainer arguments>

The official code (AvivSham/pFedHN, ``experiments/pfedhn/trainer.py``) builds its clients from CIFAR-10/100 only
(``experiments/dataset.py`` ``gen_random_loaders``, through ``BaseNodes._init_dataloaders`` in ``node.py``) and its
networks for 3-channel 32x32 images (``CNNHyper`` / ``CNNTarget`` default ``in_channels=3``). This launcher changes
only those inputs, before the trainer module is run as ``__main__`` with the given arguments:

- ``BaseNodes._init_dataloaders`` reads the folder ``bench.partition export --format pfllib`` wrote
  (``train/<i>.npz`` and ``test/<i>.npz`` per client, images as our runs see them), zero-pads the images to
  ``--pad-to`` pixels (28x28 Fashion-MNIST -> 32x32, which the target's fc1 expects; our ``cnn_pfedhn`` with
  ``conv1_padding=2`` computes the same function on the unpadded images) and makes the loaders as
  ``gen_random_loaders`` does (its ``batch_size``; ``shuffle=True`` for all three parts: the official code sets it
  when building the train loaders and never resets it, dataset.py:165-172), but for the evaluation loaders' batch
  size (``--eval-batch-size``, default: a client's whole part in one batch; the official code uses the training
  batch size). Its ``evaluate`` generates the client's weights with the hypernetwork again for every batch
  (trainer.py:48-49), so evaluating after every step with batches of 10 costs 400 hypernetwork passes; the
  accuracy does not depend on the batch size (the target has no BatchNorm or dropout). Our splits have no
  validation part: each client's first training sample stands in for it (the official trainer evaluates it with
  every test evaluation but uses it only to pick its "best" test entry, which the cross-check does not read).
- ``CNNHyper`` and ``CNNTarget`` get the default ``in_channels`` = the images' channels (a constructor argument of
  theirs, which the trainer leaves at its default).

Everything else (client sampling, inner and outer optimisers, the hypernetwork update, evaluation, seeding, the
results JSON) is the checkout's code as it is. Needs torch, torchvision, numpy and tqdm.
"""

from __future__ import annotations

import argparse
import inspect
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared launcher helpers beside this file
from crosscheck_launch import SPLIT_HELP, split_and_code_args  # noqa: E402


def load_client(path: Path, pad_to: int) -> tuple[object, object]:
    """One client's images (zero-padded to ``pad_to`` x ``pad_to``) and labels from an exported ``.npz``."""
    import numpy as np
    import torch

    data = np.load(path, allow_pickle=True)["data"].tolist()
    x, y = torch.from_numpy(data["x"]).float(), torch.from_numpy(data["y"]).long()
    if x.ndim != 4 or x.shape[-1] != x.shape[-2]:
        raise SystemExit(f"error: {path}: expected square images [n, c, h, w], got {tuple(x.shape)}")
    extra = pad_to - int(x.shape[-1])
    if extra < 0 or extra % 2:
        raise SystemExit(f"error: --pad-to {pad_to} cannot centre {x.shape[-1]}x{x.shape[-1]} images: use their size "
                         "or a larger one by an even number of pixels")
    if extra:
        x = torch.nn.functional.pad(x, (extra // 2,) * 4)
    return x, y


def exported_loaders(split: Path, num_nodes: int, batch_size: int, pad_to: int,
                     eval_batch_size: int = 0) -> tuple[list, list, list]:
    """(train, val, test) loaders per client as the official ``gen_random_loaders`` makes them, but for the
    batch size of the evaluation loaders (``eval_batch_size``; 0: a client's whole part in one batch)."""
    import torch.utils.data as tud

    clients = len(list((split / "train").glob("*.npz")))
    if clients != num_nodes:
        raise SystemExit(f"error: {split} holds {clients} clients but --num-nodes is {num_nodes}")
    params = {"batch_size": batch_size, "shuffle": True, "pin_memory": False, "num_workers": 0}
    train, test = [], []
    for cid in range(num_nodes):
        train.append(tud.TensorDataset(*load_client(split / "train" / f"{cid}.npz", pad_to)))
        test.append(tud.TensorDataset(*load_client(split / "test" / f"{cid}.npz", pad_to)))
    def evaluation(d: tud.TensorDataset) -> tud.DataLoader:
        return tud.DataLoader(d, **{**params, "batch_size": eval_batch_size or len(d)})

    # validation: the first training sample (the trainer evaluates it, but reads it only for its "best" entry)
    val = [tud.TensorDataset(*(t[:1] for t in d.tensors)) for d in train]
    return [tud.DataLoader(d, **params) for d in train], [evaluation(d) for d in val], [evaluation(d) for d in test]


def set_default(cls: type, name: str, value: object) -> None:
    """Give the constructor argument ``name`` of ``cls`` the default ``value`` (the trainer never passes it; the
    class itself stays in place, as its ``__init__`` names it in ``super(CNNTarget, self)``)."""
    init = cls.__init__
    params = [p for p in inspect.signature(init).parameters.values()
              if p.default is not inspect.Parameter.empty and p.kind == p.POSITIONAL_OR_KEYWORD]
    names = [p.name for p in params]
    if name not in names or len(params) != len(init.__defaults__ or ()):
        raise SystemExit(f"error: {cls.__name__}.__init__ has no default argument {name!r}; the launcher fits "
                         "another version of the official code")
    defaults = list(init.__defaults__)
    defaults[names.index(name)] = value
    init.__defaults__ = tuple(defaults)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", required=True, help=SPLIT_HELP)
    parser.add_argument("--pad-to", type=int, default=32, help="zero-pad the images to this size (CNNTarget: 32)")
    parser.add_argument("--eval-batch-size", type=int, default=0,
                        help="batch size of the validation and test loaders (0: a client's whole part)")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER, help="-- then the official trainer's arguments")
    args = parser.parse_args(argv)
    split, rest = split_and_code_args(args.split, args.trainer_args)
    import experiments.pfedhn.models as models  # the checkout's code
    import experiments.pfedhn.node as node

    first = load_client(split / "train" / "0.npz", args.pad_to)[0]
    channels = int(first.shape[1])  # type: ignore[attr-defined]

    def _init_dataloaders(self: node.BaseNodes) -> None:
        self.train_loaders, self.val_loaders, self.test_loaders = exported_loaders(
            split, self.n_nodes, self.batch_size, args.pad_to, args.eval_batch_size)

    node.BaseNodes._init_dataloaders = _init_dataloaders
    for cls in (models.CNNHyper, models.CNNTarget):
        set_default(cls, "in_channels", channels)
    sys.argv = ["experiments/pfedhn/trainer.py", *rest]
    runpy.run_module("experiments.pfedhn.trainer", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
