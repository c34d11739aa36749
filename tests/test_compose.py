"""Shared composition (bench.experiment.compose.sharing_compositions) gives exactly the configs and errors Hydra's
own does."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

import bench.experiment.compose as compose_module
from bench.experiment.compose import compose_config, sharing_compositions
from bench.experiment.spec import SCALES, expand, load_spec

pytestmark = pytest.mark.slow  # composes every cell of every spec

PAPER_CONF = Path(__file__).resolve().parent.parent / "conf" / "paper"


def same(a: object, b: object) -> None:
    """Equal as text, as resolved containers and in struct mode."""
    assert OmegaConf.to_yaml(a) == OmegaConf.to_yaml(b)
    assert OmegaConf.to_container(a, resolve=True) == OmegaConf.to_container(b, resolve=True)
    assert OmegaConf.is_struct(a) == OmegaConf.is_struct(b) is True


def paper_cells() -> list[tuple[str, ...]]:
    """Four cells (first, last and two between) of every scale of every paper table spec."""
    chosen: list[tuple[str, ...]] = []
    for path in sorted(PAPER_CONF.glob("*/*.yaml")):
        if path.name.startswith("_") or path.name == "claims.yaml":  # claims: the ledger's data, not a spec
            continue
        spec = load_spec(str(path))
        for scale in SCALES:
            try:
                cells = expand(spec, scale, None, "/tmp/runs", [])
            except ValueError:  # a scale this spec does not define
                continue
            picks = sorted({0, len(cells) // 3, 2 * len(cells) // 3, len(cells) - 1}) if cells else []
            chosen += [tuple(cells[i].overrides) for i in picks]
    return list(dict.fromkeys(chosen))


def test_paper_tables_compose_the_same_shared_and_alone() -> None:
    cells = paper_cells()
    assert len(cells) > 100  # every paper's tables and figures are in the sample
    with sharing_compositions():
        shared = [compose_config(list(c)) for c in cells]
    for overrides, cfg in zip(cells, shared, strict=True):
        same(cfg, compose_config(list(overrides)))


EDGE_CASES = [
    ["seed=3", "data_seed=${seed}", "partition=iid", "method=fedprox", "method.mu=0.5"],
    ["partition.alpha=0.1", "partition=dirichlet", "model.options.channels=[8,16]"],  # value before its group
    ["+extra.depth=2", "~train.nesterov", "++train.lr=0.2", "train.momentum=null"],
    ["model.options={channels: [4, 8], hidden: 16}", "dataset=fashion_mnist", "dataset.image_size=16"],
    ["logger.wandb.tags=[a,'b c']", "exp='quoted string'", "method=fedcac", "method=fedavg"],
]


@pytest.mark.parametrize("overrides", EDGE_CASES, ids=range(len(EDGE_CASES)))
def test_value_and_group_overrides_of_every_kind(overrides: list[str]) -> None:
    with sharing_compositions():
        compose_config(["seed=1"])  # another composition first: the shared state must not leak into the next
        shared = compose_config(overrides)
    same(shared, compose_config(overrides))


BAD = [
    ["train.lrr=0.1"],  # no such key
    ["method=nope"],  # no such group file
    ["train.lr=["],  # malformed
    ["seed=0,1"],  # a sweep in a single composition
    ["+train.lr=0.1"],  # append onto an existing key
    ["~train.nothing"],  # delete a missing key
]


@pytest.mark.parametrize("overrides", BAD, ids=range(len(BAD)))
def test_bad_overrides_fail_with_hydras_own_error(overrides: list[str]) -> None:
    with pytest.raises(Exception) as alone:
        compose_config(overrides)
    with sharing_compositions(), pytest.raises(Exception) as shared:
        compose_config(overrides)
    assert type(shared.value) is type(alone.value)
    assert str(shared.value) == str(alone.value)


def test_each_list_of_group_choices_is_composed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    hydra_compose = compose_module.compose

    def counting(*, config_name: str, overrides: list[str]) -> object:
        calls.append(overrides)
        return hydra_compose(config_name=config_name, overrides=overrides)

    monkeypatch.setattr(compose_module, "compose", counting)
    with sharing_compositions():
        for seed in range(3):
            for alpha in (0.1, 0.5):
                compose_config(["method=fedcac", f"seed={seed}", "partition=dirichlet", f"partition.alpha={alpha}"])
        with sharing_compositions():  # a nested block shares the enclosing one
            compose_config(["partition=dirichlet", "method=fedcac", "seed=9"])  # another order: another list
            compose_config(["method=fedcac", "partition=dirichlet", "rounds=2"])
    assert calls == [["method=fedcac", "partition=dirichlet"], ["partition=dirichlet", "method=fedcac"]]
    calls.clear()
    compose_config(["method=fedcac", "seed=1"])  # outside any block: Hydra's full composition, every time
    compose_config(["method=fedcac", "seed=1"])
    assert calls == [["method=fedcac", "seed=1"]] * 2
