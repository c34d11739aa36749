"""The table's progress line: runs done / total, failures and ETA in place on a terminal; only the start and final
lines in batch mode (output not a terminal) or with --quiet."""

from __future__ import annotations

import io
import sys

from bench.experiment.cells import TableProgress, duration, run_cells
from bench.experiment.launch import Outcome, load_launcher
from bench.experiment.spec import expand, load_spec
from tests.test_table import SPEC, spec_file


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_line_is_rewritten_in_place_with_failures_and_an_eta_from_the_pace_so_far():
    clock, out = Clock(), Terminal()
    progress = TableProgress(4, stream=out, clock=clock)
    clock.now += 30
    progress(Outcome(0, True))
    clock.now += 30
    progress(Outcome(1, False, "boom"))
    assert out.getvalue().split("\r")[1:] == ["[1/4 runs] 0 failed | elapsed 30s | ETA 1m30s\x1b[K",
                                              "[2/4 runs] 1 failed | elapsed 1m00s | ETA 1m00s\x1b[K"]
    clock.now += 60
    progress(Outcome(2, True))
    progress(Outcome(3, True))
    progress.close()
    assert out.getvalue().endswith("[4/4 runs] 1 failed | elapsed 2m00s | ETA done\x1b[K\n")


def test_batch_mode_and_quiet_show_no_progress_line():
    for out, quiet in ((io.StringIO(), False), (Terminal(), True)):
        progress = TableProgress(2, stream=out, quiet=quiet)
        progress(Outcome(0, True))
        progress(Outcome(1, False))
        progress.close()
        assert out.getvalue() == ""


def test_durations_read_naturally():
    assert [duration(s) for s in (0, 42.4, 187, 3725)] == ["0s", "42s", "3m07s", "1h02m"]


def test_a_table_on_a_terminal_shows_progress_and_in_batch_mode_only_start_and_end(tmp_path, monkeypatch, capsys):
    spec = load_spec(spec_file(tmp_path, SPEC.replace("seeds: [0, 1]", "seeds: [0, 1, 2]")))
    run_cells(expand(spec, "mini", out_dir=str(tmp_path / "batch")), launcher=load_launcher("inline"), spec=spec)
    lines = capsys.readouterr().out.splitlines()  # pytest's captured stdout is not a terminal
    assert len(lines) == 2 and lines[0] == "2 cells, 0 finished, 2 to run (inline launcher)"
    assert lines[1].startswith("2 runs finished, 0 failed in ")
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    cells = expand(spec, "paper", out_dir=str(tmp_path / "tty"))
    run_cells(cells, launcher=load_launcher("inline"), spec=spec)
    shown = terminal.getvalue()
    assert "\r[1/6 runs] 0 failed | elapsed " in shown and "\r[6/6 runs] 0 failed | elapsed " in shown
    assert "ETA done\x1b[K\n6 runs finished, 0 failed in " in shown
    quiet = Terminal()
    monkeypatch.setattr(sys, "stdout", quiet)
    run_cells(expand(spec, "mini", out_dir=str(tmp_path / "quiet")), launcher=load_launcher("inline"), spec=spec,
              quiet=True)
    assert "runs]" not in quiet.getvalue() and "2 runs finished" in quiet.getvalue()
