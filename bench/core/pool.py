"""The zoo's max-pool: ``nn.MaxPool2d`` with faster CPU paths that compute the same numbers (:class:`MaxPool2d`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` with faster CPU paths that compute the same numbers.

    PyTorch's contiguous (NCHW) max-pool kernel on the CPU is scalar: at the small CNNs' sizes (16 channels of
    16 x 16 at batch 200) it took 60 % of an evaluation forward pass. On the CPU this layer instead

    - with autograd recording, runs PyTorch's vectorised channels-last kernel on a channels-last copy (0.9 ms
      against 4 ms with both copies): both kernels visit a window in the same order and keep the first maximum,
      so values, signs of zeros and the positions backward routes gradients to are the same; the input's
      gradient comes back contiguous, as torch's pool gives it, so the layer before runs its backward on one
      layout (:class:`_Relayout`);
    - without autograd (evaluation), for a 2 x 2 window of stride 2, takes maxima of the window's strided views.
      The kernel keeps the first of equal values, and equal values differ in their bits only when they are zeros
      of both signs. So when the input holds no -0.0 (one integer minimum over its bits, as almost always), the
      maximum of the two rows (contiguous, so vectorised) and then of the two columns has the kernel's bits
      (0.31 ms at the size above; 0.56 ms the other way); with a -0.0 anywhere, the running ``torch.maximum`` of
      the four views in the kernel's order, which keeps the first of equal values (-0.0 before 0.0 stays -0.0).
      A NaN stays a NaN, its sign bit aside.

    Tests check both against ``nn.MaxPool2d`` bit for bit. The output is contiguous, so the next layer is
    unchanged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        pair = {name: getattr(self, name) for name in ("kernel_size", "stride", "padding", "dilation")}
        pair = {k: v if isinstance(v, tuple) else (v, v) for k, v in pair.items()}
        self.two_by_two = (pair == {"kernel_size": (2, 2), "stride": (2, 2), "padding": (0, 0), "dilation": (1, 1)}
                           and not self.ceil_mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (isinstance(x, torch.fx.Proxy) or x.device.type != "cpu" or x.dim() != 4 or self.return_indices
                or torch._C._are_functorch_transforms_active()):
            # a symbolic trace (TailorFL's graph analysis) and clients trained together (torch.func's vmap and
            # grad, bench.core.batched) see the plain max-pool
            return super().forward(x)
        if self.two_by_two and not (torch.is_grad_enabled() and x.requires_grad):
            x = x[..., : x.shape[-2] // 2 * 2, : x.shape[-1] // 2 * 2]  # floor mode: an odd last row/column drops
            if not _has_negative_zero(x):  # then equal values have equal bits: any order of maxima is the kernel's
                rows = torch.maximum(x[..., 0::2, :], x[..., 1::2, :])
                return torch.maximum(rows[..., 0::2], rows[..., 1::2]).contiguous()
            out = x[..., 0::2, 0::2]
            for view in (x[..., 0::2, 1::2], x[..., 1::2, 0::2], x[..., 1::2, 1::2]):
                out = torch.maximum(out, view)
            return out.contiguous()
        if x.is_contiguous(memory_format=torch.channels_last):
            return super().forward(x).contiguous()
        pooled = super().forward(_Relayout.apply(x, torch.channels_last, torch.contiguous_format))
        return _Relayout.apply(pooled, torch.contiguous_format, torch.channels_last)


#: each floating type's signed integer type of the same width
_SAME_WIDTH_INT = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
                   torch.bfloat16: torch.int16}


def _has_negative_zero(x: torch.Tensor) -> bool:
    """Whether ``x`` holds a -0.0 (True for other types: the caller's exact path). Read as the signed integer of
    its width, -0.0 (the sign bit alone) is that integer's minimum; a negative number or NaN has more bits set."""
    as_int = _SAME_WIDTH_INT.get(x.dtype)
    if as_int is None:
        return True
    return x.numel() > 0 and int(x.view(as_int).min()) == torch.iinfo(as_int).min


class _Relayout(torch.autograd.Function):
    """A copy of a tensor in memory layout ``to`` whose gradient goes back in layout ``back``, the layout of the
    tensor it was copied from. (``Tensor.contiguous``'s own backward passes the gradient through in the copy's
    layout: the pool's channels-last backward then got a contiguous gradient, which it copied to channels-last
    together with its saved input, and the ReLU before the pool ran its backward on a channels-last gradient and
    a contiguous output, a mixed-layout loop; together about 1 of the 2.7 ms of a training step of the small
    CNN.) A copy changes no value."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, to: torch.memory_format, back: torch.memory_format) -> torch.Tensor:  # noqa: D102
        ctx.back = back
        return x.contiguous(memory_format=to)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: D102
        return grad.contiguous(memory_format=ctx.back), None, None
