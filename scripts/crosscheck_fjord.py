"""Run the official FjORD code (Flower's baseline, adap/flower ``baselines/fjord``) unmodified on one of our exported
client splits.

    cd <flower checkout>/baselines/fjord && python <this file> --split <exported folder> --widths <p_i per client> \
        --p-s <widths> --rounds R --lr LR --batch-size B --epochs E --seed S [--no-distill] --out <json>

The official baseline trains its ordered-dropout ResNet-18 on its own CIFAR-10 split (``fjord/models.py``
``get_net``, ``fjord/dataset.py`` ``load_data``) inside a Ray simulation (``fjord/main.py``
``fl.simulation.start_simulation``). This launcher changes only those inputs and the simulation shell:

- ``fjord.client.get_net`` builds PFLlib's FedAvgCNN (our ``cnn_fedavg``: conv5x5 32 and 64, each + ReLU +
  maxpool2, FC 512 + ReLU, FC to the classes) from the baseline's own ordered-dropout layers
  (``fjord/od/models/utils.py`` ``create_conv_layer`` / ``create_linear_layer``, ``od=True``; the classifier
  with ``is_od=False`` as its ResNet's), forwarding one sampler as its ResNet does (``sampler()`` per OD layer).
- ``fjord.client.load_data`` returns client ``cid``'s part of our split: its training samples in a loader made as
  the baseline's (``shuffle=True`` with a generator seeded by the run's seed, so the same batch order in every
  round, as its clients are rebuilt each round) and its test samples (batch 1024).
- The server loop that ``start_simulation`` runs, in one process: every round, every client is built anew (as the
  baseline's ``client_fn``) and fitted (``FjORDClient.fit`` -> ``models.train``) with the baseline's
  ``get_fit_config_fn``; the server aggregates with the baseline's strategy (``FjORDFedAVG.aggregate_fit`` ->
  ``strategy.aggregate``: nested, per-entry averaging weighted by training size), then every client evaluates the
  new global model at its own width on its own test samples (``FjORDClient.evaluate`` -> ``models.test`` at
  ``[max_p]``; the baseline's server-side evaluation uses CIFAR-10's global test set instead).

Seeding as ``fjord/main.py`` ``main``: torch, numpy and random seeded with ``--seed``, deterministic algorithms.
Writes ``--out``: the pooled test accuracy (%) per round and each client's. Needs torch, numpy, flwr, coloredlogs,
tqdm.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared launcher helpers beside this file
from crosscheck_launch import SPLIT_HELP, split_and_code_args  # noqa: E402


def od_fedavg_cnn(od_utils: Any, samplers: Any, in_channels: int = 1, num_classes: int = 10,
                  image_size: int = 28) -> Any:
    """PFLlib's FedAvgCNN from the baseline's ordered-dropout layers (its ``create_*_layer`` helpers)."""
    import torch.nn.functional as F
    from torch import nn

    side = ((image_size - 4) // 2 - 4) // 2

    class ODFedAvgCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.od = True
            self.conv1 = od_utils.create_conv_layer(True, True, in_channels, 32, kernel_size=5)
            self.conv2 = od_utils.create_conv_layer(True, True, 32, 64, kernel_size=5)
            self.fc1 = od_utils.create_linear_layer(True, True, 64 * side * side, 512)
            self.fc = od_utils.create_linear_layer(True, False, 512, num_classes)

        def forward(self, x: Any, sampler: Any = None) -> Any:
            if sampler is None:
                sampler = samplers.BaseSampler(self)
            x = F.max_pool2d(F.relu(self.conv1(x, p=sampler())), 2)
            x = F.max_pool2d(F.relu(self.conv2(x, p=sampler())), 2)
            x = F.relu(self.fc1(x.flatten(1), p=sampler()))
            return self.fc(x)

    return ODFedAvgCNN()


def client_loaders(split: Path, cid: int, batch_size: int, seed: int, eval_batch_size: int = 1024) -> tuple[Any, Any]:
    """Client ``cid``'s (train, test) loaders as the baseline's ``load_data`` makes them, on our split."""
    import numpy as np
    import torch
    import torch.utils.data as tud

    parts = []
    for part in ("train", "test"):
        data = np.load(split / part / f"{cid}.npz", allow_pickle=True)["data"].tolist()
        parts.append(tud.TensorDataset(torch.from_numpy(data["x"]).float(), torch.from_numpy(data["y"]).long()))
    g = torch.Generator()
    g.manual_seed(seed)
    return (tud.DataLoader(parts[0], batch_size=batch_size, shuffle=True, generator=g),
            tud.DataLoader(parts[1], batch_size=eval_batch_size))


def pooled(accuracies: Sequence[float], sizes: Sequence[int]) -> float:
    """Accuracy (%) pooled over clients: their accuracies (fractions) weighted by test size."""
    return 100.0 * sum(a * n for a, n in zip(accuracies, sizes, strict=True)) / sum(sizes)


def check_widths(widths: Sequence[float], p_s: Sequence[float]) -> None:
    """Every client's width must be one of the sampled widths (the baseline's tiers are entries of ``p_s``)."""
    bad = sorted({w for w in widths if not any(abs(w - p) < 1e-9 for p in p_s)})
    if bad:
        raise SystemExit(f"error: --widths {bad} are not in --p-s {list(p_s)}: every client width must be a p value")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", required=True, help=SPLIT_HELP)
    parser.add_argument("--widths", nargs="+", type=float, required=True, help="max_p per client")
    parser.add_argument("--p-s", nargs="+", type=float, required=True, help="the p values the baseline samples")
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--weight-decay", type=float, default=0.0, help="the baseline's default: 1e-4")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--no-distill", action="store_true", help="train_mode fjord (default: fjord_kd)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    split, _ = split_and_code_args(args.split, [])
    check_widths(args.widths, args.p_s)
    clients = len(list((split / "train").glob("*.npz")))
    if clients != len(args.widths):
        raise SystemExit(f"error: {split} holds {clients} clients but --widths lists {len(args.widths)}")

    import fjord.client as fclient  # the checkout's code
    import numpy as np
    import torch
    from fjord.main import get_fit_config_fn
    from fjord.od import samplers
    from fjord.od.models import utils as od_utils
    from fjord.strategy import FjORDFedAVG
    from fjord.utils.logger import Logger
    from fjord.utils.utils import get_parameters
    from flwr.common import FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.common.typing import Code

    Logger.setup_logging(loglevel="warning")  # as fjord/main.py run_app, without its log file
    torch.manual_seed(args.seed)  # as fjord/main.py main
    torch.use_deterministic_algorithms(True)
    np.random.seed(args.seed)
    random.seed(args.seed)
    p_s = sorted(args.p_s)
    sample = torch.from_numpy(np.load(split / "train" / "0.npz", allow_pickle=True)["data"].tolist()["x"][:1])
    info = json.loads((split / "config.json").read_text())

    def get_net(_name: str, _p_s: Any, device: Any) -> Any:
        return od_fedavg_cnn(od_utils, samplers, int(sample.shape[1]), int(info["num_classes"]),
                             int(sample.shape[-1])).to(device)

    fclient.get_net = get_net
    fclient.load_data = lambda _path, cid, bs, seed: client_loaders(split, int(cid), bs, seed)
    device = torch.device("cpu")
    model = get_net("", p_s, device)
    trainloader, _ = client_loaders(split, 0, args.batch_size, args.seed)
    agg_config = fclient.get_agg_config(model, trainloader, p_s)
    train_config = SimpleNamespace(batch_size=args.batch_size, lr=args.lr, optimiser="sgd", momentum=0.0,
                                   nesterov=False, lr_scheduler="static", weight_decay=args.weight_decay,
                                   local_epochs=args.epochs)
    strategy = FjORDFedAVG(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=2, min_evaluate_clients=1,
                           min_available_clients=clients)
    fit_config = get_fit_config_fn(args.rounds, args.lr)
    params = get_parameters(get_net("", p_s, device))
    logdir = tempfile.mkdtemp(prefix="fjord_crosscheck_")

    def client(cid: int) -> Any:  # as fjord/main.py get_client_fn's client_fn
        return fclient.FjORDClient(cid=cid, model_name="od_fedavg_cnn", model_path=logdir, data_path=str(split),
                                   know_distill=not args.no_distill, max_p=args.widths[cid], p_s=p_s,
                                   train_config=train_config, fjord_config=agg_config,
                                   log_config={"loglevel": "warning"}, device=device, seed=args.seed)

    curve, per_client = [], []
    for rnd in range(1, args.rounds + 1):
        results = []
        for cid in range(clients):
            new, n, metrics = client(cid).fit(params, fit_config(rnd))
            results.append((None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(new), n, metrics)))
        aggregated, _ = strategy.aggregate_fit(rnd, results, [])
        params = parameters_to_ndarrays(aggregated)
        accs, sizes = [], []
        for cid in range(clients):
            _, n, metrics = client(cid).evaluate(params, {"current_round": rnd, "total_rounds": args.rounds})
            accs.append(float(metrics["accuracy"]))
            sizes.append(int(n))
        curve.append(pooled(accs, sizes))
        per_client.append([100.0 * a for a in accs])
        print(f"round {rnd}: {curve[-1]:.2f}", flush=True)
    Path(args.out).write_text(json.dumps({"curve": curve, "their_metrics": {"per_client": per_client}}) + "\n")
    for f in Path(logdir).glob("*.checkpoint"):
        os.unlink(f)
    os.rmdir(logdir)


if __name__ == "__main__":
    main()
