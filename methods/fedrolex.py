"""FedRolex (Alam, Liu, Yan, Zhang, NeurIPS 2022): HeteroFL with a rolling sub-model window (Sec. 3).

In round t a client of width p keeps, in every hidden layer of C channels, the channels
{(t + j) mod C : j < ceil(pC)}: the window advances by one channel per round and wraps round, so every
channel of the global model is trained about equally often (``FlatModel.positions_in(full, roll=t)``). The
input channels and the head's classes are never pruned (the zoo never scales them; checked at setup). Every
entry is averaged over the participants holding it (n_k-weighted). No label masking by default (our reading of
the paper); ``label_mask`` is HeteroFL's masking, which the official code keeps (its models mask absent labels'
logits, its server averages each head row over the label's owners). Scaler and static BN as in the official
code, which builds on HeteroFL's (methods/_nested.py). Widths: the largest multiple of 1/16 with p^2 <= r_i
(Pa3dFL Sec. 6.1; 1/16 as in the Pa3dFL authors' FLGo FedRolex). Readings: docs/methods/heterofl.md.
"""

from __future__ import annotations

from bench.core.engine import METHODS
from methods.heterofl import HeteroFL


@METHODS.register("fedrolex")
class FedRolex(HeteroFL):
    def roll(self, round_: int) -> int:
        return round_
