"""Run the official pFedGate code (yxdyc/pFedGate ``run_experiment.py``) unmodified on one of our exported client
splits.

    cd <pFedGate checkout> && python <this file> --split <exported folder> --out <json> -- emnist pFedGate \
        <run_experiment.py arguments>

The official code reads only its own data sets (``utils/utils.py`` ``get_loaders``: index pickles into EMNIST,
FEMNIST, CIFAR-10/100) and builds its own network per data set (``get_model``: for ``emnist`` the LEAF CNN
``AdaptedLeafCNN1`` with 62 classes and a 2048-unit hidden layer). This launcher changes only those inputs, before
``run_experiment.py`` runs as ``__main__`` with the given arguments (data set name ``emnist``: 1-channel 28x28
images, which its gating layer reads as 784 inputs, ``models/gating_layers.py``):

- ``get_loaders`` returns, per client, loaders over the folder ``bench.partition export --format pfllib`` wrote
  (``train/<i>.npz`` and ``test/<i>.npz``, images as our runs see them, so no further normalisation), made as its
  ``get_loader`` makes them: ``shuffle`` for training only, a generator seeded with 1234, no ``drop_last`` (1-channel
  data sets), items ``(x, y, index)``; no validation part (as its splits without ``val`` files).
- ``AdaptedLeafCNN1`` gets ``--hidden`` units in its hidden layer and ``--classes`` outputs (its layers ``fc1`` and
  ``output`` replaced before use; its ``forward`` / ``adapted_forward`` do not depend on their sizes): with 512, the
  network is PFLlib's FedAvgCNN (our ``cnn_fedavg``: conv5x5 32 and 64 without padding, each + ReLU + maxpool2,
  FC 512 + ReLU, FC to the classes).
- NumPy 1.24 removed the alias ``np.int`` (of the built-in ``int``), which the block selection uses
  (``pFedGate/gated_learner.py`` ``select_top_trans_weights``); it is restored as that alias. PyTorch 2.0 removed
  ``torch._six``, from which ``utils/sparse_factor_schedule.py`` imports only ``inf``: a module with ``inf =
  math.inf`` (what it was) stands in.
- wandb runs disabled (``WANDB_MODE=disabled``, unless set): the code logs to it, and offline runs need no account.

Everything else (the gating layer, block selection, training, aggregation, evaluation, seeding) is the checkout's
code as it is. The pooled test accuracy the aggregator computes after each round (``pFedGateAggregator.write_logs``,
kept as ``side_info["global_metric"]``) is written to ``--out``: ``evaluations``, ``[round, accuracy in %]`` per
evaluation (round 0: the initial model, evaluated when the aggregator is built; ``run_experiment.py`` trains
``--n_rounds`` + 1 rounds, its loop runs while ``current_round <= n_rounds``). Needs torch,
torchvision, numpy, numba, wandb, tensorboard, scikit-learn, networkx, matplotlib, cvxpy and tqdm.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import runpy
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared launcher helpers beside this file
from crosscheck_launch import SPLIT_HELP, split_and_code_args  # noqa: E402


class ExportedClient:
    """One client's part of the split as the official ``Sub*`` data sets serve it: ``data``, ``targets`` and items
    ``(x, y, index)``."""

    def __init__(self, path: Path) -> None:
        import numpy as np
        import torch

        data = np.load(path, allow_pickle=True)["data"].tolist()
        self.data, self.targets = torch.from_numpy(data["x"]).float(), torch.from_numpy(data["y"]).long()
        if self.data.ndim != 4:
            raise SystemExit(f"error: {path}: expected images [n, c, h, w], got {tuple(self.data.shape)}")

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def __getitem__(self, index: int) -> tuple[Any, int, int]:
        return self.data[index], int(self.targets[index]), index


def exported_loaders(split: Path, batch_size: int) -> tuple[dict, dict, dict]:
    """(train, val, test) loaders per client id (its string), made as the official ``get_loader``."""
    from torch import Generator
    from torch.utils.data import DataLoader

    def loader(path: Path, train: bool) -> DataLoader:
        g = Generator()
        g.manual_seed(1234)
        return DataLoader(ExportedClient(path), batch_size=batch_size, shuffle=train, drop_last=False, generator=g)

    clients = sorted(int(p.stem) for p in (split / "train").glob("*.npz"))
    train = {str(c): loader(split / "train" / f"{c}.npz", True) for c in clients}
    test = {str(c): loader(split / "test" / f"{c}.npz", False) for c in clients}
    return train, dict.fromkeys(train), test


def resized_leaf_cnn(cls: type, hidden: int, classes: int) -> Any:
    """A factory for ``cls`` (the official ``AdaptedLeafCNN1``) with ``hidden`` units and ``classes`` outputs."""
    from torch import nn

    def build(num_classes: int) -> Any:
        model = cls(num_classes=classes)
        model.fc1 = nn.Linear(model.fc1.in_features, hidden)
        model.output = nn.Linear(hidden, classes)
        model.adapted_model_para = {name: None for name, _ in model.named_parameters()}
        return model

    return build


def restore_removed_names() -> None:
    """What the official code imports from NumPy < 1.24 and torch < 2.0 and newer versions removed, as it was there:
    ``np.int`` (an alias of the built-in ``int``) and ``torch._six.inf`` (``math.inf``)."""
    import numpy as np

    if "int" not in np.__dict__:
        np.int = int  # type: ignore[attr-defined]
    try:
        import torch._six  # noqa: F401
    except ModuleNotFoundError:
        six = types.ModuleType("torch._six")
        six.inf = math.inf  # type: ignore[attr-defined]
        sys.modules["torch._six"] = six


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", required=True, help=SPLIT_HELP)
    parser.add_argument("--hidden", type=int, default=512, help="units of the CNN's hidden layer (official: 2048)")
    parser.add_argument("--classes", type=int, default=10, help="outputs of the CNN (official emnist: 62)")
    parser.add_argument("--out", required=True, help="the JSON file for the per-round pooled test accuracy")
    parser.add_argument("code_args", nargs=argparse.REMAINDER, help="-- then run_experiment.py's arguments")
    args = parser.parse_args(argv)
    split, rest = split_and_code_args(args.split, args.code_args)
    os.environ.setdefault("WANDB_MODE", "disabled")
    restore_removed_names()
    import pFedGate.gate_aggregator as gate_aggregator  # the checkout's code
    import utils.utils as official

    official.get_loaders = lambda type_, root_path, batch_size, is_validation: exported_loaders(split, batch_size)
    official.AdaptedLeafCNN1 = resized_leaf_cnn(official.AdaptedLeafCNN1, args.hidden, args.classes)
    evaluations: list[list[float]] = []  # [round, pooled test accuracy in %]
    write_logs = gate_aggregator.pFedGateAggregator.write_logs

    def logged(self: Any) -> None:
        write_logs(self)
        accuracy = float(self.global_learners_ensemble[0].side_info["global_metric"])
        evaluations.append([self.c_round, round(100 * accuracy, 4)])
        write()  # after every evaluation, so that an interrupted run leaves the rounds it finished

    def write() -> None:
        Path(args.out).write_text(json.dumps({"evaluations": evaluations, "command": rest}, indent=1) + "\n")

    gate_aggregator.pFedGateAggregator.write_logs = logged
    sys.argv = ["run_experiment.py", *rest]
    runpy.run_path("run_experiment.py", run_name="__main__")
    write()


if __name__ == "__main__":
    main()
