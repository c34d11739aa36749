"""scripts/pfllib_initial_model.py: PFLlib's initial models replayed with torch alone, for our runs to start from."""

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from bench.core.models import MODELS, build_model
from tests.helpers import script

ROOT = Path(__file__).resolve().parent.parent
SAVED = ROOT / "results" / "crosscheck" / "fedcac" / "initial_models_dir01.json"

pim: ModuleType  # the script, loaded by the fixture below


@pytest.fixture(scope="module", autouse=True)
def _script_loaded_for_this_module_only() -> Iterator[None]:
    """Loading the script registers its model (a plugin's import does); it leaves the zoo after these tests, so the
    zoo's own tests (every registered model covered, every norm-free model at every width) see the zoo alone."""
    global pim
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MODELS, "_entries", dict(MODELS._entries))  # the zoo's registry as it was comes back after
        pim = script("pfllib_initial_model")
        yield


def weights(repetition: int, passes: int) -> str:
    return pim.fingerprint(pim.pfllib_initial_model(repetition, passes).state_dict())


def test_repetition_zero_is_cnn_fedavg_built_after_seed_zero():
    torch.manual_seed(0)
    ours = build_model("cnn_fedavg", num_classes=10, in_channels=1, image_size=28, norm="none")
    assert weights(0, passes=5) == pim.fingerprint(ours.state_dict())


def test_later_repetitions_share_one_model_after_the_passes():
    zero, one, two = (weights(k, passes=3) for k in (0, 1, 2))
    assert one == two  # every client reseeds with 0 before the passes
    assert one != zero
    assert weights(1, passes=4) != one
    assert weights(1, passes=0) == zero


def test_the_callers_stream_is_left_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    pim.pfllib_initial_model(1, passes=2)
    assert torch.equal(torch.rand(3), expected)


def test_replay_gives_the_models_saved_from_pfllib_runs():
    """The fingerprints of the initial models saved from PFLlib's own FedCAC run on the Dirichlet split (its
    repetitions 0 and 1, 1860 DataLoader passes per repetition), recorded with the cross-check's results."""
    saved = json.loads(SAVED.read_text())["their_initial_models"]
    assert set(saved["sha256"]) == {"0", "1"}
    for rep, digest in saved["sha256"].items():
        assert weights(int(rep), saved["passes"]) == digest


def test_registered_model_builds_through_the_zoo(tmp_path):
    model = build_model(pim.MODEL, num_classes=10, in_channels=1, image_size=28, repetition=1, passes=2)
    assert pim.fingerprint(model.state_dict()) == weights(1, passes=2)
    with pytest.raises(ValueError, match="width=0.5"):
        build_model(pim.MODEL, num_classes=10, in_channels=1, image_size=28, width=0.5)


def test_compare_with_a_saved_state(tmp_path, capsys):
    saved = tmp_path / "init.pt"
    torch.save({f"pfllib.{k}": v for k, v in pim.pfllib_initial_model(1, passes=2).state_dict().items()}, saved)
    assert pim.main(["--repetition", "1", "--passes", "2", "--compare", str(saved)]) == 0
    assert "(the same)" in capsys.readouterr().out
    assert pim.main(["--repetition", "0", "--passes", "2", "--compare", str(saved)]) == 1
    assert "DIFFERENT" in capsys.readouterr().out


@pytest.mark.parametrize(("flag", "bad"), [(["--repetition", "-1", "--passes", "3"], "repetition=-1"),
                                         (["--repetition", "1", "--passes", "-3"], "passes=-3"),
                                         (["--repetition", "1", "--passes", "3", "--compare", "/nonexistent.pt"],
                                          "/nonexistent.pt")])
def test_bad_input_exits_2_naming_the_value(capsys, flag, bad):
    assert pim.run_cli(lambda: pim.main(flag)) == 2
    assert bad in capsys.readouterr().err
