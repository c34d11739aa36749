"""Pa3dFL (Wang et al., arXiv 2405.20589): pruning and aggregation after decomposition. Readings and their
sources: docs/methods/pa3dfl.md.

Every conv / linear layer of the body becomes a general part U = [u_1; ...; u_R1] (u_a: k^2 x R2, shared) times a
personal part V = [v_1, ..., v_{T/R1}] (v_b: R2 x S): output channel t = b R1 + a has the kernels u_a v_b (Sec. 3.1,
Eq. 4). V is stored as [T/R1, S, R2], so Prune(V, p) (Eq. 10) is the prefix slice a width-p worker holds; U is
never pruned. The server averages U uniformly (Eq. 6) and the biases / norms over their holders; a hypernetwork
generates V and the local head from client embeddings mixed by per-layer self-attention with a learnable temperature
(Eq. 9), updated by the vector-Jacobian product of the clients' changes of V (pFedHN, Eqs. 7-8). The global head keeps
its random init (Sec. 3.3). Local loss: CE(global head) + CE(local head) + lambda R_orth (App. C.3, Eq. 32). 'post'
evaluates alpha A + (1 - alpha) B, A the received model with the global head, B the client's last trained model with
its local head, alpha picked on the client's validation data (App. C.2, Alg. 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.aggregate import WeightedMean
from bench.core.capacity import WidthRule, client_capacities, shared_width_rule
from bench.core.engine import METHODS, ClientRound, Federation, Method, evaluate
from bench.core.flat import FlatModel
from common.seeding import derive_seed
from methods._decomposed import Decomposed, decompose

CHOICES = {"decoder_init": ("default", "model"), "orth_reduction": ("mean", "sum"), "width_params": ("nested", "local"),
           "fusion_space": ("dense", "factors"), "decomposition": ("pa3dfl", "flanc"),
           "personal_aggregation": ("hypernetwork", "local"), "layer_order": ("recover", "cheaper")}


@dataclass(frozen=True)
class Pa3dFLHyper:
    lam: float  # lambda of R_orth (App. C.3, Eq. 32)
    hn_lr: float  # eta of the hypernetwork update (Eq. 8)
    hn_momentum: float  # momentum of the hypernetwork's SGD (0: plain SGD; pFedHN's code: 0.9)
    embed_dim: int  # client embedding size
    hidden_dim: int  # encoder width (the attention's feature size)
    encoder_depth: int  # Linear layers of the encoder
    rank_width: float | None  # R1 = rank_width * T; None: p_min, the weakest client's width (App. A)
    rank_scale: float  # conv R2 = round(rank_scale * R1 * k^2)
    layer_order: str  # recover: W = U V, then the layer (App. A) | cheaper: that or the factored form, per input
    width_step: float | None  # client widths are multiples of this; None = p_min
    tau_init: float | None  # initial softmax temperature of every layer; None: the one that gives init_entropy
    embed_std: float  # embeddings ~ N(0, embed_std^2)
    init_entropy: float  # tau_init None: the initial attention's mean entropy, as a fraction of ln N
    decoder_init: str  # default: PyTorch's init | model: bias = the decomposed initial model, weight = 0
    hn_clip: float  # gradient-norm clip of the hypernetwork update
    orth_reduction: str  # mean | sum of the squared off-diagonal entries of u_a^T u_a
    detach_local: bool  # the local head's loss does not reach the body
    width_params: str  # biases / norm parameters: nested mean over holders | local to each client
    fusion_steps: int  # K of Alg. 1: alpha in {0, 1/K, ..., 1}
    fusion_space: str  # dense: interpolate the recovered weights W | factors: interpolate U and V themselves
    ties_to_global: bool  # equal validation accuracy: the larger alpha (else the smaller)
    decomposition: str  # pa3dfl: W = U V of Eq. 4 | flanc: FLANC's W = C B (Eq. 3), B general, C personal (Table 3)
    basis_ratio: float  # decomposition=flanc: R2 = floor(basis_ratio * T) basis filters (FLANC's 1/4)
    personal_aggregation: str  # hypernetwork (Eqs. 7-9) | local: each client keeps its own V and local head (Table 3)
    #: the run's capacity config, num_clients and data_seed (conf/method/pa3dfl.yaml interpolates them), from which
    #: extend_model, which does not see the federation, computes p_min for rank_width None
    federation: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for key, allowed in CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"method.{key}={getattr(self, key)!r} is invalid: use one of {list(allowed)}")
        rank = 1.0 if self.rank_width is None else self.rank_width
        if self.fusion_steps < 1 or self.encoder_depth < 1 or not 0 < rank <= 1:
            raise ValueError("method.fusion_steps and method.encoder_depth must be >= 1, method.rank_width in (0, 1]")
        if not 0 <= self.hn_momentum < 1:
            raise ValueError(f"method.hn_momentum={self.hn_momentum} is invalid: it must be in [0, 1)")
        if not 0 < self.init_entropy < 1:
            raise ValueError(f"method.init_entropy={self.init_entropy} is invalid: it must be in (0, 1)")
        if self.rank_width is None and not self.federation:
            raise ValueError("method.rank_width=null (p_min) needs method.federation (the run's capacity, num_clients "
                             "and data_seed, as conf/method/pa3dfl.yaml sets them)")

    def rank(self) -> float:
        """R1 / T: ``rank_width``, or p_min, the smallest client width of the federation ``federation`` describes
        (App. A: "we always fixed R1 = p_min T", p_min "depends on the lowest capacity of clients")."""
        if self.rank_width is not None:
            return self.rank_width
        assert self.federation is not None
        capacities = client_capacities(self.federation["capacity"], int(self.federation["num_clients"]),
                                       int(self.federation["data_seed"]))
        rule = shared_width_rule(self.federation["capacity"]) or WidthRule("multiple", self.width_step)
        return min(rule.widths(capacities))


class Pa3dLayer(nn.Module):
    """A ``Conv2d`` / ``Linear`` as general ``general`` [R1, k^2, R2] x personal ``personal`` [T/R1, S, R2] (Eq. 4),
    initialised from the layer's own weight: U orthogonal, V = U^T W when R2 >= R1 k^2; else U the top R2 left
    singular vectors of W arranged as (R1 k^2) x ((T/R1) S), exact when R2 reaches that matrix's rank."""

    def __init__(self, layer: nn.Conv2d | nn.Linear, rank1: int, rank2: int, order: str = "recover") -> None:
        super().__init__()
        self.order = order  # recover: W = U V, then the layer | cheaper: that or the factored form, the cheaper
        out_f, in_f = layer.weight.shape[:2]
        if isinstance(layer, nn.Conv2d) and layer.groups != 1:
            raise ValueError("a grouped convolution cannot be decomposed")
        self.kernel = tuple(layer.weight.shape[2:])
        self.conv = (dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation)
                     if isinstance(layer, nn.Conv2d) else None)
        like = dict(dtype=layer.weight.dtype, device=layer.weight.device)
        self.general = nn.Parameter(torch.empty(rank1, math.prod(self.kernel), rank2, **like))
        self.personal = nn.Parameter(torch.empty(out_f // rank1, in_f, rank2, **like))
        self.bias = layer.bias
        self.dense: torch.Tensor | None = None  # a recovered weight used instead of U V (test-time fusion)
        with torch.no_grad():
            nn.init.orthogonal_(self.general.view(-1, rank2))
            w = layer.weight.reshape(out_f // rank1, rank1, in_f, -1)  # [b, a, s, k^2], t = b R1 + a
            matrix = w.permute(1, 3, 0, 2).reshape(rank1 * w.shape[3], -1)  # [(a, k^2), (b, s)]
            # U cannot span R^{R1 k^2}: W's top singular subspace (a narrow worker's values are never used: it
            # holds fewer columns than the full model's R2 and keeps the orthogonal start)
            if rank2 < matrix.shape[0] and rank2 <= matrix.shape[1]:
                self.general.copy_(torch.linalg.svd(matrix, full_matrices=False)[0][:, :rank2].view_as(self.general))
            self.personal.copy_(torch.einsum("akr,bask->bsr", self.general, w))

    def weight(self) -> torch.Tensor:
        """W[b R1 + a, s] = reshape_{k x k}(u_a v_b[:, s]) (Eq. 4)."""
        if self.dense is not None:
            return self.dense
        w = torch.einsum("akr,bsr->bask", self.general, self.personal)
        # standard strides: torch 2.14.1's oneDNN backward of a strided 1x1 conv corrupts the heap when given the
        # einsum's (S, 1, S, S) strides (a layer with T/R1 = 1, e.g. ResNet's downsample at width 1 or p_min)
        return w.reshape(-1).view(-1, self.personal.shape[1], *self.kernel)

    def costs(self, x: torch.Tensor) -> tuple[int, int]:
        """Multiply-adds of the forward pass of ``x`` (the backward repeats the same products twice) when W is
        recovered first, T S k^2 R2 + N T S k^2 (App. A: the recovery's extra cost ratio is R2 / N, Eq. 16), and
        when factored, N_in S (T/R1) R2 + N T R2 k^2; N = the positions the layer outputs (B H W), N_in its input's."""
        blocks, inputs, rank2 = self.personal.shape
        rank1, k2 = self.general.shape[:2]
        outputs, n_in = blocks * rank1, x.numel() // inputs
        n_out = n_in if self.conv is None else x.shape[0] * math.prod(self.output_size(x.shape[2:]))
        recover = outputs * inputs * k2 * (rank2 + n_out)
        factored = n_in * inputs * blocks * rank2 + n_out * outputs * rank2 * k2
        return recover, factored

    def output_size(self, size: Sequence[int]) -> list[int]:
        """The conv's output height and width for an input of ``size``."""
        assert self.conv is not None
        stride, padding, dilation = self.conv["stride"], self.conv["padding"], self.conv["dilation"]
        if padding == "same":
            return list(size)
        padding = (0, 0) if padding == "valid" else padding
        return [(n + 2 * p - d * (k - 1) - 1) // s + 1
                for n, p, d, k, s in zip(size, padding, dilation, self.kernel, stride, strict=True)]

    def factored(self, x: torch.Tensor) -> torch.Tensor:
        """The same map without forming W: z_{b r} = sum_s V[b, s, r] x_s (a 1x1 conv to (T/R1) R2 channels), then
        output b R1 + a = sum_r u_a[:, r] * z_{b r} (a k x k conv in T/R1 groups of R2 inputs and R1 outputs)."""
        blocks, inputs, rank2 = self.personal.shape
        rank1 = self.general.shape[0]
        mix = self.personal.transpose(1, 2).reshape(blocks * rank2, inputs)  # row b R2 + r
        if self.conv is None:
            z = F.linear(x, mix).unflatten(-1, (blocks, rank2))
            out = (z @ self.general[:, 0, :].T).flatten(-2)  # [..., b, a] -> channel b R1 + a
            return out if self.bias is None else out + self.bias
        z = F.conv2d(x, mix[:, :, None, None])
        kernels = self.general.transpose(1, 2).reshape(rank1, rank2, *self.kernel).repeat(blocks, 1, 1, 1)
        return F.conv2d(z, kernels, self.bias, groups=blocks, **self.conv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense is None and self.order == "cheaper":
            recover, factored = self.costs(x)
            if factored < recover:
                return self.factored(x)
        if self.conv is None:
            return F.linear(x, self.weight(), self.bias)
        return F.conv2d(x, self.weight(), self.bias, **self.conv)

    def orthogonality(self, reduction: str) -> torch.Tensor:
        """The squared off-diagonal entries of u_a^T u_a over every a (Eq. 32), summed or averaged."""
        gram = torch.einsum("akr,akq->arq", self.general, self.general)
        off = gram - torch.diag_embed(torch.diagonal(gram, dim1=1, dim2=2))
        total = off.pow(2).sum()
        return total if reduction == "sum" else total / max(1, off[0].numel() - off.shape[1]) / off.shape[0]


class FlancLayer(Decomposed):
    """Table 3's variant "with FLANC's decomposition": W = C B (FLANC, Eq. 3 of Pa3dFL) with the basis B as the general
    part (averaged) and the coefficients C as the personal part (generated, pruned as a prefix at narrow widths)."""

    def __init__(self, layer: nn.Conv2d | nn.Linear, rank: int, group: int) -> None:
        super().__init__(layer, rank, group)
        self.dense: torch.Tensor | None = None

    def weight(self) -> torch.Tensor:
        return super().weight() if self.dense is None else self.dense

    def orthogonality(self, reduction: str) -> torch.Tensor:  # type: ignore[override]
        mean = super().orthogonality()
        return mean * self.basis.shape[0] ** 2 if reduction == "sum" else mean


def conv_rank2(out_f: int, in_f: int, k2: int, rank1: int, rank_scale: float) -> int:
    """Conv R2 = round(rank_scale R1 k^2) (Eq. 14 reconstructed), capped at (T/R1) S: W arranged as the
    (R1 k^2) x ((T/R1) S) matrix U V has rank at most min(R1 k^2, (T/R1) S), so a larger R2 adds entries and no
    expressiveness (formerly uncapped: the Ideal R1 = T made U alone T^2 k^4 per layer, Ideal ResNet-18 134 M
    parameters against 11.2 M)."""
    return max(1, min(round(rank_scale * rank1 * k2), out_f // rank1 * in_f))


#: parameter names of the general (averaged) and personal (generated) parts of both decompositions
GENERAL, PERSONAL = (".general", ".basis"), (".personal", ".coeff")


def pa3d_layers(module: nn.Module) -> list[Pa3dLayer | FlancLayer]:
    return [m for m in module.modules() if isinstance(m, Pa3dLayer | FlancLayer)]


@contextmanager
def dense_weights(module: nn.Module, weights: Sequence[torch.Tensor | None]) -> Iterator[None]:
    """Run ``module`` with the given recovered weights in place of every layer's U V (None: U V)."""
    layers = pa3d_layers(module)
    for layer, w in zip(layers, weights, strict=True):
        layer.dense = w
    try:
        yield
    finally:
        for layer in layers:
            layer.dense = None


class Pa3dModel(nn.Module):
    """The zoo's model with a decomposed body, the frozen global head ``head`` and the local head ``local``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.body, self.head, self.feature_dim = model.body, model.head, model.feature_dim
        self.local = nn.Linear(model.feature_dim, model.head.out_features)
        self.flatten_blocks: dict[str, int] = {}  # the zoo's flatten block, under the decomposed layer's V
        for name, block in getattr(model, "flatten_blocks", {}).items():
            keys = ["head.weight", "local.weight"] if name == "head.weight" else [name[:-len("weight")] + "personal"]
            self.flatten_blocks.update(dict.fromkeys(keys, block))

    def logits(self, x: torch.Tensor, detach_local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(global-head logits, local-head logits)."""
        z = self.body(x)
        return self.head(z), self.local(z.detach() if detach_local else z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.local(self.body(x))


class HyperNet(nn.Module):
    """phi: embeddings, encoder, one temperature tau_l = exp(rho_l) and one decoder per generated layer (Eq. 9)."""

    def __init__(self, num_clients: int, sizes: Sequence[int], hp: Pa3dFLHyper) -> None:
        super().__init__()
        self.embeddings = nn.Parameter(torch.randn(num_clients, hp.embed_dim) * hp.embed_std)
        layers: list[nn.Module] = [nn.Linear(hp.embed_dim, hp.hidden_dim)]
        for _ in range(hp.encoder_depth - 1):
            layers += [nn.ReLU(), nn.Linear(hp.hidden_dim, hp.hidden_dim)]
        self.encoder = nn.Sequential(*layers)
        self.log_tau = nn.Parameter(torch.zeros(len(sizes)))
        self.decoders = nn.ModuleList(nn.Sequential(nn.ReLU(), nn.Linear(hp.hidden_dim, n)) for n in sizes)
        with torch.no_grad():  # (a meta-device network only gives sizes)
            if hp.tau_init is not None or self.log_tau.is_meta:
                self.log_tau.fill_(math.log(hp.tau_init or 1.0))
            else:
                self.log_tau.fill_(self.calibrated_log_tau(hp.init_entropy))

    @torch.no_grad()
    def entropy(self, log_tau: torch.Tensor | None = None) -> torch.Tensor:
        """Per layer, the mean over clients of the entropy (nats) of the client's attention weights (Eq. 9)."""
        encoded = self.encoder(self.embeddings)
        tau = (self.log_tau if log_tau is None else log_tau).exp()
        weights = torch.softmax((encoded @ encoded.T)[None] / tau[:, None, None], 2)  # [L, N, N]
        return torch.special.entr(weights).sum(2).mean(1)

    def calibrated_log_tau(self, fraction: float) -> float:
        """log tau for which the attention's mean entropy is fraction * ln N (bisection: a smaller tau sharpens it)."""
        target, lo, hi = fraction * math.log(len(self.embeddings)), -20.0, 10.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if float(self.entropy(torch.full((1,), mid)).mean()) > target else (mid, hi)
        return (lo + hi) / 2

    def attention(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(a_i: [L, N], each row softmax(<e'_i, e'_j> / tau_l) over j; E' = Enc(E): [N, d_h])."""
        encoded = self.encoder(self.embeddings)
        scores = encoded @ encoded[cid]
        return torch.softmax(scores[None, :] / self.log_tau.exp()[:, None], dim=1), encoded

    def forward(self, cid: int) -> torch.Tensor:
        """Every generated tensor of client ``cid`` at full width, flat, in the worker's layout order."""
        weights, encoded = self.attention(cid)
        mixed = weights @ encoded
        return torch.cat([dec(m) for dec, m in zip(self.decoders, mixed, strict=True)])


@dataclass(frozen=True)
class Layout:
    """A width's worker: where its entries sit in the full vector and which are which (indices into its vector)."""

    positions: torch.Tensor
    generated: torch.Tensor  # V and the local head ...
    source: torch.Tensor  # ... and the hypernetwork output each takes (Eq. 10)
    averaged: torch.Tensor  # U (Eq. 6) and, with width_params=nested, biases and norm parameters
    rest: torch.Tensor  # biases and norm parameters
    rest_slot: torch.Tensor  # their columns in state["rest"]
    head: torch.Tensor  # the global head
    local: torch.Tensor  # the local head


@dataclass(frozen=True)
class Fusion:
    cid: int
    alpha: float
    weights: list[torch.Tensor]  # alpha W_A + (1 - alpha) W_B per decomposed layer (none: U, V interpolated)


@METHODS.register("pa3dfl")
class Pa3dFL(Method):
    Hyper = Pa3dFLHyper
    capacity_aware = True

    def __init__(self, fed: Federation, hp: Pa3dFLHyper) -> None:
        super().__init__(fed, hp)
        self.width_rule, self.widths = fed.client_widths(WidthRule("multiple", hp.width_step))
        rank = hp.rank()
        if hp.rank_width is None and rank != min(self.widths):
            raise ValueError(f"Pa3dFL: method.federation gives p_min = {rank}, this run's clients {min(self.widths)}: "
                             "it must be the run's capacity, num_clients and data_seed")
        bad = sorted({w for w in self.widths if abs(w / rank - round(w / rank)) > 1e-9})
        if bad:
            raise ValueError(f"Pa3dFL: widths {bad} are not multiples of method.rank_width={rank}: set it "
                             f"to p_min = {min(self.widths)} (Eq. 10 prunes whole blocks of R1 channels)")
        full = fed.worker
        self._gen = full.mask(lambda e: e.name.endswith(PERSONAL) or e.name.startswith("local."))
        self._general = full.mask(lambda e: e.name.endswith(GENERAL))
        self._head = full.mask(lambda e: e.name.startswith("head."))
        self._local = full.mask(lambda e: e.name.startswith("local."))
        self._rest = ~(self._gen | self._general | self._head)
        self._gen_slot, self._rest_slot = self._gen.cumsum(0) - 1, self._rest.cumsum(0) - 1  # column of each entry
        sizes: dict[str, int] = {}
        for e in full.entries:
            if bool(self._gen[e.offset]):
                owner = e.name.rpartition(".")[0]
                sizes[owner] = sizes.get(owner, 0) + e.numel
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(fed.seed, "pa3dfl"))
            net = HyperNet(fed.num_clients, list(sizes.values()), hp).to(fed.device)
        self.state["hn"] = {"net": net, "opt": torch.optim.SGD(net.parameters(), lr=hp.hn_lr,
                                                                         momentum=hp.hn_momentum)}
        self._layouts: dict[float, Layout] = {}
        self.fusion: Fusion | None = None  # set by 'post' evaluation for the client being evaluated

    @classmethod
    def extend_model(cls, model: nn.Module, hp: Any, width: float = 1.0) -> nn.Module:
        rank = hp.rank()

        def make(name: str, layer: nn.Conv2d | nn.Linear, first: bool) -> nn.Module:
            out_f, k2 = layer.weight.shape[0], math.prod(layer.weight.shape[2:])
            if hp.decomposition == "flanc":  # FLANC's R1 = rank_width S (p_min S), R2 = basis_ratio T, full model
                group = layer.weight.shape[1] if first else max(1, round(rank * layer.weight.shape[1] / width))
                return FlancLayer(layer, max(1, math.floor(hp.basis_ratio * round(out_f / width))), group)
            full_out = round(out_f / width)
            full_in = layer.weight.shape[1] if first else round(layer.weight.shape[1] / width)
            rank1 = round(rank * full_out)  # R1 of the full model, at every width
            if rank1 < 1 or out_f % rank1:
                raise ValueError(f"Pa3dFL: {name} has {out_f} outputs at width {width}, not whole blocks of "
                                 f"R1 = {rank1}: choose method.rank_width dividing every width")
            if isinstance(layer, nn.Linear):
                return Pa3dLayer(layer, rank1, rank1, hp.layer_order)
            return Pa3dLayer(layer, rank1, conv_rank2(full_out, full_in, k2, rank1, hp.rank_scale), hp.layer_order)

        decompose(model.body, make)
        return Pa3dModel(model)

    # ------------------------------------------------------------------ widths and layouts
    def client_width(self, cid: int) -> float:
        return self.widths[cid]

    def client_worker(self, cid: int, stage: str) -> FlatModel:
        return self.fed.worker_for(self.widths[cid])

    def layout(self, width: float) -> Layout:
        if width not in self._layouts:
            full = self.fed.worker
            positions = (torch.arange(full.size, device=full.vector.device) if width == 1.0
                         else self.fed.worker_for(width).positions_in(full))
            averaged = self._general | self._rest if self.hp.width_params == "nested" else self._general

            def where(mask: torch.Tensor) -> torch.Tensor:
                return mask[positions].nonzero().squeeze(1)

            generated, rest = where(self._gen), where(self._rest)
            self._layouts[width] = Layout(positions, generated, self._gen_slot[positions[generated]], where(averaged),
                                          rest, self._rest_slot[positions[rest]], where(self._head),
                                          where(self._local))
        return self._layouts[width]

    # ------------------------------------------------------------------ the round
    def setup(self, init: torch.Tensor) -> None:
        self.state["global"] = init  # U, biases, norms and the frozen global head (V's entries are never used)
        self.state["trained"] = {}  # cid -> the client's last locally trained model (B of Alg. 1)
        self.state["alpha"] = {}  # cid -> alpha of the last 'post' evaluation not yet recorded, and its round
        self.state["alpha_round"] = 0
        if self.hp.personal_aggregation == "local":  # no hypernetwork: V and the local head start from the init
            self.state["personal"] = self.fed.client_table(init[self._gen])
        if self.hp.width_params == "local":
            self.state["rest"] = self.fed.client_table(init[self._rest])
        if self.hp.decoder_init == "model":  # every client starts from the (decomposed) initial model
            with torch.no_grad():
                biases = [dec[-1].bias for dec in self.state["hn"]["net"].decoders]
                for bias, value in zip(biases, init[self._gen].split([b.numel() for b in biases]), strict=True):
                    bias.copy_(value)
                for dec in self.state["hn"]["net"].decoders:
                    dec[-1].weight.zero_()

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        self._mean = WeightedMean()
        self._scale = 1.0 / len(participants)
        self.state["hn"]["opt"].zero_grad(set_to_none=True)
        self.fusion = None

    def client_model(self, cid: int) -> torch.Tensor:
        lay = self.layout(self.widths[cid])
        vector = self.state["global"][lay.positions]
        if self.hp.width_params == "local":
            vector[lay.rest] = self.state["rest"][cid, lay.rest_slot]
        if self.hp.personal_aggregation == "local":
            vector[lay.generated] = self.state["personal"][cid, lay.source]
            return vector
        with torch.no_grad():
            vector[lay.generated] = self.state["hn"]["net"](cid)[lay.source]  # Eqs. 9-10
        return vector

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        trained = [p for name, p in model.module.named_parameters() if not name.startswith("head.")]
        return self.local_sgd(task, model, params=trained)  # the global head stays fixed

    def loss(self, task: ClientRound, model: FlatModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        global_logits, local_logits = model.module.logits(x, self.hp.detach_local)
        orth = sum((layer.orthogonality(self.hp.orth_reduction) for layer in pa3d_layers(model.module)
                    if layer.conv is not None), torch.zeros((), device=x.device))  # conv layers only (App. C.3)
        return F.cross_entropy(global_logits, y) + F.cross_entropy(local_logits, y) + self.hp.lam * orth

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        lay, vector = self.layout(self.widths[task.cid]), model.vector
        self._mean.add(vector[lay.averaged], 1.0, index=lay.positions[lay.averaged], size=self.fed.size)  # Eq. 6
        if self.hp.width_params == "local":
            self.state["rest"][task.cid, lay.rest_slot] = vector[lay.rest]
        self.state["trained"][task.cid] = model.read()
        if self.hp.personal_aggregation == "local":
            self.state["personal"][task.cid, lay.source] = vector[lay.generated]
            return
        delta = (task.start[lay.generated] - vector[lay.generated]).detach()  # theta_i - theta_i' (Eq. 8)
        generated = self.state["hn"]["net"](task.cid)[lay.source]
        (torch.dot(generated, delta) * self._scale).backward()  # accumulates the mean VJP in phi's .grad

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        self.state["global"] = self._mean.result(self.state["global"].dtype, fallback=self.state["global"])
        net, opt = self.state["hn"]["net"], self.state["hn"]["opt"]
        nn.utils.clip_grad_norm_(net.parameters(), self.hp.hn_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def metrics(self, round_: int) -> dict[str, Any]:
        """tau and the attention's mean entropy per layer (ln N = uniform) after this round's update, and the fusion
        alpha each client took at the last 'post' evaluation (the engine evaluates after this call)."""
        out: dict[str, Any] = {}
        if self.hp.personal_aggregation == "hypernetwork":
            net = self.state["hn"]["net"]
            out = {"tau": net.log_tau.detach().exp().tolist(), "attention_entropy": net.entropy().tolist()}
        if self.state["alpha"]:
            alphas = self.state["alpha"]
            out |= {"fusion_round": self.state["alpha_round"],
                    "fusion_alpha": [alphas.get(c) for c in range(self.fed.num_clients)]}
            self.state["alpha"] = {}
        return out

    # ------------------------------------------------------------------ evaluation: fusion (App. C.2)
    def eval_model(self, cid: int, stage: str, model: FlatModel, round_: int, lr: float) -> torch.Tensor:
        self.fusion = None
        if stage == "pre":
            return model.vector
        vector = self.fuse(cid, model)
        assert self.fusion is not None
        self.state["alpha"][cid], self.state["alpha_round"] = self.fusion.alpha, round_
        return vector

    @torch.no_grad()
    def fuse(self, cid: int, model: FlatModel) -> torch.Tensor:
        """Alg. 1: theta(alpha) = alpha A + (1 - alpha) B for alpha = k / K; the most accurate on validation data."""
        received, trained = self.client_model(cid), self.state["trained"].get(cid)
        steps = range(self.hp.fusion_steps, -1, -1) if self.hp.ties_to_global else range(self.hp.fusion_steps + 1)
        if trained is None:  # never trained: the received model alone (alpha = 1)
            trained, steps = received, range(self.hp.fusion_steps, self.hp.fusion_steps + 1)
        if self.fed.data is None:
            raise ValueError("Pa3dFL's fusion needs the federation's data (Federation.data) for validation")
        dense: list[list[torch.Tensor]] = []  # W_A, W_B per layer (fusion_space=factors: none, U V interpolated)
        for vector in (received, trained):
            model.load(vector)
            dense.append([layer.weight().clone() for layer in pa3d_layers(model.module)]
                         if self.hp.fusion_space == "dense" else [])
        lay = self.layout(self.widths[cid])
        data = self.fed.data.client(cid)
        best: tuple[int, torch.Tensor, Fusion] | None = None
        for k in steps:
            alpha = k / self.hp.fusion_steps
            vector = alpha * received + (1 - alpha) * trained
            vector[lay.head], vector[lay.local] = received[lay.head], trained[lay.local]  # mixed in predict
            fusion = Fusion(cid, alpha, [alpha * a + (1 - alpha) * b for a, b in zip(*dense, strict=True)])
            self.fusion = fusion
            model.load(vector)
            correct = evaluate(self, model, data, "val", max(1, data.size("val")))[0]
            if best is None or correct > best[0]:
                best = (correct, vector, fusion)
        assert best is not None
        self.fusion = best[2]
        return best[1]

    def predict(self, cid: int, model: FlatModel, x: torch.Tensor) -> torch.Tensor:
        fusion = self.fusion
        if fusion is None or fusion.cid != cid:
            return model.module(x)
        with dense_weights(model.module, fusion.weights or [None] * len(pa3d_layers(model.module))):
            global_logits, local_logits = model.module.logits(x)
        return fusion.alpha * global_logits + (1 - fusion.alpha) * local_logits
