"""The zoo's max-pool: ``nn.MaxPool2d`` with faster CPU paths that compute the same numbers (:class:`MaxPool2d`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` with faster CPU paths that compute the same numbers.

    PyTorch's contiguous (NCHW) max-pool kernel on the CPU is scalar: at the small CNNs' sizes (16 channels of
    16 x 16 at batch 200) it took 60 % of an evaluation forward pass. On the CPU this layer instead

    - with autograd recording, runs PyTorch's vectorised channels-last kernel on a channels-last copy (0.37 ms
      plus 0.36 ms for the copy, against 4.2 ms for the contiguous kernel at batch 50 of 32 x 24 x 24): both
      kernels visit a window in the same order and keep the first maximum, so values, signs of zeros, NaNs and
      the positions backward routes gradients to are the same. Backward runs the contiguous kernel (as fast
      as the channels-last one) on the contiguous gradient with the indices, made contiguous, that the forward
      pass found, so the input's gradient comes back contiguous, as torch's pool gives it, without copying
      gradients between layouts (:class:`_PoolChannelsLast`);
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
        return _PoolChannelsLast.apply(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)


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


class _PoolChannelsLast(torch.autograd.Function):
    """Max-pool of a contiguous tensor by the channels-last kernel on a channels-last copy; the output is contiguous.
    Backward is the contiguous kernel's, on the contiguous gradient and the forward pass's indices (positions in
    each channel's plane, the same numbers in either layout): it writes each output's gradient to the position
    the forward pass chose, in output order per channel as the channels-last kernel does, so the input's gradient
    is the same bits, contiguous. (Copying the gradient to channels-last for that kernel and its result back cost
    0.8 of the 2.1 ms of both directions at batch 50 of 32 x 24 x 24.)"""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any,  # noqa: D102
                ceil_mode: bool) -> torch.Tensor:
        pooled, indices = torch.ops.aten.max_pool2d_with_indices(
            x.contiguous(memory_format=torch.channels_last), _pair(kernel_size), _pair(stride), _pair(padding),
            _pair(dilation), ceil_mode)
        ctx.save_for_backward(x, indices.contiguous())
        ctx.settings = (_pair(kernel_size), _pair(stride), _pair(padding), _pair(dilation), ceil_mode)
        return pooled.contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # noqa: D102
        x, indices = ctx.saved_tensors
        grad_x = torch.ops.aten.max_pool2d_with_indices_backward(grad.contiguous(), x, *ctx.settings, indices)
        return grad_x, None, None, None, None, None


def _pair(value: int | tuple[int, ...]) -> list[int]:
    return list(value) if isinstance(value, tuple | list) else [value, value]
