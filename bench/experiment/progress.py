"""Progress bar over rounds showing the latest mean test accuracy (``quiet=true`` turns it off)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm


class ProgressBar:
    def __init__(self, rounds: int, *, disable: bool = False, desc: str = "rounds") -> None:
        self.rounds = rounds
        self.disable = disable
        self.desc = desc
        self.bar: tqdm | None = None

    def on_round(self, round_: int, records: Sequence[Mapping[str, Any]]) -> None:
        if self.disable:
            return
        if self.bar is None:
            self.bar = tqdm(total=self.rounds, initial=round_ - 1, desc=self.desc, dynamic_ncols=True)
        self.bar.update(1)
        shown = {}
        for rec in records:
            if rec["kind"] == "eval" and rec["split"] == "test":
                shown[f"acc_{rec['stage']}"] = f"{rec['mean_acc']:.2f}"
            elif rec["kind"] == "train":
                shown["loss"] = f"{rec['mean_loss']:.3f}"
        self.bar.set_postfix(shown, refresh=False)

    def on_end(self, summary: Mapping[str, Any]) -> None:
        if self.bar is not None:
            self.bar.close()
