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
  when building the train loaders and never resets it, dataset.py:165-172). Our splits have no validation part:
  the client's training samples stand in for it (the official trainer uses validation accuracy only to pick its
  "best" test entry, which the cross-check does not read).
- ``CNNHyper`` and ``CNNTarget`` get ``in_channels`` = the images' channels (a constructor argument of theirs).

Everything else (client sampling, inner and outer optimisers, the hypernetwork update, evaluation, seeding, the
results JSON) is the checkout's code as it is. Needs torch, torchvision, numpy and tqdm.
"""

from __future__ import annotations

import argparse
import functools
import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path


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


def exported_loaders(split: Path, num_nodes: int, batch_size: int, pad_to: int) -> tuple[list, list, list]:
    """(train, val, test) loaders per client as the official ``gen_random_loaders`` makes them."""
    import torch.utils.data as tud

    clients = len(list((split / "train").glob("*.npz")))
    if clients != num_nodes:
        raise SystemExit(f"error: {split} holds {clients} clients but --num-nodes is {num_nodes}")
    params = {"batch_size": batch_size, "shuffle": True, "pin_memory": False, "num_workers": 0}
    train, test = [], []
    for cid in range(num_nodes):
        train.append(tud.TensorDataset(*load_client(split / "train" / f"{cid}.npz", pad_to)))
        test.append(tud.TensorDataset(*load_client(split / "test" / f"{cid}.npz", pad_to)))
    loaders = [[tud.DataLoader(d, **params) for d in part] for part in (train, train, test)]
    return loaders[0], loaders[1], loaders[2]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", required=True, help="the folder `bench.partition export --format pfllib` wrote")
    parser.add_argument("--pad-to", type=int, default=32, help="zero-pad the images to this size (CNNTarget: 32)")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER, help="-- then the official trainer's arguments")
    args = parser.parse_args(argv)
    rest = args.trainer_args[1:] if args.trainer_args[:1] == ["--"] else args.trainer_args
    split = Path(args.split).resolve()
    if not (split / "train").is_dir():
        raise SystemExit(f"error: {split} has no train/ folder: export the split with bench.partition first")
    sys.path.insert(0, os.getcwd())
    import experiments.pfedhn.models as models  # the checkout's code
    import experiments.pfedhn.node as node

    first = load_client(split / "train" / "0.npz", args.pad_to)[0]
    channels = int(first.shape[1])  # type: ignore[attr-defined]

    def _init_dataloaders(self: node.BaseNodes) -> None:
        self.train_loaders, self.val_loaders, self.test_loaders = exported_loaders(
            split, self.n_nodes, self.batch_size, args.pad_to)

    node.BaseNodes._init_dataloaders = _init_dataloaders
    models.CNNHyper = functools.partial(models.CNNHyper, in_channels=channels)
    models.CNNTarget = functools.partial(models.CNNTarget, in_channels=channels)
    sys.argv = ["experiments/pfedhn/trainer.py", *rest]
    runpy.run_module("experiments.pfedhn.trainer", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
