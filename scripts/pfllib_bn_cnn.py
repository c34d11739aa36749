"""Run PFLlib's ``main.py`` unmodified, with its FedAvgCNN replaced by the same CNN plus BatchNorm after each conv.

    cd <PFLlib checkout>/system && python <this file> main.py -algo FedBN -m CNN ...

PFLlib (at the cross-checked commit) has no BatchNorm variant of FedAvgCNN for (Fashion-)MNIST, so its FedBN on
``-m CNN`` has no norm layer to keep local and trains like FedAvg. This launcher puts a BatchNorm variant in its
place before ``main.py`` imports the model zoo, so that PFLlib's own FedBN client and server code runs on the
same network as our ``cnn_fedavg`` with ``model.options.norm=bn``: conv5x5 -> BatchNorm2d -> ReLU -> maxpool2,
twice, then FC 512 + ReLU and the classifier ``fc``. PFLlib's FedBN keeps local every parameter whose name
contains ``bn`` (and never sends buffers, so the running statistics stay local too), so the norm layers are
named ``bn``. The layers are created in FedAvgCNN's order (BatchNorm draws no random numbers), so PFLlib's
``torch.manual_seed(0)`` gives its convs and FCs the same initial weights as in its BN-free runs.
Needs only torch; the checkout's code is imported as it is.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections import OrderedDict

import torch
from torch import nn


class FedAvgCNNWithBN(nn.Module):
    """PFLlib's FedAvgCNN constructor signature; BatchNorm2d after each conv, named ``bn``."""

    def __init__(self, in_features: int = 1, num_classes: int = 10, dim: int = 1024) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(OrderedDict(conv=nn.Conv2d(cin, cout, kernel_size=5, padding=0, stride=1, bias=True),
                                             bn=nn.BatchNorm2d(cout), relu=nn.ReLU(inplace=True),
                                             pool=nn.MaxPool2d(kernel_size=(2, 2))))

        self.conv1 = block(in_features, 32)
        self.conv2 = block(32, 64)
        self.fc1 = nn.Sequential(nn.Linear(dim, 512), nn.ReLU(inplace=True))
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.flatten(self.conv2(self.conv1(x)), 1)
        return self.fc(self.fc1(out))


def main() -> None:
    if len(sys.argv) < 2 or not sys.argv[1].endswith("main.py"):
        raise SystemExit("usage: cd <PFLlib>/system && python pfllib_bn_cnn.py main.py <PFLlib arguments>")
    sys.path.insert(0, os.getcwd())
    import flcore.trainmodel.models as zoo  # PFLlib's model zoo, from the checkout

    zoo.FedAvgCNN = FedAvgCNNWithBN  # main.py does `from flcore.trainmodel.models import *` after this
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
