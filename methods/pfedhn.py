"""pFedHN (Shamsian, Navon, Fetaya, Chechik, ICML 2021): a server hypernetwork generates every client's model
(official code AvivSham/pFedHN, FLGo's round-based version WwZzz/easyFL resources/algorithm/pfedhn.py).

Server state phi = (embeddings e_i in R^d, d = floor(1 + N / 4) unless ``embed_dim`` is set; an MLP
Linear(d, h) followed by ``hidden_layers`` x [ReLU, Linear(h, h)]; one linear head Linear(h, |theta_l|) per target
tensor l). Round t, participant i:

  theta_i = h(e_i; phi)                                   the generated tensors, written into i's model
  theta~_i = local SGD from theta_i: ``inner_steps`` batches (null: train.epochs epochs), lr ``inner_lr``,
             momentum, weight decay and gradient-norm clip as in the official trainer (5e-3, 0.9, 5e-5, 50)
  Delta_i = theta_i - theta~_i
  grad_phi = (1 / |S_t|) sum_i (d theta_i / d phi)^T Delta_i     the vector-Jacobian product, Eq. 8
  phi <- SGD(lr, momentum, weight decay) step on grad_phi clipped to norm ``outer_clip`` (official: 50)

FLGo's round-based variant (all participants of a round, gradients averaged) rather than the official one client
per step. Floating buffers (BatchNorm statistics) are not generated: each client keeps its own. With
``personal_classifier`` (pFedHN-PC) the head is not generated either: it is trained with the body and stays on the
client. 'pre' is the trained model, 'post' the generated one (with the client's own buffers and head).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bench.core.data import ClientData
from bench.core.engine import METHODS, ClientRound, Federation
from bench.core.flat import FlatModel
from common.seeding import derive_seed
from methods._partial import PartialPersonalization


@dataclass(frozen=True)
class PFedHNHyper:
    embed_dim: int | None  # d; null = floor(1 + N / 4)
    hidden_dim: int  # h
    hidden_layers: int  # ReLU + Linear(h, h) blocks after the first Linear(d, h)
    lr: float  # outer (hypernetwork) SGD
    momentum: float
    weight_decay: float
    outer_clip: float
    inner_lr: float  # local SGD
    inner_momentum: float
    inner_weight_decay: float
    inner_clip: float
    inner_steps: int | None  # local batches per round; null = train.epochs epochs
    personal_classifier: bool  # pFedHN-PC: the head stays on the client


class HyperNet(nn.Module):
    """e_i -> MLP -> one linear head per target tensor; ``forward(i)`` is the flat vector of all of them."""

    def __init__(self, num_clients: int, sizes: Sequence[int], hp: PFedHNHyper) -> None:
        super().__init__()
        dim = hp.embed_dim or int(1 + num_clients / 4)
        self.embeddings = nn.Embedding(num_clients, dim)
        layers: list[nn.Module] = [nn.Linear(dim, hp.hidden_dim)]
        for _ in range(hp.hidden_layers):
            layers += [nn.ReLU(), nn.Linear(hp.hidden_dim, hp.hidden_dim)]
        self.mlp = nn.Sequential(*layers)
        self.heads = nn.ModuleList(nn.Linear(hp.hidden_dim, n) for n in sizes)

    def forward(self, cid: int) -> torch.Tensor:
        features = self.mlp(self.embeddings.weight[cid])
        return torch.cat([head(features) for head in self.heads])


def hypergradient(net: nn.Module, cid: int, delta: torch.Tensor) -> list[torch.Tensor]:
    """grad_phi <delta, h(e_cid; phi)> = (d h / d phi)^T delta, one tensor per parameter of ``net``."""
    params = list(net.parameters())
    grads = torch.autograd.grad(net(cid), params, grad_outputs=delta.to(params[0].dtype), allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


@dataclass
class FixedSteps:
    """A client's data that yields exactly ``steps`` training batches per pass (over successive shuffles)."""

    data: ClientData
    steps: int

    def batches(self, split: str, batch_size: int, generator: Any = None, **kw: Any) -> Iterator[Any]:
        taken = 0
        while taken < self.steps:
            before = taken
            for batch in self.data.batches(split, batch_size, generator, **kw):
                yield batch
                taken += 1
                if taken == self.steps:
                    return
            if taken == before:  # no training data
                return


@METHODS.register("pfedhn")
class PFedHN(PartialPersonalization):
    Hyper = PFedHNHyper

    def __init__(self, fed: Federation, hp: PFedHNHyper) -> None:
        super().__init__(fed, hp)
        generated = fed.worker.mask(lambda e: e.kind == "param" and not (hp.personal_classifier
                                                                         and e.name.startswith("head.")))
        self._generated_mask = generated
        self.generated = fed.worker.index(generated)
        sizes = [e.numel for e in fed.worker.entries if bool(generated[e.offset])]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(fed.seed, "pfedhn"))
            net = HyperNet(fed.num_clients, sizes, hp).to(fed.device)
        opt = torch.optim.SGD(net.parameters(), lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
        self.state["hn"] = {"net": net, "opt": opt}

    def personal_mask(self, model: FlatModel) -> torch.Tensor:
        return ~self._generated_mask

    def client_model(self, cid: int) -> torch.Tensor:
        vector = super().client_model(cid)
        with torch.no_grad():
            vector[self.generated] = self.state["hn"]["net"](cid)
        return vector

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        if self.hp.inner_steps is not None:
            task = dataclasses.replace(task, data=FixedSteps(task.data, self.hp.inner_steps))
        optim = {"optimizer": "sgd", "momentum": self.hp.inner_momentum, "weight_decay": self.hp.inner_weight_decay,
                 "grad_clip": self.hp.inner_clip, "nesterov": False}
        return self.local_sgd(task, model, epochs=1 if self.hp.inner_steps else None, lr=self.hp.inner_lr,
                              optim=optim)

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        self._grads: list[torch.Tensor] | None = None

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        self.state["personal"][task.cid] = model.vector[self.state["personal_index"]]
        delta = task.start[self.generated] - model.vector[self.generated]
        grads = hypergradient(self.state["hn"]["net"], task.cid, delta)
        self._grads = grads if self._grads is None else [a + b for a, b in zip(self._grads, grads, strict=True)]

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        net, opt = self.state["hn"]["net"], self.state["hn"]["opt"]
        assert self._grads is not None
        for p, g in zip(net.parameters(), self._grads, strict=True):
            p.grad = g / len(participants)
        nn.utils.clip_grad_norm_(net.parameters(), self.hp.outer_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
