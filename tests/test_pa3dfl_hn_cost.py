"""Pa3dFL Table 9 (scripts/pa3dfl/hn_cost.py): a tiny configuration measures positive times and the hypernetwork's
parameter count equals the one counted by hand from its layer sizes; the table files carry the paper's numbers in
their own columns."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from scripts.pa3dfl import hn_cost as cost

ROOT = Path(__file__).resolve().parent.parent

#: small_cnn with conv 16 and 32 channels, FC 32, on 1 x 16 x 16 inputs, 10 classes
TINY = ("model.options.channels=[16,32]", "model.options.hidden=32")
#: |V_l| = T/R1 x S x R2 by hand (R1 = p_min T = T/8: the weakest of the 6 clients has r = 0.044, so p = 1/8; conv
#: R2 = min(round(rank_scale R1 k^2), T/R1 x S) with the default rank_scale 0.75): conv1 8 x 1 x 8 (R2 = min(14, 8)),
#: conv2 8 x 16 x 27 (R2 = min(27, 128)), FC 8 x (32 channels x 4 x 4 after two max-pools of 16 x 16) x 4 (R2 = R1),
#: local head 10 x 32 + 10 biases
SIZES = [8 * 1 * 8, 8 * 16 * 27, 8 * 512 * 4, 10 * 32 + 10]


def tiny(**changes) -> cost.Setting:
    values = dict(model="small_cnn", depth=2, embed_dim=3, hidden_dim=5, num_clients=6, participation=0.5, repeats=2,
                  overrides=TINY)
    return cost.Setting(**{**values, **changes})


def test_a_tiny_configuration_gives_positive_times_and_the_hand_counted_parameters():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = cost.measure(tiny())
    finally:
        torch.set_num_threads(threads)
    assert result["participants"] == 3 and result["generated_layers"] == 4
    assert result["generated_entries"] == sum(SIZES) == 20234
    # embeddings 6 x 3, encoder Linear(3, 5) and one more Linear(5, 5), 4 temperatures, decoders Linear(5, |V_l|)
    by_hand = 6 * 3 + (3 * 5 + 5) + (5 * 5 + 5) + 4 + sum(6 * n for n in SIZES)
    assert result["hn_params"] == by_hand == 121476
    assert result["hn_params"] == cost.hn_params_by_sizes(6, 3, 5, 2, SIZES)
    assert result["hn_mb"] == pytest.approx(4 * by_hand / 1e6)
    assert result["generation_s"] > 0 and result["update_s"] > 0
    assert result["generation_cpu_s"] > 0 and result["update_cpu_s"] > 0
    assert len(result["generation_all_s"]) == len(result["update_cpu_all_s"]) == 2
    assert result["peak_rss_mb"] >= result["rss_before_build_mb"] > 0
    assert cost.hn_params_by_sizes(6, 3, 5, 1, SIZES) == by_hand - (5 * 5 + 5)  # one encoder layer fewer


def test_the_update_changes_the_hypernetwork_and_generation_does_not():
    torch.manual_seed(0)
    experiment = cost.build(tiny(depth=1))
    assert experiment.data is None and experiment.fed.data is None  # built without data
    method, engine = experiment.method, experiment.engine()
    net = method.state["hn"]["net"]
    before = [p.detach().clone() for p in net.parameters()]
    chosen = engine.participants(1)
    assert len(chosen) == tiny().participants == 3
    method.begin_round(1, chosen)
    for cid in chosen:
        method.client_model(cid)
    assert all(torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))
    times = cost.one_round(engine, 2)
    assert set(times) == {"generation_s", "update_s", "generation_cpu_s", "update_cpu_s"}
    assert all(t > 0 for t in times.values())
    assert not all(torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))  # one SGD step
    assert not {"client_model", "upload", "aggregate", "train_client"} & set(vars(method))  # the class's hooks again
    with pytest.raises(ValueError, match="no data"):  # an engine without data cannot evaluate
        engine.round(3, evaluate=True)


def test_the_paper_numbers_are_read_and_printed_in_their_own_columns(tmp_path, monkeypatch):
    paper = cost.load_paper()
    assert len(paper) == 12
    assert paper[("cnn_cifar100", 1, "generation_s")] == 0.01 and paper[("cnn_cifar100", 3, "optimization_s")] == 0.30
    assert paper[("resnet18_gn", 2, "optimization_s")] == 0.85 and paper[("resnet18_gn", 3, "generation_s")] == 0.03
    monkeypatch.setattr(cost, "available_mb", lambda: 100.0)  # too little memory: skipped, not measured
    rows = cost.run_table([tiny(model="resnet18_gn", overrides=())], 1, tmp_path, "python x", log=lambda s: None)
    assert rows[0]["status"] == "skipped" and "MB available" in rows[0]["note"]
    md = (tmp_path / "table9.md").read_text()
    assert "| optimization s/round (paper) |" in md and "| 0.03 |" in md and "GPU" in md
    assert "| update s/round (ours, wall) |" in md and "| update CPU s/round (ours) |" in md
    assert "skipped" in md and "python x" in md and "conf/paper/pa3dfl/hn_cost.csv" in md
    written = {name: (tmp_path / name).read_bytes() for name in ("table9.md", "table9.csv", "table9.json")}
    (tmp_path / "table9.md").write_text("old")
    assert cost.main(["--out", str(tmp_path), "--rerender"]) == 0  # from the JSON alone, measuring nothing
    assert {name: (tmp_path / name).read_bytes() for name in written} == written
    assert cost.main(["--out", str(tmp_path / "none"), "--rerender"]) == 2


def test_command_line_writes_table9(tmp_path):
    code = cost.main(["--models", "small_cnn", "--depths", "1", "--embed-dim", "3", "--hidden-dim", "5",
                      "--num-clients", "6", "--participation", "0.5", "--repeats", "1", "--config", *TINY,
                      "--out", str(tmp_path)])
    assert code == 0
    with open(tmp_path / "table9.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["model"], r["depth"], r["status"]) for r in rows] == [("small_cnn", "1", "measured")]
    assert float(rows[0]["generation_s"]) > 0 and float(rows[0]["update_cpu_s"]) > 0
    assert int(rows[0]["hn_params"]) == cost.hn_params_by_sizes(6, 3, 5, 1, SIZES)
    assert rows[0]["paper_generation_s"] == ""  # the paper has no small_cnn row
    data = json.loads((tmp_path / "table9.json").read_text())
    assert {"machine", "threads", "torch", "load average at start", "command"} <= set(data["header"])
    assert data["header"]["command"].startswith("python scripts/pa3dfl/hn_cost.py --models small_cnn")
    md = (tmp_path / "table9.md").read_text()
    assert "load average at start" in md and "| small_cnn ((tests only)) | (3, 5, 1) |" in md
