"""PFLlib's initial model of one repetition, replayed with torch alone, as a model our runs can start from.

    python -m bench.experiment.run <the cross-check's overrides> 'imports=[scripts.pfllib_initial_model]' \
        model.name=cnn_fedavg_pfllib_init +model.options.repetition=1 +model.options.passes=1860
    python scripts/pfllib_initial_model.py --repetition 1 --passes 1860 [--compare <state dict saved from PFLlib>]

Our side of a cross-check started from the model PFLlib starts from, to tell what the initial model does from what
the update rule does. PFLlib draws everything from torch's global stream: ``main.py`` seeds it once with 0 and then
builds each repetition's FedAvgCNN from it; each client reseeds it with 0 when built (``clientbase.py``), after the
model; every pass through a client's DataLoader (train and test loaders alike are shuffled) then draws from it.
So repetition 0 starts from FedAvgCNN built right after ``torch.manual_seed(0)``, and every later repetition from
the model built after seed 0 and the DataLoader passes of one repetition: all repetitions from 1 on start from
the same model. This replays those draws with torch alone (no PFLlib code): FedAvgCNN creates its layers in
our ``cnn_fedavg``'s order, so the same draws give the same weights. Imported as a plugin (``imports``), it
registers the model ``cnn_fedavg_pfllib_init``: our cnn_fedavg with those weights. The command line prints a
model's fingerprint and, with ``--compare``, checks it against a state dict saved from a PFLlib run (its
``args.model`` when the server is built), exit 1 when they differ.

``passes``: the DataLoader passes of one PFLlib repetition, e.g. with ``-gr R`` global rounds (R + 1 loop
iterations), ``-eg 1`` and N clients: (R + 1) x 3 N for FedCAC (test and train evaluation, then training: 1860 for
30 rounds and 20 clients), plus FedBABU's N fine-tuning and 2 N final evaluation passes (1920).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.core.models import MODELS, SplitModel, build_model  # noqa: E402
from bench.experiment.errors import config_phase, run_cli  # noqa: E402

PFLLIB_SEED = 0  # main.py's torch.manual_seed(0), and each client's (clientbase.py)
MODEL = "cnn_fedavg_pfllib_init"


def _cnn_fedavg(num_classes: int) -> SplitModel:
    return build_model("cnn_fedavg", num_classes=num_classes, in_channels=1, image_size=28, norm="none")


def _one_pass() -> None:
    """The global-stream draws of one pass through a shuffled DataLoader (its base seed and its sampler's)."""
    for _ in DataLoader(TensorDataset(torch.zeros(2, 1)), batch_size=1, shuffle=True):
        pass


def pfllib_initial_model(repetition: int, passes: int, num_classes: int = 10) -> SplitModel:
    """Our cnn_fedavg with the weights of PFLlib's FedAvgCNN at the start of repetition ``repetition`` (``passes``
    DataLoader passes per repetition). The caller's torch stream is left as it was."""
    if repetition < 0:
        raise ValueError(f"repetition={repetition} is invalid: give PFLlib's repetition index (its -t), >= 0")
    if passes < 0:
        raise ValueError(f"passes={passes} is invalid: give the DataLoader passes of one repetition, >= 0")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(PFLLIB_SEED)
        model = _cnn_fedavg(num_classes)
        for _ in range(repetition):
            torch.manual_seed(PFLLIB_SEED)  # the clients of the repetition before
            for _ in range(passes):
                _one_pass()
            model = _cnn_fedavg(num_classes)
    return model


def cnn_fedavg_pfllib_init(*, num_classes: int, in_channels: int = 1, image_size: int = 28, width: float = 1.0,
                           norm: str = "none", repetition: int = 0, passes: int = 0) -> SplitModel:
    """cnn_fedavg (1 x 28 x 28 inputs, full width, no norm layers: PFLlib's FedAvgCNN) starting from PFLlib's
    repetition-``repetition`` initial weights."""
    if (in_channels, image_size, float(width), norm) != (1, 28, 1.0, "none"):
        raise ValueError(f"model={MODEL} is PFLlib's FedAvgCNN for 1 x 28 x 28 images at full width without norm "
                         f"layers; got in_channels={in_channels}, image_size={image_size}, width={width}, "
                         f"norm={norm!r}: use model=cnn_fedavg for anything else")
    return pfllib_initial_model(int(repetition), int(passes), num_classes)


if MODEL not in MODELS:  # loaded once as a plugin (``imports``), possibly again as a script or by a test
    MODELS.register(MODEL)(cnn_fedavg_pfllib_init)


def fingerprint(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of a state's tensors (contiguous float32 bytes, in the state's order): compares our model with one
    saved from a PFLlib run, whose key names differ but whose tensors come in the same order."""
    digest = hashlib.sha256()
    for value in state.values():
        digest.update(value.detach().to(torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetition", type=int, required=True, help="PFLlib's repetition (its -t index)")
    parser.add_argument("--passes", type=int, required=True, help="DataLoader passes of one PFLlib repetition")
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--compare", help="a state dict saved from a PFLlib run, to check the replay against")
    args = parser.parse_args(argv)
    with config_phase():
        model = pfllib_initial_model(args.repetition, args.passes, args.num_classes)
        if args.compare and not Path(args.compare).is_file():
            raise FileNotFoundError(f"--compare {args.compare}: no such file; give a state dict saved from PFLlib")
    ours = fingerprint(model.state_dict())
    print(f"repetition {args.repetition}, {args.passes} passes per repetition: {ours}")
    if args.compare:
        theirs = fingerprint(torch.load(args.compare, map_location="cpu", weights_only=True))
        print(f"{args.compare}: {theirs} ({'the same' if theirs == ours else 'DIFFERENT'})")
        return 0 if theirs == ours else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
