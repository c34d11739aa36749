"""FedC2I, "Influence-Oriented Personalized Federated Learning" (Tan, Long, Jiang, Zhang): each client weighs
the others' models by how much leaving each one out hurts it on a local batch (equation numbers are the
paper's; the readings where it is open are in docs/methods/fedc2i.md).

The model of client m is a feature extractor theta_m (the body, with its buffers) and a linear classifier
phi_m whose class-c row phi_{m,c} is the weight row plus its bias. The server only relays: it holds every
client's last upload {theta_i, phi_i} (``state["models"]`` [M, D]). Client m, round t, on one random local
batch B, with the uploads of round t-1:

  Eq. 4   theta^{-i} = 1/(M-1) sum_{j != i} theta_j              leave-one-out extractor
          l^{-i} = CE({theta^{-i}, phi_m}; B)
  Eq. 5   lambda_m^i = (l^{-i})^gamma / sum_i' (l^{-i'})^gamma    client-level influence vector
  Eq. 6   theta_bar_m = sum_i lambda_m^i theta_i
  Eq. 7   phi^{-i}_c = 1/(M-1) sum_{j != i} phi_{j,c}            leave-one-out class row
          l^{-i,-c} = CE(phi_m with row c replaced by phi^{-i}_c; features of B)
  Eq. 9   Lambda_m^{i,c} = (l^{-i,-c})^gamma / sum_i' (l^{-i',-c})^gamma   class-level matrix [M, C]
  Eq. 10  phi_bar_{m,c} = sum_i Lambda_m^{i,c} phi_{i,c}        (printed with phi_{m,c}: a typo, the weights
                                                                 sum to 1 so that would change nothing)
then local training from {theta_bar_m, phi_bar_m} and upload {theta_m, phi_m}. Eq. 5 and 9 are computed as
softmax(gamma * log l), which equals l^gamma / sum l^gamma without overflow; gamma = 0 gives uniform weights.

Table 3 ablations (``extractor`` x ``classifier``):
  FedC2I   influence x class      -lambda   influence x client (phi rows weighted by lambda_m too)
  -Lambda/l  local x class        -Lambda/g fedavg x class (theta = sum_k n_k theta_k / n, Eq. 3)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bench.core.aggregate import WeightedMean
from bench.core.engine import METHODS, ClientRound, Method
from bench.core.flat import FlatModel
from methods._partial import head_mask

CHOICES = {
    "extractor": ("influence", "local", "fedavg"),
    "classifier": ("class", "client"),
    "class_features": ("own", "aggregated"),
}


@dataclass(frozen=True)
class FedC2IHyper:
    gamma: float  # sensitivity exponent of Eq. 5 and 9 (paper: 5)
    extractor: str  # influence (Eq. 6) | local (-Lambda/l) | fedavg (-Lambda/g)
    classifier: str  # class (Eq. 10) | client (-lambda: the rows weighted by the influence vector)
    class_features: str  # features for Eq. 9 from: own (theta_m) | aggregated (theta_bar_m)
    batch_size: int | None  # influence batch B; None = train.batch_size

    def __post_init__(self) -> None:
        for key, allowed in CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"method.{key}={getattr(self, key)!r} is invalid: use one of {list(allowed)}")
        if self.gamma < 0:
            raise ValueError(f"method.gamma={self.gamma} is invalid: it must be >= 0")


def influence(losses: torch.Tensor, gamma: float) -> torch.Tensor:
    """Eq. 5 / 9: ``l^gamma / sum_i l^gamma`` over dim 0 (clients), as ``softmax(gamma log l)`` in float64.
    A zero loss is clamped to the smallest positive float, so gamma = 0 is uniform even then."""
    logs = losses.double().clamp_min(torch.finfo(torch.float64).tiny).log()
    return torch.softmax(gamma * logs, dim=0)


def leave_one_out(rows: torch.Tensor) -> torch.Tensor:
    """Eq. 4 / 7 on a stack [M, ...]: entry i is the mean of every entry but i (M >= 2), in float64."""
    rows = rows.double()
    return (rows.sum(0, keepdim=True) - rows) / (rows.shape[0] - 1)


def class_losses(features: torch.Tensor, y: torch.Tensor, own: torch.Tensor, loo: torch.Tensor) -> torch.Tensor:
    """l^{-i,-c} [M, C] (Eq. 7-9): mean CE on the batch of the classifier ``own`` [C, F'] whose row c is replaced
    by ``loo[i, c]``; ``features`` [B, F'] already carry the bias column when the rows do."""
    num_classes, batch = own.shape[0], features.shape[0]
    base = features @ own.T  # [B, C]
    swapped = torch.einsum("bf,icf->icb", features, loo.to(features.dtype))  # class-c logit under phi^{-i}_c
    classes = torch.arange(num_classes, device=features.device)
    out = []
    for rows in swapped:  # one leave-one-out client at a time: [C, B, C] logits
        logits = base.expand(num_classes, batch, num_classes).clone()
        logits[classes, :, classes] = rows
        ce = F.cross_entropy(logits.reshape(-1, num_classes), y.repeat(num_classes), reduction="none")
        out.append(ce.view(num_classes, batch).mean(1))
    return torch.stack(out)


class Classifier:
    """The class rows of the head inside a flat vector: ``rows(v)`` is [..., C, F(+1)] (weight row, bias)."""

    def __init__(self, model: FlatModel) -> None:
        names = {e.name for e in model.entries}
        self.entries = [model.entry(n) for n in ("head.weight", "head.bias") if n in names]
        self.num_classes = self.entries[0].shape[0]

    def rows(self, vectors: torch.Tensor) -> torch.Tensor:
        lead = vectors.shape[:-1]
        return torch.cat([vectors[..., e.slice].reshape(*lead, self.num_classes, -1) for e in self.entries], -1)

    def write(self, vector: torch.Tensor, rows: torch.Tensor) -> None:
        start = 0
        for e in self.entries:
            width = e.numel // self.num_classes
            vector[e.slice] = rows[:, start:start + width].reshape(-1).to(vector.dtype)
            start += width

    def features(self, model: FlatModel, x: torch.Tensor) -> torch.Tensor:
        """The body's features [B, F], with a column of ones when the rows carry a bias."""
        z = model.module.features(x)
        return torch.cat([z, torch.ones_like(z[:, :1])], 1) if len(self.entries) == 2 else z


@METHODS.register("fedc2i")
class FedC2I(Method):
    Hyper = FedC2IHyper

    def setup(self, init: torch.Tensor) -> None:
        self.state["models"] = self.fed.client_table(init)

    def client_model(self, cid: int) -> torch.Tensor:
        return self.state["models"][cid]

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        self._uploads: dict[int, torch.Tensor] = {}
        self._influence: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        """Influence-oriented aggregation on the client (Alg. 1, LocalUpdate lines 1-4), then local training."""
        batch = self.hp.batch_size or self.fed.train["batch_size"]
        x, y = next(task.data.batches("train", batch, task.generator, augment=False))
        personal, lam, lam_class = self.personalize(task.cid, model, x, y)
        self._influence[task.cid] = (lam, lam_class)
        model.load(personal)
        task.start = personal
        return self.local_sgd(task, model)

    @torch.no_grad()
    def personalize(self, cid: int, model: FlatModel, x: torch.Tensor,
                    y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """{theta_bar_m, phi_bar_m} of client ``cid`` from the uploads (Eq. 4-10), with its influence vector
        lambda_m [M] and matrix Lambda_m [M, C]. Overwrites ``model`` (its worker)."""
        models, own = self.state["models"], self.state["models"][cid]
        head, classifier = head_mask(model), Classifier(model)
        if models.shape[0] == 1:  # nobody to leave out
            return own.clone(), own.new_ones(1, dtype=torch.float64), own.new_ones(1, classifier.num_classes,
                                                                                    dtype=torch.float64)
        was_training = model.module.training
        model.module.eval()
        model.load(own)
        features = classifier.features(model, x)  # theta_m (class_features=own)
        lam = self.client_influence(model, models, own, head, x, y)
        personal = torch.where(head, own, self.extractor(models, lam, cid))
        if self.hp.class_features == "aggregated":
            model.load(personal)
            features = classifier.features(model, x)
        rows = classifier.rows(models)  # [M, C, F']
        lam_class = influence(class_losses(features, y, rows[cid], leave_one_out(rows)), self.hp.gamma)
        weights = lam_class if self.hp.classifier == "class" else lam[:, None].expand_as(lam_class)
        classifier.write(personal, torch.einsum("ic,icf->cf", weights, rows.double()))  # Eq. 10, corrected
        model.module.train(was_training)
        return personal, lam, lam_class

    def client_influence(self, model: FlatModel, models: torch.Tensor, own: torch.Tensor, head: torch.Tensor,
                         x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """lambda_m (Eq. 4-5): the loss of {theta^{-i}, phi_m} on the batch for every i, normalised."""
        count = models.shape[0]
        total = torch.zeros_like(own, dtype=torch.float64)
        for row in models:
            total += row
        losses = []
        for row in models:
            model.load(torch.where(head, own, ((total - row) / (count - 1)).to(own.dtype)))
            losses.append(F.cross_entropy(model.module(x), y))
        return influence(torch.stack(losses), self.hp.gamma)

    def extractor(self, models: torch.Tensor, lam: torch.Tensor, cid: int) -> torch.Tensor:
        """theta_bar_m (its head entries are overwritten): Eq. 6 (influence), the client's own (local) or the
        sample-weighted mean (fedavg, Eq. 3)."""
        if self.hp.extractor == "local":
            return models[cid]
        weights = lam.tolist() if self.hp.extractor == "influence" else self.fed.train_sizes.tolist()
        mean = WeightedMean()
        for row, weight in zip(models, weights, strict=True):
            mean.add(row, float(weight))
        return mean.result(models.dtype)

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        self._uploads[task.cid] = model.read()  # the others still aggregate last round's models this round

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        for cid in participants:
            self.state["models"][cid] = self._uploads[cid]

    def metrics(self, round_: int) -> dict[str, Any]:
        """Every participant's influence vector lambda_m [M] and matrix Lambda_m [M][C] (Fig. 3)."""
        clients = sorted(self._influence)
        vectors = [self._influence[c][0] for c in clients]
        return {
            "influence_clients": clients,
            "influence": [v.tolist() for v in vectors],
            "class_influence": [self._influence[c][1].tolist() for c in clients],
            "self_influence_mean": sum(float(v[c]) for c, v in zip(clients, vectors, strict=True)) / len(clients),
        }
