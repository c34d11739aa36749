"""Per-client tables kept in memory-mapped files beyond ``client_state.memory_mb``: the same records bit for bit, the
same run identity, resume from a checkpoint's snapshot, and the resident memory held to the bound."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from bench.core.client_state import REF_KEY, ClientTables
from bench.experiment.compose import to_container
from bench.experiment.run import execute, run_dir_for, validate
from common.verified_io import load_verified
from tests.helpers import config

pytestmark = pytest.mark.slow  # trains federations of many clients

#: a small federation with partial participation, checkpointed every round
SMALL = ["num_clients=6", "participation=0.5", "rounds=3", "checkpoint.every_rounds=1", "eval.chance_z=null"]
#: every per-client table goes to a file (a few KB in memory at most)
ON_DISK = ["client_state.memory_mb=0.001"]


@pytest.mark.parametrize("method", ["local", "ditto", "fedcac"])
def test_file_tables_give_the_same_records_and_run_identity_and_resume_from_their_snapshot(tmp_path, method):
    memory = to_container(config(tmp_path / "memory", f"method={method}", *SMALL))
    disk = to_container(config(tmp_path / "disk", f"method={method}", *SMALL, *ON_DISK))
    assert run_dir_for(memory).name == run_dir_for(disk).name  # client_state is not part of a run's identity
    execute(memory)
    execute(disk)
    ref, run = run_dir_for(memory), run_dir_for(disk)
    assert (run / "rounds.jsonl").read_bytes() == (ref / "rounds.jsonl").read_bytes()
    state = load_verified(run / "checkpoint.pt")["method"]
    tables = [v for v in state.values() if isinstance(v, dict) and REF_KEY in v]
    assert tables, state.keys()  # the checkpoint refers to snapshots instead of holding the table
    snapshots = run / "client_state" / "snapshots"
    assert all((snapshots / f"{t[REF_KEY]}.bin").exists() for t in tables)
    assert not list((run / "client_state").glob("*.bin"))  # the live table files are gone after the run
    # killed after round 2: resume from the previous checkpoint, whose snapshot is still kept
    (run / "summary.json").unlink()
    os.replace(run / "checkpoint.prev.pt", run / "checkpoint.pt")
    execute(disk)
    assert (run / "rounds.jsonl").read_bytes() == (ref / "rounds.jsonl").read_bytes()
    assert len(list(snapshots.glob("*.bin"))) <= 2 * len(tables)  # only the last two checkpoints' snapshots


def test_resuming_a_file_table_checkpoint_in_memory_is_refused_with_the_fix(tmp_path):
    disk = to_container(config(tmp_path, "method=local", *SMALL, *ON_DISK))
    execute(disk)
    run = run_dir_for(disk)
    (run / "summary.json").unlink()
    shutil.copy(run / "checkpoint.prev.pt", run / "checkpoint.pt")
    with pytest.raises(ValueError, match="client_state.memory_mb"):
        execute(to_container(config(tmp_path, "method=local", *SMALL)))


def resident_bytes(tables: ClientTables) -> int:
    """Bytes of ``tables``' file tables' pages mapped into this process now (from ``/proc/self/smaps``)."""
    starts = set(tables.files)  # a file table's tensor starts where its mapping starts
    total, current = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):
                current = int(head.split("-")[0], 16) in starts
            elif current and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


def test_a_table_within_the_bound_stays_in_memory_and_a_larger_one_is_mapped_with_bounded_residency(tmp_path):
    row = torch.arange(256, dtype=torch.float32)  # 1 KB per client
    tables = ClientTables(4096, memory_mb=2.0, directory=tmp_path)
    small = tables.table(row[:64])  # 1 MB: fits
    assert not tables.is_file(small) and torch.equal(small, row[:64].repeat(4096, 1))
    big = tables.table(row)  # 4 MB more: beyond the bound, a file
    assert tables.is_file(big) and big.shape == (4096, 256) and torch.equal(big[4095], row)
    assert (tmp_path / "table0.bin").stat().st_size == 4096 * 1024
    peak = 0
    for cid in range(4096):  # a pass over every client, as a round's evaluation makes
        big[cid] += cid
        tables.step()
        peak = max(peak, resident_bytes(tables))
    assert 2**19 < peak <= 2**20 + 2**16  # up to what the in-memory table left of 2 MB, plus the fault-around
    tables.release()
    assert resident_bytes(tables) == 0
    assert torch.equal(big[:, 0], torch.arange(4096, dtype=torch.float32))  # the writes are in the file
    tables.close()
    assert not (tmp_path / "table0.bin").exists()


def test_a_bound_that_is_not_a_positive_number_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"client_state.memory_mb=0 is invalid"):
        validate(to_container(config(tmp_path, "client_state.memory_mb=0")))
    with pytest.raises(ValueError, match="client_state.memory_mb"):
        ClientTables(10, memory_mb=-1, directory=tmp_path)
