"""Summaries of a run's evaluation records under each evaluation protocol.

A *protocol* is (stage, selection, weighting):

- stage: ``pre`` = each participant's model right after local training, before aggregation;
  ``post`` = the model each client holds after aggregation (what it would be deployed with).
- selection: ``final`` = last evaluated round; ``best`` = round with the highest mean test accuracy
  (the FedCAC protocol, an optimistic one); ``best_val`` = round with the highest mean validation
  accuracy, reporting test accuracy there (needs a validation split).
- weighting: ``unweighted`` = mean over clients; ``weighted`` = weighted by each client's test size.

Ties in a selection go to the earliest round.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

STAGES = ("pre", "post")
SELECTIONS = ("final", "best", "best_val")
WEIGHTINGS = ("unweighted", "weighted")
_KEY = {"unweighted": "mean", "weighted": "weighted"}


def eval_record(
    round_: int, stage: str, split: str, clients: Sequence[int], correct: Sequence[int],
    loss_sum: Sequence[float], n: Sequence[int],
) -> dict[str, Any]:
    """One evaluation record: per-client accuracy (percent) and loss plus their means."""
    acc = [100.0 * c / k if k else float("nan") for c, k in zip(correct, n, strict=True)]
    loss = [s / k if k else float("nan") for s, k in zip(loss_sum, n, strict=True)]
    valid = [i for i, k in enumerate(n) if k]
    total = sum(n)
    return {
        "kind": "eval",
        "round": round_,
        "stage": stage,
        "split": split,
        "clients": list(clients),
        "n": list(n),
        "acc": acc,
        "loss": loss,
        "mean_acc": sum(acc[i] for i in valid) / max(len(valid), 1),
        "mean_loss": sum(loss[i] for i in valid) / max(len(valid), 1),
        "weighted_acc": 100.0 * sum(correct) / total if total else float("nan"),
        "weighted_loss": sum(loss_sum) / total if total else float("nan"),
    }


def summarize(records: Sequence[Mapping[str, Any]], pre_is_post: bool = False) -> list[dict[str, Any]]:
    """Every applicable (stage, selection, weighting) result of a run's records. ``pre_is_post``: the method's
    trained model is the model it holds (Local), so its ``post`` results are its ``pre`` results too."""
    evals = [r for r in records if r.get("kind") == "eval"]
    if pre_is_post and not any(r["stage"] == "pre" for r in evals):
        evals += [{**r, "stage": "pre"} for r in evals if r["stage"] == "post"]
    results = []
    for stage in STAGES:
        test = {r["round"]: r for r in evals if r["stage"] == stage and r["split"] == "test"}
        val = {r["round"]: r for r in evals if r["stage"] == stage and r["split"] == "val"}
        if not test:
            continue
        rounds = sorted(test)
        for weighting in WEIGHTINGS:
            acc_key = f"{_KEY[weighting]}_acc"
            picks = {
                "final": rounds[-1],
                "best": max(rounds, key=lambda t, k=acc_key: (test[t][k], -t)),
            }
            val_rounds = [t for t in rounds if t in val]
            if val_rounds:
                picks["best_val"] = max(val_rounds, key=lambda t, k=acc_key: (val[t][k], -t))
            for selection, t in picks.items():
                results.append(
                    {
                        "stage": stage,
                        "selection": selection,
                        "weighting": weighting,
                        "round": t,
                        "acc": test[t][acc_key],
                        "loss": test[t][f"{_KEY[weighting]}_loss"],
                        "val_acc": val[t][acc_key] if t in val else None,
                    }
                )
    return results


def early_stop(records: Sequence[Mapping[str, Any]], patience: int, stage: str, weighting: str) -> dict[str, Any]:
    """Early stopping on the validation accuracy of ``stage`` (mean over clients or ``weighting``-weighted, as
    ``best_val`` selects): walking the evaluated rounds in order, the best one so far (a tie keeps the earlier, as
    ``best_val`` does) and ``stopped_round``, the first evaluated round more than ``patience`` rounds after the best
    (None: not reached). A pure function of the records, so a resumed run stops where an uninterrupted one does."""
    key = f"{_KEY[weighting]}_acc"
    val = sorted((r for r in records if r.get("kind") == "eval" and r["stage"] == stage and r["split"] == "val"),
                 key=lambda r: r["round"])
    best_round, best, stopped = None, None, None
    for r in val:
        if best is None or r[key] > best:
            best_round, best = r["round"], r[key]
        elif r["round"] - best_round > patience:
            stopped = r["round"]
            break
    return {"patience": patience, "stage": stage, "weighting": weighting, "best_round": best_round,
            "best_val_acc": best, "stopped_round": stopped}


def pick(results: Sequence[Mapping[str, Any]], stage: str, selection: str, weighting: str) -> Mapping[str, Any]:
    """The result for one protocol; a clear error if the run has no such result."""
    for r in results:
        if (r["stage"], r["selection"], r["weighting"]) == (stage, selection, weighting):
            return r
    have = sorted({(r["stage"], r["selection"], r["weighting"]) for r in results})
    raise KeyError(f"no result for protocol ({stage}, {selection}, {weighting}); this run has {have}")


def chance_verdict(record: Mapping[str, Any], test_counts: Mapping[int, Sequence[int]], weighting: str,
                   z: float) -> dict[str, Any]:
    """Whether an evaluation record is above chance: "trained" or "did not train".

    Chance is the best constant prediction: the class ``c`` maximising ``sum_k w_k n_kc / n_k`` over the record's
    clients ``k`` (``test_counts[k]``: test images per class), with ``w_k = 1/K`` for the ``unweighted`` mean of the
    clients' accuracies and ``w_k = n_k / N`` for the ``weighted`` one (then it is the pooled test set's majority class
    rate). The margin is ``z`` binomial standard errors of that constant predictor's score,
    ``sqrt(sum_k w_k^2 p_k (1 - p_k) / n_k)`` with ``p_k = n_kc / n_k``. A record whose accuracy is not above
    chance + margin did not train. Also per client (each against its own majority class rate), for tables whose
    columns are single clients (``clients``)."""
    clients = [k for k, n in zip(record["clients"], record["n"], strict=True) if n]
    counts = {k: [int(v) for v in test_counts[k]] for k in clients}
    sizes = {k: sum(counts[k]) for k in clients}
    total = sum(sizes.values())
    weights = {k: (sizes[k] / total if weighting == "weighted" else 1 / len(clients)) for k in clients}
    num_classes = len(next(iter(counts.values()))) if counts else 0

    def constant_score(c: int) -> float:
        return sum(weights[k] * counts[k][c] / sizes[k] for k in clients)

    best = max(range(num_classes), key=constant_score) if num_classes else 0
    chance = 100.0 * constant_score(best) if num_classes else float("nan")
    margin = 100.0 * z * math.sqrt(sum(weights[k] ** 2 * (p := counts[k][best] / sizes[k]) * (1 - p) / sizes[k]
                                       for k in clients))
    acc = record["weighted_acc" if weighting == "weighted" else "mean_acc"]
    per_client = {}
    for k, a in zip(record["clients"], record["acc"], strict=True):
        if k not in counts:
            continue
        p = max(counts[k]) / sizes[k]
        threshold = 100.0 * (p + z * math.sqrt(p * (1 - p) / sizes[k]))
        per_client[str(k)] = {"acc": a, "chance": 100.0 * p, "threshold": threshold,
                              "verdict": "trained" if a > threshold else "did not train"}
    return {"verdict": "trained" if acc > chance + margin else "did not train", "round": record["round"],
            "stage": record["stage"], "weighting": weighting, "acc": acc, "chance": chance,
            "threshold": chance + margin, "z": z, "clients": per_client}


def final_eval(records: Sequence[Mapping[str, Any]], stage: str, split: str = "test") -> Mapping[str, Any] | None:
    """The last evaluation record of ``stage`` and ``split`` (a method that records only ``post`` because its trained
    model is the model it holds answers ``pre`` with it); None if there is none."""
    found = {}
    for r in records:
        if r.get("kind") == "eval" and r["split"] == split:
            found.setdefault(r["stage"], {})[r["round"]] = r
    by_round = found.get(stage) or (found.get("post") if stage == "pre" else None)
    return by_round[max(by_round)] if by_round else None
