"""Capacity-heterogeneous methods of Pa3dFL's comparison: FLANC's basis x coefficients layers and regulariser,
pFedHN's hypergradient (against finite differences) and its outer step, pFedGate's sparsity budgets, TailorFL's
filter counts and channel groups, and every method end to end with Hetero capacities, resuming identically."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.builder import build_experiment
from bench.core.models import build_model
from bench.experiment.compose import compose_config, to_container
from bench.experiment.run import execute
from bench.experiment.spec import expand, load_spec
from methods._decomposed import Decomposed, channel_groups
from methods.pfedhn import HyperNet, PFedHNHyper, hypergradient
from methods.tailorfl import swap
from tests.helpers import central_difference, config

HETERO = ("capacity.setting=grid", "capacity.low=0.0625")  # r = 1/16, 3/8, 11/16, 1
FAST = {"flanc": (), "tailorfl": ("method.tune_every=1",), "pfedgate": (), "pfedhn": ("method.inner_steps=2",)}


def experiment(tmp_path, name: str, *overrides: str):
    exp = build_experiment(to_container(config(tmp_path, f"method={name}", *HETERO, *FAST[name], *overrides)))
    exp.method.setup(exp.fed.worker.read())
    return exp


# ------------------------------------------------------------------------------------------------ FLANC
@pytest.mark.parametrize("layer", [nn.Conv2d(6, 8, 3, padding=1), nn.Linear(5, 7)])
def test_flanc_layer_uses_exactly_basis_times_coefficients(layer):
    torch.manual_seed(0)
    rank, group = 3, 2
    dec = Decomposed(layer, rank, group)
    basis, coeff = dec.basis.detach(), dec.coeff.detach()
    want = torch.zeros_like(layer.weight)
    for t in range(want.shape[0]):
        for s in range(want.shape[1]):  # input s is channel s % R1 of group s // R1
            g, a = divmod(s, group)
            want[t, s] = sum(coeff[t, g * rank + r] * basis[r, a] for r in range(rank))
    assert coeff.shape == (want.shape[0], -(-want.shape[1] // group) * rank)
    torch.testing.assert_close(dec.weight().detach(), want, rtol=0, atol=1e-6)
    x = torch.randn(2, 6, 5, 5) if isinstance(layer, nn.Conv2d) else torch.randn(2, 5)
    functional = F.conv2d(x, want, layer.bias, padding=1) if isinstance(layer, nn.Conv2d) else F.linear(
        x, want, layer.bias)
    torch.testing.assert_close(dec(x), functional, rtol=0, atol=1e-5)
    # a narrow layer with the prefix block of the coefficients composes the prefix slice of the weight
    narrow = Decomposed(nn.Conv2d(4, 5, 3) if isinstance(layer, nn.Conv2d) else nn.Linear(4, 5), rank, group)
    with torch.no_grad():
        narrow.basis.copy_(basis)
        narrow.coeff.copy_(coeff[:5, : narrow.coeff.shape[1]])
    torch.testing.assert_close(narrow.weight(), dec.weight()[:5, :4], rtol=0, atol=0)


def test_flanc_regulariser_is_zero_for_an_orthonormal_basis_and_mse_otherwise():
    dec = Decomposed(nn.Conv2d(4, 16, 3), 4, 2)  # R2 = 4 rows of R1 k^2 = 18 entries, initialised orthonormal
    b = dec.basis.detach().reshape(4, -1)
    torch.testing.assert_close(b @ b.T, torch.eye(4), rtol=0, atol=1e-5)
    assert float(dec.orthogonality().detach()) == pytest.approx(0.0, abs=1e-10)
    with torch.no_grad():
        dec.basis.mul_(2.0)  # B B^T = 4 I: (4 - 1)^2 on the diagonal, mean over 16 entries
    assert float(dec.orthogonality().detach()) == pytest.approx(9 * 4 / 16, rel=1e-5)


def test_flanc_replaces_every_body_layer_and_shares_bases_across_widths(tmp_path):
    exp = experiment(tmp_path, "flanc")
    full = exp.fed.worker
    body = [n for n, m in full.module.body.named_modules() if isinstance(m, nn.Conv2d | nn.Linear | Decomposed)]
    assert body and all(isinstance(full.module.body.get_submodule(n), Decomposed) for n in body)
    assert isinstance(full.module.head, nn.Linear)
    bases = [(e.name, e.shape) for e in full.entries if e.name.endswith(".basis")]
    for width in sorted(set(exp.method.widths)):
        narrow = exp.fed.worker_for(width)
        assert [(e.name, e.shape) for e in narrow.entries if e.name.endswith(".basis")] == bases
    assert exp.method.widths == [0.25, 0.5, 0.75, 1.0]


def composed_weight_scale(exp, width: float) -> list[float]:
    """Per decomposed body layer of the width's model: var(W) x 3 fan_in (1 = PyTorch's default init at that
    width)."""
    worker = exp.fed.worker_for(width)
    worker.load(exp.method.client_model(exp.method.widths.index(width)))
    with torch.no_grad():
        return [float(layer.weight().var() * 3 * layer.weight()[0].numel())
                for layer in worker.module.modules() if isinstance(layer, Decomposed)]


def test_flanc_narrow_models_start_from_their_own_init_by_default_or_as_the_full_models_prefix(tmp_path):
    own, prefix = experiment(tmp_path, "flanc"), experiment(tmp_path, "flanc", "method.narrow_init=prefix")
    narrowest = min(own.method.widths)
    assert narrowest == 0.25
    full = own.fed.worker
    for width in (0.25, 0.5, 0.75):
        worker = own.fed.worker_for(width)
        keep = ~torch.isin(torch.arange(worker.size), own.method.basis_index(worker))
        start = full.read()[worker.positions_in(full)]
        torch.testing.assert_close(prefix.method.state["models"][f"{width:g}"], start, rtol=0, atol=0)
        assert not torch.equal(own.method.state["models"][f"{width:g}"][keep], start[keep])
        torch.testing.assert_close(own.method.state["models"][f"{width:g}"],
                                   own.fed.initial_model(width, "flanc"), rtol=0, atol=0)
    # every width shares the full model's basis and the full width keeps the run's initial model
    for exp in (own, prefix):
        for cid, width in enumerate(exp.method.widths):
            worker = exp.fed.worker_for(width)
            torch.testing.assert_close(exp.method.client_model(cid)[exp.method.basis_index(worker)],
                                       full.read()[exp.method.basis_index(full)], rtol=0, atol=0)
    torch.testing.assert_close(own.method.state["models"]["1"], full.read(), rtol=0, atol=0)
    torch.testing.assert_close(own.fed.initial_model(0.25, "flanc"), prefix.fed.initial_model(0.25, "flanc"))
    assert not torch.equal(own.fed.initial_model(0.25, "flanc"), own.fed.initial_model(0.25, "other"))
    # own: the composed weights have the default variance of their own width; prefix: of the full width (times p
    # in every layer whose inputs were narrowed, i.e. all but the first)
    own_scale, prefix_scale = composed_weight_scale(own, 0.25), composed_weight_scale(prefix, 0.25)
    assert all(0.5 < s < 2.0 for s in own_scale), own_scale
    assert all(0.1 < s < 0.5 for s in prefix_scale[1:]), prefix_scale


def test_flanc_refuses_an_unknown_narrow_init(tmp_path):
    with pytest.raises(ValueError, match="method.narrow_init='slice' is not one of own, prefix"):
        experiment(tmp_path, "flanc", "method.narrow_init=slice")


# ----------------------------------------------------------------------------------------------- pFedHN
def tiny_hn(clients: int = 3) -> HyperNet:
    hp = PFedHNHyper(embed_dim=None, hidden_dim=5, hidden_layers=2, lr=0.1, momentum=0.0, weight_decay=0.0,
                     outer_clip=1e9, inner_lr=0.1, inner_momentum=0.0, inner_weight_decay=0.0, inner_clip=1e9,
                     inner_steps=1, personal_classifier=False)
    torch.manual_seed(0)
    return HyperNet(clients, [4, 3], hp).double()


def test_pfedhn_hypergradient_equals_finite_differences():
    net = tiny_hn()
    assert net.embeddings.weight.shape == (3, 1)  # floor(1 + N / 4)
    delta = torch.randn(7, dtype=torch.float64)
    grads = hypergradient(net, 1, delta)
    params = list(net.parameters())

    def f() -> float:
        with torch.no_grad():
            return float(delta @ net(1))

    eps = 1e-6
    for p, g in zip(params, grads, strict=True):
        for i in range(min(p.numel(), 4)):
            difference = central_difference(f, p.data.view(-1), i, eps)
            assert g.view(-1)[i].item() == pytest.approx(difference, rel=1e-6, abs=1e-9)
    assert grads[0][[0, 2]].abs().sum() == 0  # other clients' embeddings get no gradient


def test_pfedhn_outer_step_is_sgd_on_the_mean_hypergradient(tmp_path):
    exp = experiment(tmp_path, "pfedhn", "method.momentum=0.0", "method.weight_decay=0.0", "method.outer_clip=1e9",
                     "method.lr=0.5")
    method = exp.method
    net = method.state["hn"]["net"]
    before = [p.detach().clone() for p in net.parameters()]
    deltas: dict[int, torch.Tensor] = {}

    def seen(task, worker):
        deltas[task.cid] = task.start[method.generated] - worker.vector[method.generated]

    exp.engine().round(1, on_client=seen, evaluate=False)
    assert len(deltas) == 4 and all(float(d.abs().sum()) > 0 for d in deltas.values())
    actual = [p.detach().clone() for p in net.parameters()]
    with torch.no_grad():
        for p, b in zip(net.parameters(), before, strict=True):
            p.copy_(b)
    mean = [sum(gs) / 4 for gs in zip(*(hypergradient(net, c, d) for c, d in deltas.items()), strict=True)]
    for got, b, g in zip(actual, before, mean, strict=True):  # phi <- phi - lr * mean_i (d theta_i / d phi)^T Delta_i
        torch.testing.assert_close(got, b - 0.5 * g, rtol=1e-5, atol=1e-6)


def test_pfedhn_pc_keeps_the_head_on_each_client(tmp_path):
    exp = experiment(tmp_path, "pfedhn", "method.personal_classifier=true")
    worker, method = exp.fed.worker, exp.method
    head = worker.index(worker.mask(lambda e: e.name.startswith("head.")))
    assert not torch.isin(method.generated, head).any()
    exp.engine().round(1, evaluate=False)
    heads = torch.stack([method.client_model(c)[head] for c in range(4)])
    assert not torch.equal(heads[0], heads[1])  # trained locally, not generated


@pytest.mark.parametrize("scale", ["paper", "medium", "mini"])
def test_pa3dfl_tables_run_pfedhn_as_the_authors_flgo_code(scale):
    # Formerly the row ran the official trainer's outer SGD (lr 0.01, momentum 0.9) and generated the head, and stayed
    # at chance (10.57 % mini IID). FLGo's pfedhn.py: the outer SGD with the run's lr, momentum and weight decay,
    # clip at the run's clip, the last two tensors (the head) local; clients train E epochs like every row.
    cells = [c for c in expand(load_spec("conf/paper/pa3dfl/table1.yaml"), scale, [0]) if c.row == "pFedHN"]
    assert cells
    for cell in cells:
        cfg = to_container(compose_config(list(cell.overrides)))
        hn, train = cfg["method"], cfg["train"]
        assert hn["lr"] == hn["inner_lr"] == train["lr"], cell.column
        assert hn["momentum"] == hn["inner_momentum"] == train["momentum"] == 0.0
        assert hn["weight_decay"] == hn["inner_weight_decay"] == train["weight_decay"]
        assert hn["outer_clip"] == hn["inner_clip"] == train["grad_clip"]
        assert hn["personal_classifier"] and hn["inner_steps"] is None
        assert (hn["embed_dim"], hn["hidden_dim"], hn["hidden_layers"]) == (5, 100, 2)  # Table 5's [5, 100, 2]


# --------------------------------------------------------------------------------------------- pFedGate
def test_pfedgate_masks_respect_every_clients_budget_on_every_batch(tmp_path):
    exp = experiment(tmp_path, "pfedgate")
    method, worker = exp.method, exp.fed.worker
    assert method.budgets == [0.0625, 0.375, 0.6875, 1.0]
    gated = worker.module
    sizes, linear, first = gated.sizes.double(), torch.tensor(gated.linear), torch.tensor(gated.first)
    assert int(gated.sizes.sum()) == sum(p.numel() for p in gated.net.parameters())
    for round_ in (0, 1):
        if round_:
            exp.engine().round(1, evaluate=False)  # trained gates
        for cid in range(4):
            worker.load(method.client_model(cid))
            method.serve(cid, worker)
            budget = method.budgets[cid]
            for x, _ in exp.data.client(cid).batches("train", 10, torch.Generator().manual_seed(cid)):
                weights, keep = gated.block_weights(x)
                assert keep[first].all()  # the official code keeps every tensor's first chunk outside the budget
                for group in (linear & ~first, ~linear & ~first) if budget < 1 else ():
                    room = round(float(sizes[group].sum()) * (budget - gated.min_score))  # the rest within
                    assert float(sizes[keep & group].sum()) <= room  # (s_i - g_min) of their size, greedily
                    assert float(sizes[keep & group].sum()) > room - float(sizes[group].max())
                assert torch.equal(weights != 0, keep)
                if budget == 1.0:
                    assert keep.all()
                kept = float(sizes[keep].sum() / sizes.sum())
                assert kept <= budget + 0.01 if budget >= 1 / gated.blocks_per_tensor else kept < 1.5 / 5


def test_pfedgate_keeps_every_layer_at_the_smallest_budget(tmp_path):
    # Regression: with the first chunks inside the budget, a client at s_i = 1/16 lost its FC layer altogether
    # (its first chunk alone is more than 1/16 of the Linear group), so its model's output was the head's bias.
    exp = experiment(tmp_path, "pfedgate")
    gated = exp.fed.worker.module
    gated.sparsity = exp.method.budgets[0]
    assert gated.sparsity == 0.0625
    x, _ = next(exp.data.client(0).batches("train", 10, torch.Generator().manual_seed(0)))
    _, keep = gated.block_weights(x)
    owner: list[int] = []  # the tensor of every block, in block order
    for t, p in enumerate(gated.net.parameters()):
        left = p.numel()
        while left:
            left -= int(gated.sizes[len(owner)])
            owner.append(t)
    assert {owner[b] for b in keep.nonzero().flatten().tolist()} == set(owner)


def test_pfedgate_below_one_chunk_keeps_the_heads_first_rows_only(tmp_path):
    # Below s_i = 1/blocks_per_tensor a client's model is the first chunk of every tensor whatever the gate scores
    # (the official rule), and chunks are contiguous slices of the flattened tensor: the head keeps its first rows,
    # so every other class's logit is exactly 0 (docs/methods/capacity_methods.md, pFedGate, 3. Knapsack)
    exp = experiment(tmp_path, "pfedgate")
    gated = exp.fed.worker.module.eval()
    gated.sparsity = exp.method.budgets[0]
    blocks = exp.method.hp.blocks_per_tensor
    assert gated.sparsity < 1 / blocks
    x, _ = next(exp.data.client(0).batches("train", 10, torch.Generator().manual_seed(0)))
    with torch.no_grad():
        logits = gated(x)
    classes, features = gated.net.head.weight.shape
    weight_chunk, bias_chunk = -(-classes * features // blocks), -(-classes // min(blocks, classes))
    kept = max(-(-weight_chunk // features), bias_chunk)  # the classes the first chunks reach (10 classes: 2)
    assert kept < classes
    assert torch.equal(logits[:, kept:], torch.zeros_like(logits[:, kept:]))
    assert bool(logits[:, :kept].ne(0).all())


def test_pfedgate_starts_from_about_the_shared_model(tmp_path):
    # Regression: with the gate's scores at 0.5 (the official start) every weight was halved and the norm-free CNN's
    # logits were ~16x smaller than the shared model's; it did not train. g starts at sigmoid(gate_bias) now.
    exp = experiment(tmp_path, "pfedgate")
    gated = exp.fed.worker.module.train()
    gated.sparsity = 1.0
    x, _ = next(exp.data.client(3).batches("train", 10, torch.Generator().manual_seed(0)))
    weights, _ = gated.block_weights(x)
    assert float(weights.min()) > 0.9
    with torch.no_grad():
        assert float(gated(x).norm() / gated.net(x).norm()) > 0.7


def test_pfedgate_forward_uses_the_masked_parameters(tmp_path):
    exp = experiment(tmp_path, "pfedgate")
    gated = exp.fed.worker.module.eval()
    gated.sparsity = 0.375
    x, _ = next(exp.data.client(1).batches("test", 8, shuffle=False, augment=False))
    weights, _ = gated.block_weights(x)
    per_entry = weights.repeat_interleave(gated.sizes)
    masked, offset = {}, 0
    for name, p in gated.net.named_parameters():
        masked[name] = p * per_entry[offset: offset + p.numel()].view_as(p)
        offset += p.numel()
    net = build_model("small_cnn", num_classes=4, in_channels=1, image_size=8)
    net.load_state_dict(masked)
    torch.testing.assert_close(gated(x), net.eval()(x))
    gated.relu_logits = True  # method.relu_logits: the official forward's ReLU on the output layer
    torch.testing.assert_close(gated(x), torch.relu(net.eval()(x)))
    assert bool((net(x) < 0).any())  # so the option changes something here


def test_pfedgate_relu_logits_is_off_by_default_and_set_by_the_config(tmp_path):
    assert experiment(tmp_path / "a", "pfedgate").fed.worker.module.relu_logits is False
    assert experiment(tmp_path / "b", "pfedgate", "method.relu_logits=true").fed.worker.module.relu_logits is True


def test_pfedgate_official_score_levels_and_straight_through_are_off_by_default_and_set_by_the_config(tmp_path):
    import numpy as np

    plain = experiment(tmp_path / "a", "pfedgate").fed.worker.module
    assert (plain.score_levels, plain.straight_through) == (None, False)
    gated = experiment(tmp_path / "b", "pfedgate", "method.score_levels=10", "method.straight_through=true",
                       "method.gate_bias=0.0").fed.worker.module.train()
    assert (gated.score_levels, gated.straight_through) == (10, True)
    # the knapsack's order: raw scores (ties by block) by default; the official rounded scores in numpy's argsort order
    values = [0.71, 0.68, 0.3, 0.74, 0.66, 0.12]
    blocks = [0, 1, 2, 3, 4, 5]
    assert plain.ranked(blocks, values) == [3, 0, 1, 4, 2, 5]
    levels = np.around(np.array(values) * 10).astype(int)  # 7 7 3 7 7 1: ties, in numpy's order
    assert gated.ranked(blocks, values) == [blocks[i] for i in (-levels).argsort()]
    assert sorted(gated.ranked(blocks, values)[:4]) == [0, 1, 3, 4]
    # the weights: the unclipped score g on a kept block, with gradient g' (1 + g): g' once more, scaled by g,
    # where the clip leaves g as it is
    gated.sparsity = 0.5
    x = torch.randn(8, *exp_input_shape(tmp_path))
    weights, keep = gated.block_weights(x)
    raw = torch.sigmoid(gated.gate(x)).mean(0)
    torch.testing.assert_close(weights.detach(), (raw * keep).detach())
    shift = gated.gate[-1].bias
    (st,) = torch.autograd.grad(weights.sum(), shift)
    gated.straight_through = False
    weights, keep2 = gated.block_weights(x)
    assert torch.equal(keep, keep2)
    (plain_grad,) = torch.autograd.grad(weights.sum(), shift)
    free = (keep & (raw > gated.min_score)).detach()
    torch.testing.assert_close(st[free], ((1 + raw) * plain_grad)[free])
    assert bool(free.any())


def exp_input_shape(tmp_path) -> tuple[int, ...]:
    data = experiment(tmp_path / "shape", "pfedgate").data
    x, _ = next(data.client(0).batches("train", 2, torch.Generator().manual_seed(0)))
    return tuple(x.shape[1:])


# --------------------------------------------------------------------------------------------- TailorFL
def test_tailorfl_keeps_exactly_p_times_c_filters_per_layer(tmp_path):
    exp = experiment(tmp_path, "tailorfl")
    method = exp.method
    assert method.widths == [0.25, 0.5625, 0.8125, 1.0]  # multiples of 1/16 with p^2 <= r
    assert len(method.size) == 3 and method.deep  # conv 32, conv 64, fc 128; the deeper half personalised
    engine = exp.engine()
    for round_ in (1, 2, 3):
        engine.round(round_, evaluate=False)
        assert method.state["scored"].all()
        for cid, p in enumerate(method.widths):
            for g, c in method.size.items():
                kept = int(method.state["keep"][cid, method.offset[g]: method.offset[g] + c].sum())
                assert kept == p * c == method.kept[p][g]
            positions = method.positions(cid)
            assert positions.unique().numel() == positions.numel() == exp.fed.worker_for(p).size


def test_tailorfl_channel_groups_tie_residual_additions():
    model = build_model("resnet8", num_classes=3, in_channels=3, image_size=16, norm="gn")
    dims = channel_groups(model)
    stem = dims[("body.conv1.weight", 0)]
    assert dims[("body.layer1.0.conv2.weight", 0)] == stem == dims[("body.layer1.0.bn2.weight", 0)]
    assert dims[("body.layer2.0.conv2.weight", 0)] == dims[("body.layer2.0.downsample.0.weight", 0)]
    assert dims[("body.layer2.0.conv1.weight", 1)] == stem and dims[("head.weight", 1)] == dims[
        ("body.layer3.0.conv2.weight", 0)]
    assert dims[("body.layer2.0.conv1.weight", 0)] != dims[("body.layer2.0.conv2.weight", 0)]


def test_tailorfl_swaps_towards_similar_clients_at_most_alpha_filters():
    own, target = torch.tensor([0, 1, 2, 3]), torch.tensor([2, 3, 4, 5])
    score = torch.tensor([0.9, 0.1, 0.5, 0.5, 0.0, 0.0])
    consensus = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.2, 0.7])
    assert sorted(swap(own, target, score, consensus, 1).tolist()) == [0, 2, 3, 5]  # 1 (lowest own) -> 5
    assert sorted(swap(own, target, score, consensus, 9).tolist()) == [2, 3, 4, 5]  # at most |own \ target|
    assert sorted(swap(own, target, score, consensus, 0).tolist()) == [0, 1, 2, 3]


def test_a_tailorfl_submodel_of_a_resnet_runs(tmp_path):
    exp = experiment(tmp_path, "tailorfl", "model=resnet8", "+model.options.norm=gn", "dataset.options.size=16",
                     "dataset.options.num_channels=3")
    worker = exp.fed.worker_for(exp.method.widths[0])
    worker.load(exp.method.client_model(0))
    x, _ = next(exp.data.client(0).batches("test", 4, shuffle=False, augment=False))
    assert worker.module(x).shape == (4, 4)


# ------------------------------------------------------------------------------------- end to end, resume
WIDTHS = {"flanc": [0.25, 0.5, 0.75, 1.0], "tailorfl": [0.25, 0.5625, 0.8125, 1.0], "pfedgate": [1.0] * 4,
          "pfedhn": [0.25] * 4}


@pytest.mark.parametrize("name", sorted(FAST))
def test_every_method_records_the_widths_its_clients_train(tmp_path, name):
    """(Resume to identical records: test_method_contract.)"""
    summary = execute(config(tmp_path / "short", f"method={name}", *HETERO, *FAST[name], "rounds=1"))
    assert summary["capacity"]["width"] == WIDTHS[name]


@pytest.mark.parametrize("name", ["cnn_fmnist", "resnet8"])
def test_graph_analysis_sees_the_models_max_pool_as_torchs(name):
    """TailorFL's importance hooks and channel groups come from a symbolic trace: the models' MaxPool2d (fast CPU
    paths) gives the same groups and the same importance vectors as torch's nn.MaxPool2d."""
    from bench.core.models import MaxPool2d
    from methods.tailorfl import TailorFL
    from tests.test_models import with_stock_pools

    in_channels, size = (1, 28) if name == "cnn_fmnist" else (3, 32)
    ours = build_model(name, num_classes=10, in_channels=in_channels, image_size=size)
    stock = build_model(name, num_classes=10, in_channels=in_channels, image_size=size)
    with_stock_pools(stock)
    assert any(isinstance(m, MaxPool2d) for m in ours.modules())
    assert not any(isinstance(m, MaxPool2d) for m in stock.modules())
    assert channel_groups(ours) == channel_groups(stock)
    ours, stock = TailorFL.extend_model(ours, None), TailorFL.extend_model(stock, None)
    assert [k for k, _ in ours.named_parameters()] == [k for k, _ in stock.named_parameters()]
