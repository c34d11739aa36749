"""FedBN (Li et al., 2021): normalization layers stay local, everything else is averaged (Li et al., Alg. 1).

Norm layers are found by module type (BatchNorm / GroupNorm / LayerNorm / InstanceNorm), never by name:
their affine parameters and running statistics are personal.
"""

from __future__ import annotations

import torch

from bench.core.engine import METHODS
from bench.core.flat import FlatModel
from bench.core.models import NORM_TYPES
from methods._partial import PartialPersonalization


def norm_mask(model: FlatModel) -> torch.Tensor:
    return model.mask(lambda e: issubclass(e.module_type, NORM_TYPES))


@METHODS.register("fedbn")
class FedBN(PartialPersonalization):
    trains_batched = True
    def personal_mask(self, model: FlatModel) -> torch.Tensor:
        return norm_mask(model)
