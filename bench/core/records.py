"""Run directory: resolved config, per-round records, summary, checkpoints. Every write is atomic.

Layout of a run directory::

    config.yaml         the resolved config (written first)
    rounds.jsonl        one JSON object per line (schema in docs/design.md): kind = "eval" | "train" | "method";
                        every line carries ``_crc``, the CRC-32 of the rest of the line
    checkpoint.pt       the state after the last checkpointed round, behind a sha256 of its bytes
    checkpoint.prev.pt  the checkpoint before it (a damaged newest one falls back to it)
    summary.json        written once at the end; "complete": true marks a finished run
    diverged.json       where a run stopped because its loss or model became non-finite
    timing.json         wall-clock numbers, threads and the CPU kernels used (torch version, instruction set:
                        bench.experiment.provenance.cpu_kernels); kept out of the records so that records are
                        bit-identical

A run that is killed and started again resumes from its newest intact checkpoint; its records are cut back
to that round (a torn last line is dropped). Records that a checkpoint covers but that are damaged are never
papered over: the run refuses, naming the file and the fix. Files honour the user's umask.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from common.verified_io import (
    DamagedFile,
    atomic_write_text,
    encode_record,
    load_verified,
    read_jsonl,
    save_verified,
    scan_records,
)

SCHEMA_VERSION = 1


class RecordsDamaged(RuntimeError):
    """Records that a checkpoint covers are damaged: resuming would silently leave a gap."""


class RunDir:
    """The files of one run, with resume support."""

    #: seconds to wait for a run directory's lock before reporting it as held (a dying runner releases it)
    LOCK_WAIT_SECONDS = 10.0

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.config = self.path / "config.yaml"
        self.rounds = self.path / "rounds.jsonl"
        self.checkpoint = self.path / "checkpoint.pt"
        self.previous_checkpoint = self.path / "checkpoint.prev.pt"
        self.summary = self.path / "summary.json"
        self.diverged = self.path / "diverged.json"
        self.timing = self.path / "timing.json"

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold ``.lock`` (flock) while running, so two processes never write one run directory (e.g. a table
        re-run while its Slurm jobs still run). The OS drops the lock when the holder dies; a lock still held
        after ``LOCK_WAIT_SECONDS`` belongs to a live process."""
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / ".lock", "a+") as handle:
            deadline = time.monotonic() + self.LOCK_WAIT_SECONDS
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        handle.seek(0)
                        raise RuntimeError(f"{self.path} is being run by another process "
                                           f"({handle.read().strip()}), still alive after "
                                           f"{self.LOCK_WAIT_SECONDS:.0f} s; wait for it to finish, or stop it, "
                                           "then run again") from None
                    time.sleep(0.2)
            handle.truncate(0)
            handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            handle.flush()
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def summary_state(self) -> str:
        """``complete``, ``damaged`` (a finished run whose summary or records cannot be trusted), ``diverged``,
        or ``incomplete``."""
        if self.diverged.exists():
            return "diverged"
        if not self.summary.exists():
            return "incomplete"
        try:
            complete = bool(json.loads(self.summary.read_text()).get("complete"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return "damaged"
        if not complete:
            return "incomplete"
        return "damaged" if scan_records(self.rounds).damaged_line is not None else "complete"

    def is_complete(self) -> bool:
        return self.summary_state() == "complete"

    def set_aside_damaged(self) -> Path:
        """Move a damaged finished run's records, summary and checkpoints to ``damaged-<n>/`` inside the run
        directory (kept for inspection, never deleted) so that the run starts over; returns that folder."""
        n = 1
        while (self.path / f"damaged-{n}").exists():
            n += 1
        target = self.path / f"damaged-{n}"
        target.mkdir()
        for f in (self.rounds, self.summary, self.checkpoint, self.previous_checkpoint):
            if f.exists():
                os.replace(f, target / f.name)
        return target

    def _checkpoints(self) -> Iterator[tuple[Path, dict[str, Any]]]:
        """Intact checkpoints, newest first; a damaged one is skipped with a warning naming it."""
        for path in (self.checkpoint, self.previous_checkpoint):
            if not path.exists():
                continue
            try:
                yield path, load_verified(path)
            except DamagedFile as err:
                warnings.warn(f"{err}; falling back to the previous checkpoint, or to a fresh start",
                              RuntimeWarning, stacklevel=3)

    def load_checkpoint(self, config_hash: str) -> dict[str, Any] | None:
        """The newest intact checkpoint of this config (None: start afresh); the records are cut back to its
        round. Raises ``RecordsDamaged`` if records of rounds it covers are damaged or missing."""
        path, state = next(self._checkpoints(), (None, None))
        if state is not None and state.get("config_hash") != config_hash:
            raise RuntimeError(
                f"{path} belongs to another config (hash {state.get('config_hash')}, this run "
                f"{config_hash}); delete the run directory {self.path} or choose another out_dir"
            )
        covered = int(state["round"]) if state is not None else 0
        scan = scan_records(self.rounds)
        rounds_seen = {r["round"] for r in scan.records if r.get("kind") == "train"}
        missing = sorted(set(range(1, covered + 1)) - rounds_seen)
        if missing:
            where = f"is damaged at line {scan.damaged_line}" if scan.damaged_line else "lacks them"
            raise RecordsDamaged(
                f"{self.rounds} {where}, but checkpoint {path} covers rounds 1-{covered} (records of round(s) "
                f"{missing[:5]}{'...' if len(missing) > 5 else ''} are missing): restore the file from a backup, or "
                f"delete the run directory {self.path} to run it again from the start")
        if scan.damaged_line and not scan.torn_tail:
            warnings.warn(f"{self.rounds}: line {scan.damaged_line} onwards is damaged and not covered by the "
                          f"checkpoint of round {covered}; those rounds are run again", RuntimeWarning, stacklevel=2)
        self.rewrite_records([r for r in scan.records if r["round"] <= covered])
        if state is None:
            for stale in (self.checkpoint, self.previous_checkpoint):
                stale.unlink(missing_ok=True)  # damaged beyond use: the fresh start writes new ones
        return state

    def save_checkpoint(self, round_: int, method_state: Mapping[str, Any], config_hash: str) -> None:
        """Write the state after ``round_``; the previous checkpoint is kept as ``checkpoint.prev.pt``.

        ``checkpoint.pt`` exists at every instant: the previous one is hard-linked (copied where the file system
        has no hard links) to ``checkpoint.prev.pt`` through a temp name, then the new one replaces it atomically.
        """
        if self.checkpoint.exists():
            link = self.previous_checkpoint.with_name(f".{self.previous_checkpoint.name}.tmp")
            link.unlink(missing_ok=True)
            try:
                os.link(self.checkpoint, link)
            except OSError:
                shutil.copy2(self.checkpoint, link)
            os.replace(link, self.previous_checkpoint)
        save_verified(self.checkpoint, {"round": round_, "method": dict(method_state), "config_hash": config_hash,
                                        "schema": SCHEMA_VERSION})

    def rewrite_records(self, records: Iterable[Mapping[str, Any]]) -> None:
        atomic_write_text(self.rounds, "".join(encode_record(r) for r in records))

    def append_records(self, records: Iterable[Mapping[str, Any]]) -> None:
        lines = "".join(encode_record(r) for r in records)
        if not lines:
            return
        if not self.rounds.exists():
            atomic_write_text(self.rounds, "")
        with open(self.rounds, "a") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[dict[str, Any]]:
        return read_jsonl(self.rounds)


def run_config(path: Path) -> dict[str, Any]:
    """A run's ``config.yaml`` as plain data. Read with libyaml where PyYAML has it: a table reads every run's
    config, and OmegaConf's loader takes 15 times as long."""
    text = RunDir(path).config.read_text()
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
