"""FedCAC, "Bold but Cautious" (Wu et al., ICCV 2023): critical parameters collaborate only with similar
clients, non-critical parameters with everyone (equation numbers are the paper's; the choices where the paper
is open or differs from its code: docs/methods/fedcac.md).

Per round t (1-based), for each client i:
  Eq. 5   s = |(theta^{t,E} - theta^{t,0}) * theta^{t,E}|              sensitivity of every parameter
  Eq. 6   M_i = 1[s >= k-th largest s], k = floor(tau n_j), per parameter tensor j (ties: a few more)
Server:
          O_ij = 1 - ||c_i - c_j||_1 / (2 ||c_i||_1)                     overlap of critical masks (code)
  Eq. 7   Thr^t = O_avg + (t / beta) (O_max - O_avg)
  Eq. 8   C_i = {j != i : O_ij >= Thr^t}                                 collaborators
  Eq. 9   w_bar = sum_i n_i w_i / sum_i n_i                              global model
  Eq. 10  u_i = mean of w_j over j in C_i + {i}                          customized model
  Eq. 11  w_i <- M_i * u_i + (1 - M_i) * w_bar                           over nn.Parameters
BatchNorm statistics stay each client's own (code); ``bn_stats=critical`` is the paper's reading.
``round1_critical=initial`` replaces u_i in round 1 by the initial model (PFLlib's FedCAC; docs/methods/fedcac.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bench.core.engine import METHODS, ClientRound, Method
from bench.core.federation import Federation
from bench.core.flat import FlatModel

CHOICES = {
    "selection": ("sensitivity", "random", "reverse"),
    "collaboration": ("time_varying", "top_k", "none"),
    "noncritical": ("all", "as_critical"),
    "overlap": ("code", "paper"),
    "bn_stats": ("local", "critical"),
    "round1_critical": ("customized", "initial"),
}


@dataclass(frozen=True)
class FedCACHyper:
    tau: float  # fraction of each parameter tensor marked critical
    beta: float  # collaboration horizon in rounds (Eq. 7)
    selection: str  # sensitivity (Eq. 5) | random | reverse (least sensitive): Fig. 3
    collaboration: str  # time_varying (Eq. 7-8) | top_k | none: Fig. 4
    top_k: int  # collaborators per client when collaboration=top_k
    noncritical: str  # all: global model (Eq. 11) | as_critical: customized model too (Table 3)
    overlap: str  # code: 1 - ||c_i - c_j|| / (2 |c_i|) | paper: ||M_i - M_j|| / (2 n)
    bn_stats: str  # local (code) | critical: taken from the customized model (paper)
    overlap_matrix_every: int  # record the overlap matrix every K rounds (0 = never)
    round1_critical: str = "customized"  # customized: u_i^1 by Eq. 10 (Alg. 1) | initial: the initial model (PFLlib)

    def __post_init__(self) -> None:
        for key, allowed in CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"method.{key}={getattr(self, key)!r} is invalid: use one of {list(allowed)}")
        if not 0.0 <= self.tau <= 1.0:
            raise ValueError(f"method.tau={self.tau} is invalid: it must be in [0, 1]")
        if self.beta <= 0:
            raise ValueError(f"method.beta={self.beta} is invalid: it must be > 0")


def kth_smallest(values: torch.Tensor, r: int) -> torch.Tensor:
    """``torch.kthvalue(values, r).values`` for a 1-D float32 tensor, the same value, ~5x faster on a dense layer's
    scores: non-negative floats (NaN aside) order as the integers of their bits, so one count of the top 16 bits
    (sign, exponent, 7 mantissa bits) finds the bin holding the r-th smallest and its rank there, and selection
    runs on that bin alone. Any other input (a negative number, -0.0 or NaN; another dtype) goes to kthvalue."""
    if values.dtype != torch.float32 or values.device.type != "cpu" or values.numel() < 1 << 12:
        return torch.kthvalue(values, r).values
    bits = values.view(torch.int32)
    low, high = torch.aminmax(bits)
    if int(low) < 0 or int(high) > 0x7F800000:  # a sign bit set, or a NaN: kthvalue's order
        return torch.kthvalue(values, r).values
    top = bits >> 16
    below = torch.bincount(top, minlength=(0x7F800000 >> 16) + 1).cumsum(0)  # entries in this bin or lower ones
    bin_ = int(torch.searchsorted(below, r))  # the first bin whose cumulative count reaches r
    rank = r - (int(below[bin_ - 1]) if bin_ else 0)
    return torch.kthvalue(values[top == bin_], rank).values


def critical_mask(score: torch.Tensor, tau: float, reverse: bool = False) -> torch.Tensor:
    """Eq. 6 on one tensor's scores: entries at or above the k-th largest (k = floor(tau n)).

    As in the official code, a threshold <= 1e-10 is replaced by the smallest score > 1e-20 (an all-zero
    tensor then becomes wholly critical). ``reverse`` marks the k least sensitive entries instead.
    """
    n = score.numel()
    k = math.floor(tau * n + 1e-9)
    if k == 0:
        return torch.zeros_like(score, dtype=torch.bool)
    # the k-th smallest / largest entry by selection, not by a partial sort (topk): the same entry, several times
    # faster for the large k of a dense layer
    if reverse:
        return score <= kth_smallest(score.reshape(-1), k)
    threshold = kth_smallest(score.reshape(-1), n - k + 1)
    if threshold <= 1e-10:
        positive = score[score > 1e-20]
        threshold = positive.min() if positive.numel() else threshold.new_zeros(())
    return score >= threshold


def overlaps(masks: torch.Tensor, definition: str = "code", chunk: int = 1 << 20,
             scratch: torch.Tensor | None = None) -> torch.Tensor:
    """O_ij for boolean masks [N, P]; exact counts, computed in column chunks to bound memory (a chunk's counts,
    at most ``chunk`` < 2^24, are exact in float32, in any order of summation). ``scratch``: a float32 buffer of at
    least [N, min(P, chunk)] that holds each chunk as 0/1 (else a new one per chunk)."""
    n = masks.shape[0]
    both = torch.zeros(n, n, dtype=torch.float64, device=masks.device)
    for start in range(0, masks.shape[1], chunk):
        part = masks[:, start:start + chunk]
        block = part.float() if scratch is None else scratch[:n, : part.shape[1]].copy_(part)
        both += (block @ block.T).double()
    size = both.diagonal().clone()  # |c_i| = c_i . c_i, the counts masks.sum(1) gives, without another pass
    distance = size[:, None] + size[None, :] - 2 * both  # ||c_i - c_j||_1
    if definition == "paper":
        return distance / (2 * masks.shape[1])
    return 1 - distance / (2 * size[:, None]).clamp_min(1)


def critical_fraction(masks: torch.Tensor) -> float:
    """The float32 mean of ``masks`` as 0/1 (``masks.float().mean()``, the same bits): its sum is an exact integer
    below 2^24, so the mean is that count over the size, rounded once to float32, without a float copy."""
    if masks.numel() >= 1 << 24:  # a count or size not exact in float32: the plain mean
        return float(masks.float().mean())
    count = torch.tensor(float(masks.count_nonzero()), dtype=torch.float32)
    return float(count / masks.numel())


def collaborators(overlap: torch.Tensor, round_: int, hp: FedCACHyper) -> tuple[list[list[int]], dict[str, Any]]:
    """C_i for every client (Eq. 7-8, or the top-k / none ablations) and the round's statistics."""
    n = overlap.shape[0]
    off = ~torch.eye(n, dtype=torch.bool, device=overlap.device)
    pairs = overlap[off]
    o_avg, o_max = (float(pairs.mean()), float(pairs.max())) if n > 1 else (0.0, 0.0)
    threshold = o_avg + (round_ / hp.beta) * (o_max - o_avg)
    groups = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        if hp.collaboration == "time_varying":
            groups.append([j for j in others if float(overlap[i, j]) >= threshold])
        elif hp.collaboration == "top_k":
            ranked = sorted(others, key=lambda j, i=i: (-float(overlap[i, j]), j))
            groups.append(sorted(ranked[: hp.top_k]))
        else:
            groups.append([])
    sizes = [len(g) for g in groups]
    stats = {"threshold": threshold, "o_avg": o_avg, "o_max": o_max, "collaborators_mean": sum(sizes) / n,
             "collaborators_min": min(sizes), "collaborators_max": max(sizes)}
    return groups, stats


@METHODS.register("fedcac")
class FedCAC(Method):
    Hyper = FedCACHyper
    trains_batched = True

    def __init__(self, fed: Federation, hp: FedCACHyper) -> None:
        super().__init__(fed, hp)
        self._buffers: dict[str, torch.Tensor] = {}  # the server step's scratch (_scratch), also after a resume

    def setup(self, init: torch.Tensor) -> None:
        self.state["models"] = self.fed.client_table(init)
        self._initial = init.clone() if self.hp.round1_critical == "initial" else None

    def client_model(self, cid: int) -> torch.Tensor:
        return self.state["models"][cid]

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        self._masks: dict[int, torch.Tensor] = {}
        self._metrics: dict[str, Any] = {}

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        trained = model.vector
        if self.hp.selection != "random":
            scores = torch.sub(trained, task.start).abs_().mul_(trained.abs())  # Eq. 5, in place
        else:
            scores = torch.rand(trained.shape, generator=task.generator, device=task.generator.device
                                ).to(trained.device)
        mask = torch.zeros(model.size, dtype=torch.bool, device=trained.device)
        for entry in model.entries:
            if entry.kind == "param":
                mask[entry.slice] = critical_mask(scores[entry.slice], self.hp.tau, self.hp.selection == "reverse")
        self._masks[task.cid] = mask
        self.state["models"][task.cid] = trained  # the client's trained model w_i^t (task.start is now stale)

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        models = self.state["models"]
        params = self.fed.worker.param_mask
        every_param = bool(params.all())  # no buffers (no BatchNorm): Eq. 11 covers the whole vector
        masks = torch.stack([self._masks[c] for c in participants])
        critical = masks if every_param else masks[:, params]
        n = len(participants)
        chunk = 1 << 20
        overlap = overlaps(critical, self.hp.overlap, chunk,
                           self._scratch("overlap", (n, min(critical.shape[1], chunk)), torch.float32, masks.device))
        groups, stats = collaborators(overlap, round_, self.hp)
        everyone = list(participants) == list(range(models.shape[0]))
        trained = models if everyone else models[participants]  # w_i^t, row r = participants[r]
        weights = self.weights(participants).double()
        wide = self._scratch("wide", trained.shape, torch.float64, models.device).copy_(trained)
        global_model = wide.mul_(weights[:, None]).sum(0).to(models.dtype)  # Eq. 9
        mixed = self._scratch("mixed", trained.shape, models.dtype, models.device)  # the new rows, written back at once
        members = self._scratch("members", trained.shape, models.dtype, models.device)  # own + collaborators' models
        for row in range(len(participants)):
            rows = [row] + groups[row]
            if round_ == 1 and self._initial is not None:  # round1_critical=initial: no Eq. 10 in round 1
                custom = self._initial.to(models.dtype)
            else:
                custom = torch.stack([trained[j] for j in rows], out=members[: len(rows)]).mean(0)  # Eq. 10
            shared = custom if self.hp.noncritical == "as_critical" else global_model
            if every_param:
                torch.where(masks[row], custom, shared, out=mixed[row])  # Eq. 11
            else:
                buffers = custom if self.hp.bn_stats == "critical" else trained[row]
                torch.where(params, torch.where(masks[row], custom, shared), buffers, out=mixed[row])
        if everyone:
            models.copy_(mixed)
        else:
            models[participants] = mixed
        stats["critical_fraction"] = critical_fraction(critical)
        every = self.hp.overlap_matrix_every
        if every and round_ % every == 0:
            stats["overlap_matrix"] = [[round(float(v), 6) for v in row] for row in overlap]
            stats["overlap_clients"] = list(participants)
        self._metrics = stats

    def metrics(self, round_: int) -> dict[str, Any]:
        return self._metrics

    def _scratch(self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A buffer of the server step kept from round to round (not state: it holds nothing between rounds). At
        20 clients of the 582k-parameter CNN each is 46-93 MB, above glibc's 32 MB limit for reusing freed memory,
        so a new one each round would be mapped and zero-filled by the kernel every time."""
        size = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.device != device or buffer.numel() < size:
            buffer = self._buffers[name] = torch.empty(size, dtype=dtype, device=device)
        return buffer[:size].view(*shape)
