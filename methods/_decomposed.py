"""Layer structure shared by the capacity methods. Layers whose weight is composed from a shared basis and
coefficients (FLANC, Mei et al., NeurIPS 2022, Eq. 3; Pa3dFL, Wang et al., Sec. 3.1, Eq. 3 in its notation).

A conv weight W in R^{T x S x k x k} (a linear layer is k = 1) is built from

- a basis B in R^{R2 x R1 x k x k}: a bank of R2 filters over R1 input channels, the same shape at every width;
- coefficients C in R^{T x (G R2)}, G = ceil(S / R1): for each output channel, R2 weights per group of R1 inputs;

  W[t, g R1 + a, :, :] = sum_r C[t, g R2 + r] B[r, a, :, :]         (the input is cut into G groups of R1 channels)

which is what the authors' FLANC computes as "each group of R1 inputs convolved with the bank, then a 1x1 conv to
T outputs" (their FLGo code); we form W and run one convolution (the same function, the FLOPs are not the point here).
A narrower model (T' = pT outputs, S' = pS inputs) has the same B and C' in R^{T' x (G' R2)}; when C' is the prefix
block of C, W' is exactly the prefix slice W[:T', :S'] (:mod:`methods.flanc` with ``narrow_init: prefix``).

:func:`channel_groups` finds which dimensions of which tensors index the same channels (the outputs of a conv/linear
layer, tied across residual additions), for methods that keep arbitrary channel subsets (TailorFL).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

LAYERS = (nn.Conv2d, nn.Linear)


class Decomposed(nn.Module):
    """A ``Conv2d`` or ``Linear`` layer replaced by ``basis`` x ``coeff`` (plus the layer's own bias)."""

    def __init__(self, layer: nn.Conv2d | nn.Linear, rank: int, group: int) -> None:
        super().__init__()
        if isinstance(layer, nn.Conv2d) and layer.groups != 1:
            raise ValueError("a grouped convolution cannot be decomposed")
        out_features, self.in_features = layer.weight.shape[:2]
        kernel = tuple(layer.weight.shape[2:])
        self.conv = (dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation)
                     if isinstance(layer, nn.Conv2d) else None)
        self.basis = nn.Parameter(torch.empty(rank, group, *kernel))
        self.coeff = nn.Parameter(torch.empty(out_features, math.ceil(self.in_features / group) * rank))
        self.bias = layer.bias
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Orthonormal basis rows (the regulariser starts at 0) and coefficients that give W the variance of
        PyTorch's default init, 1 / (3 fan_in): an entry of W sums R2 terms C B with E[B^2] = 1 / (R1 k^2)."""
        rank, width = self.basis.shape[0], self.basis[0].numel()
        nn.init.orthogonal_(self.basis.view(rank, width))
        fan_in = self.in_features * math.prod(self.basis.shape[2:])
        nn.init.normal_(self.coeff, std=math.sqrt(width / (3 * rank * fan_in)))

    def weight(self) -> torch.Tensor:
        """W = reshape(C B): ``[T, S, k, k]`` for a conv, ``[T, S]`` for a linear layer."""
        rank = self.basis.shape[0]
        out = self.coeff.shape[0]
        w = self.coeff.view(out, -1, rank) @ self.basis.reshape(rank, -1)  # [T, G, R1 k k]
        return w.reshape(out, -1, *self.basis.shape[2:])[:, : self.in_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv is None:
            return F.linear(x, self.weight(), self.bias)
        return F.conv2d(x, self.weight(), self.bias, **self.conv)

    def orthogonality(self) -> torch.Tensor:
        """mean((B B^T - I)^2) over the R2 x R2 entries, rows of B = flattened basis filters: ||B B^T - I||_F^2 / R2^2
        (the authors' MSE form, so that lambda is on their scale); 0 for an orthonormal basis."""
        b = self.basis.reshape(self.basis.shape[0], -1)
        return (b @ b.T - torch.eye(b.shape[0], dtype=b.dtype, device=b.device)).pow(2).mean()


def decompose(body: nn.Module, make: Callable[[str, nn.Conv2d | nn.Linear, bool], nn.Module]) -> None:
    """Replace every ``Conv2d``/``Linear`` of ``body`` by ``make(name, layer, first)`` in place; ``first`` marks the
    first such layer in registration order (in the zoo, the one that reads the image)."""
    layers = [(n, m) for n, m in body.named_modules() if isinstance(m, LAYERS)]
    for i, (name, layer) in enumerate(layers):
        parent, _, child = name.rpartition(".")
        setattr(body.get_submodule(parent) if parent else body, child, make(name, layer, i == 0))


def decomposed_layers(module: nn.Module) -> list[Decomposed]:
    return [m for m in module.modules() if isinstance(m, Decomposed)]


def channel_groups(module: nn.Module) -> dict[tuple[str, int], int]:
    """(entry name, dim) -> channel group, for every dimension of a parameter or buffer that indexes the output
    channels of some conv/linear layer; a residual addition merges the groups of its operands."""
    parent: list[int] = []  # union-find over groups
    group: dict[torch.fx.Node, int | None] = {}  # the group of a node's channel dimension
    dims: dict[tuple[str, int], int] = {}

    def find(g: int) -> int:
        return g if parent[g] == g else find(parent[g])

    for node in torch.fx.symbolic_trace(module).graph.nodes:
        inputs = [g for a in node.all_input_nodes if (g := group.get(a)) is not None]
        out = inputs[0] if inputs else None
        for other in inputs[1:]:
            parent[find(other)] = find(out)
        if node.op == "call_module":
            layer = module.get_submodule(node.target)
            if isinstance(layer, LAYERS):
                parent.append(len(parent))
                out = parent[-1]
                if inputs:
                    dims[(f"{node.target}.weight", 1)] = inputs[0]
            named = [*layer.named_parameters(recurse=False), *layer.named_buffers(recurse=False)]
            dims.update({(f"{node.target}.{name}", 0): out for name, _ in named if out is not None})
        group[node] = out
    return {key: find(g) for key, g in dims.items()}
