"""FedPer (Arivazhagan et al., 2019): the head stays local, the body is averaged (Arivazhagan et al., Sec. 3).

Body and head are trained jointly every round; only ``body.*`` entries (including BatchNorm statistics)
are averaged over the participants.
"""

from __future__ import annotations

import torch

from bench.core.engine import METHODS
from bench.core.flat import FlatModel
from methods._partial import PartialPersonalization, head_mask


@METHODS.register("fedper")
class FedPer(PartialPersonalization):
    trains_batched = True
    def personal_mask(self, model: FlatModel) -> torch.Tensor:
        return head_mask(model)
