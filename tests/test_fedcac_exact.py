"""FedCAC's server step computes the same bits as a direct transcription of Eqs. 5-11: the k-th largest score by
selection instead of a partial sort, the customized models written into one buffer, the global model's products
in place. The references below are that transcription, one operation per equation."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from methods.fedcac import critical_fraction, critical_mask, kth_smallest, overlaps
from tests.helpers import federation, method
from tests.test_personalized_methods import cac_hp, task


def reference_mask(score: torch.Tensor, tau: float, reverse: bool = False) -> torch.Tensor:
    k = math.floor(tau * score.numel() + 1e-9)
    if k == 0:
        return torch.zeros_like(score, dtype=torch.bool)
    if reverse:
        return score <= torch.topk(score, k, largest=False).values[-1]
    threshold = torch.topk(score, k).values[-1]
    if threshold <= 1e-10:
        positive = score[score > 1e-20]
        threshold = positive.min() if positive.numel() else threshold.new_zeros(())
    return score >= threshold


@pytest.mark.parametrize("tau", [0.0, 0.1, 0.5, 0.77, 1.0])
@pytest.mark.parametrize("reverse", [False, True])
def test_critical_mask_is_the_topk_threshold(tau, reverse):
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 1000, 4099):
        dense = torch.rand(n, generator=g)
        tied = torch.randint(0, 4, (n,), generator=g).float() * 0.25  # many ties, and zeros
        tiny = torch.rand(n, generator=g) * 1e-12  # the <= 1e-10 fallback
        for score in (dense, tied, tiny, torch.zeros(n)):
            assert torch.equal(critical_mask(score, tau, reverse), reference_mask(score, tau, reverse))


def test_kth_smallest_is_kthvalue_bit_for_bit():
    """The counted selection against torch.kthvalue on the scores FedCAC sees (products of absolute values) and on
    what it must hand back to kthvalue: ties, zeros, subnormals, infinities, NaN, negatives, -0.0."""
    g = torch.Generator().manual_seed(0)
    n = 20_000
    dense = (torch.randn(n, generator=g) * torch.randn(n, generator=g)).abs()
    cases = {
        "scores": dense,
        "ties": torch.randint(0, 5, (n,), generator=g).float() * 0.25,
        "one value": torch.full((n,), 3.0),
        "zeros": torch.zeros(n),
        "subnormal": torch.rand(n, generator=g) * 1e-40,
        "inf": torch.where(torch.rand(n, generator=g) < 0.3, torch.tensor(float("inf")), dense),
        "nan": torch.where(torch.rand(n, generator=g) < 0.1, torch.tensor(float("nan")), dense),
        "negative": torch.randn(n, generator=g),
        "negative zero": torch.where(dense < 0.5, torch.tensor(-0.0), dense),
        "small": dense[:100],
        "float64": dense.double(),
    }
    for name, values in cases.items():
        for r in (1, 2, values.numel() // 3, values.numel() // 2 + 1, values.numel() - 1, values.numel()):
            got, want = kth_smallest(values, r), torch.kthvalue(values, r).values
            assert got.dtype == want.dtype and (torch.equal(got, want) or (got.isnan() and want.isnan())), (name, r)
            assert got.view(-1).view(torch.uint8).tolist() == want.view(-1).view(torch.uint8).tolist(), (name, r)


def reference_overlaps(masks: torch.Tensor, definition: str) -> torch.Tensor:
    """O_ij from the masks' sizes and pairwise intersections, counted directly."""
    size = masks.sum(1).double()
    both = (masks[:, None, :] & masks[None, :, :]).sum(2).double()
    distance = size[:, None] + size[None, :] - 2 * both
    if definition == "paper":
        return distance / (2 * masks.shape[1])
    return 1 - distance / (2 * size[:, None]).clamp_min(1)


@pytest.mark.parametrize("definition", ["code", "paper"])
def test_overlaps_equal_direct_counts_bit_for_bit(definition):
    g = torch.Generator().manual_seed(0)
    for n, p, density in ((1, 5, 0.5), (4, 1000, 0.3), (6, 4099, 0.9), (5, 300, 0.0)):
        masks = torch.rand(n, p, generator=g) < density  # the last: all-empty masks
        masks[-1] = True  # and a full one
        for chunk in (7, 1 << 20):
            assert torch.equal(overlaps(masks, definition, chunk=chunk), reference_overlaps(masks, definition))


def test_critical_fraction_is_the_float32_mean_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    for n, p in ((1, 1), (3, 7), (20, 4099), (20, 582_026), (7, 100_003)):
        for density in (0.0, 0.013, 0.5, 0.77, 1.0):
            masks = torch.rand(n, p, generator=g) < density
            assert critical_fraction(masks) == float(masks.float().mean())


def reference_aggregate(m, trained: dict[int, torch.Tensor], participants: list[int], round_: int) -> torch.Tensor:
    """The server step of one round as the equations read: returns every client's new model."""
    hp, fed = m.hp, m.fed
    models = m.state["models"].clone()
    for cid in participants:
        models[cid] = trained[cid]
    params = fed.worker.param_mask
    masks = torch.stack([m._masks[c] for c in participants])
    from methods.fedcac import collaborators

    groups, _ = collaborators(overlaps(masks[:, params], hp.overlap), round_, hp)
    weights = m.weights(participants).double()
    global_model = (weights[:, None] * models[participants].double()).sum(0).to(models.dtype)
    mixed = []
    for row, cid in enumerate(participants):
        custom = models[[cid] + [participants[j] for j in groups[row]]].mean(0)
        shared = custom if hp.noncritical == "as_critical" else global_model
        new = torch.where(masks[row], custom, shared)
        mixed.append(torch.where(params, new, custom if hp.bn_stats == "critical" else models[cid]))
    models[participants] = torch.stack(mixed)
    return models


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Linear(5, 3))


def plain_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


@pytest.mark.parametrize("build", [bn_model, plain_model])
@pytest.mark.parametrize("options", [{}, {"noncritical": "as_critical", "bn_stats": "critical"},
                                     {"collaboration": "top_k", "top_k": 2}, {"selection": "reverse"},
                                     {"overlap": "paper"}])
@pytest.mark.parametrize("participants", [[0, 1, 2, 3, 4, 5], [1, 3, 4]])
def test_aggregate_equals_the_equations_bit_for_bit(build, options, participants):
    fed = federation(build(), 6, sizes=[1.0, 2.0, 3.0, 1.0, 5.0, 2.0])
    m = method("fedcac", fed, **vars(cac_hp(beta=3, **options)))
    g = torch.Generator().manual_seed(1)
    m.state["models"] += torch.randn(m.state["models"].shape, generator=g)  # clients hold different models
    assert_rounds_follow_the_equations(m, g, [participants] * 3)


def test_aggregate_with_changing_participants_equals_the_equations():
    """The server step's buffers, kept from round to round, serve rounds of any number of participants."""
    fed = federation(plain_model(), 6, sizes=[1.0, 2.0, 3.0, 1.0, 5.0, 2.0])
    m = method("fedcac", fed, **vars(cac_hp(beta=4)))
    assert_rounds_follow_the_equations(m, torch.Generator().manual_seed(2),
                                       [[1, 3, 4], [0, 1, 2, 3, 4, 5], [2, 5], [0, 1, 2, 3, 4, 5]])


def assert_rounds_follow_the_equations(m, g: torch.Generator, rounds: list[list[int]]) -> None:
    """Rounds 1, 2, ... with the given participants, each client's training a random step: after every server step
    the models are the reference transcription's, bit for bit."""
    for round_, participants in enumerate(rounds, start=1):
        m.begin_round(round_, participants)
        trained = {}
        for cid in participants:
            start = m.client_model(cid).clone()
            trained[cid] = start + 0.1 * torch.randn(start.shape, generator=g)
            m.fed.worker.load(trained[cid])
            m.upload(task(cid, start, round_), m.fed.worker)
        expected = reference_aggregate(m, trained, participants, round_)
        m.aggregate(round_, participants)
        assert torch.equal(m.state["models"], expected)


def test_a_method_resumed_from_its_checkpoint_aggregates_as_the_one_saved():
    """Engine.run restores a method with ``load_state_dict`` alone (no ``setup``): its server step must work and
    give the bits of the method that was saved."""
    fed = federation(plain_model(), 4, sizes=[1.0, 2.0, 3.0, 1.0])
    saved = method("fedcac", fed, **vars(cac_hp(beta=4)))
    g = torch.Generator().manual_seed(3)
    participants = [0, 1, 2, 3]

    def one_round(m, round_: int, moves: dict[int, torch.Tensor]) -> torch.Tensor:
        m.begin_round(round_, participants)
        for cid in participants:
            start = m.client_model(cid).clone()
            fed.worker.load(start + moves[cid])
            m.upload(task(cid, start, round_), fed.worker)
        m.aggregate(round_, participants)
        return m.state["models"].clone()

    size = saved.client_model(0).numel()
    one_round(saved, 1, {c: 0.1 * torch.randn(size, generator=g) for c in participants})
    checkpoint = io.BytesIO()
    torch.save(saved.state_dict(), checkpoint)  # as a checkpoint holds it: nothing shared with ``saved``
    resumed = type(saved)(fed, saved.hp)
    resumed.load_state_dict(torch.load(io.BytesIO(checkpoint.getvalue()), weights_only=False))
    moves = {c: 0.1 * torch.randn(size, generator=g) for c in participants}
    assert torch.equal(one_round(resumed, 2, moves), one_round(saved, 2, moves))
