"""Run the official FedSelect code unmodified on one of our exported client splits.

    cd <fedselect checkout> && python <this file> --split <exported folder> -- <fedselect.py arguments>

The official code (lapisrocks/fedselect, ``fedselect.py``) trains torchvision's ResNet-18 on CIFAR-10 (its
``load_model`` and ``utils/train_utils.py`` ``get_data``). This launcher changes only those inputs, then runs
``fedselect.py`` as ``__main__`` with the given arguments:

- ``utils.train_utils.get_data`` returns our split, read from the folder ``bench.partition export --format pfllib``
  wrote (``train/<i>.npz`` and ``test/<i>.npz`` per client, images as our runs see them): the clients' samples
  concatenated as the training and test data sets, and client i's positions in them as ``dict_users_*[i]``.
- ``torchvision.models.resnet18`` builds PFLlib's FedAvgCNN for 1-channel 28x28 images (our ``cnn_fedavg``: conv5x5
  32 and 64, each + ReLU + maxpool2, FC 512 + ReLU) with its classifier named ``fc``, which ``load_model`` replaces
  with a fresh ``nn.Linear(fc.in_features, num_classes)`` as it does for ResNet-18. Parameter names contain
  ``weight`` / ``bias`` as the code's masks expect.
- ``torch.set_printoptions`` prints tensors in full on one line: the code keeps its per-round accuracies only in
  what it prints (``Client Accs: <tensor> | Mean: <tensor>`` after every round's local training, before the
  server average; ``fedselect_algorithm``'s return value is discarded by ``run_base_experiment``), and the caller
  reads them from this output.

Everything else (client order, LocalAlt, mask growth, the masked average, evaluation, seeding) is the checkout's
code as it is. Needs torch, torchvision, numpy and tqdm.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared launcher helpers beside this file
from crosscheck_launch import SPLIT_HELP, split_and_code_args  # noqa: E402


def fedavg_cnn(in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> Any:
    """PFLlib's FedAvgCNN (our ``cnn_fedavg``) with the classifier named ``fc``."""
    from torch import nn

    class FedAvgCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Sequential(nn.Conv2d(in_channels, 32, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2))
            self.conv2 = nn.Sequential(nn.Conv2d(32, 64, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2))
            side = ((image_size - 4) // 2 - 4) // 2
            self.fc1 = nn.Sequential(nn.Linear(64 * side * side, 512), nn.ReLU(inplace=True))
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x: Any) -> Any:
            return self.fc(self.fc1(self.conv2(self.conv1(x)).flatten(1)))

    return FedAvgCNN()


def exported_data(split: Path) -> tuple[Any, Any, dict[int, Any], dict[int, Any], Any]:
    """``get_data``'s five results for our split: train set, test set, per-client positions in each, labels."""
    import numpy as np
    import torch
    import torch.utils.data as tud

    clients = len(list((split / "train").glob("*.npz")))
    parts: dict[str, tuple[Any, dict[int, Any]]] = {}
    for part in ("train", "test"):
        xs, ys, where, start = [], [], {}, 0
        for cid in range(clients):
            data = np.load(split / part / f"{cid}.npz", allow_pickle=True)["data"].tolist()
            xs.append(torch.from_numpy(data["x"]).float())
            ys.append(torch.from_numpy(data["y"]).long())
            where[cid] = np.arange(start, start + len(data["y"]))
            start += len(data["y"])
        parts[part] = (tud.TensorDataset(torch.cat(xs), torch.cat(ys)), where)
    return parts["train"][0], parts["test"][0], parts["train"][1], parts["test"][1], np.array([])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", required=True, help=SPLIT_HELP)
    parser.add_argument("code_args", nargs=argparse.REMAINDER, help="-- then fedselect.py's arguments")
    args = parser.parse_args(argv)
    split, rest = split_and_code_args(args.split, args.code_args)
    import torch
    import torchvision.models
    import utils.train_utils as train_utils  # the checkout's code

    data = exported_data(split)
    x = data[0].tensors[0]
    if x.ndim != 4 or x.shape[-1] != x.shape[-2]:
        raise SystemExit(f"error: {split}: expected square images [n, c, h, w], got {tuple(x.shape)}")

    def resnet18(pretrained: bool = False, **_: Any) -> Any:
        if pretrained:
            raise SystemExit("error: --pretrained_init has no meaning with the substituted FedAvgCNN")
        return fedavg_cnn(int(x.shape[1]), image_size=int(x.shape[-1]))

    train_utils.get_data = lambda _args: data
    torchvision.models.resnet18 = resnet18
    torch.set_printoptions(precision=8, linewidth=1_000_000, threshold=1_000_000, sci_mode=False)
    sys.argv = ["fedselect.py", *rest]
    runpy.run_path("fedselect.py", run_name="__main__")


if __name__ == "__main__":
    main()
