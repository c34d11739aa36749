"""Per-client tables with bounded memory: one row per client (the personal models of Local, Ditto, FedCAC, FedAMP...).

A method asks for a table with ``self.fed.client_table(row)`` and gets an ordinary ``[num_clients, D]`` tensor whose
rows all start as ``row``; it indexes, slices and assigns it like any tensor. Where it lives is the
``client_state`` config's choice, never the method's:

- ``memory_mb: null`` (default): in memory, exactly ``row.repeat(num_clients, 1)``;
- ``memory_mb: M``: tables stay in memory while all of them together take at most M MB; a table that would pass
  that is a file under ``client_state.dir`` (default ``<run_dir>/client_state``), memory-mapped (``MAP_SHARED``), so
  its rows are paged in when read and written back by the kernel. The engine calls :meth:`ClientTables.step` after
  every client it trains or evaluates and :meth:`ClientTables.release` after aggregation; before the clients used
  since the last release would pass what is left of the M MB, the mapped pages are dropped from the process
  (``MADV_DONTNEED``: the file keeps their contents). Per-client state in memory therefore stays within M MB, plus
  the kernel's fault-around (64 KB per table) and the rows one aggregation touches (the round's participants'),
  whatever the number of clients.

The numbers are the same either way (same bytes, same arithmetic; ``tests/test_client_state.py`` checks records
bit for bit). A checkpoint holds a file table as a reference to a snapshot copy of its file
(``<dir>/snapshots/<sha256>.bin``, copied by the kernel, hashed while streaming), not as tensor bytes, so
checkpointing never loads the table into memory; resuming copies the snapshot back into a fresh table file.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import shutil
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: marker key of a file table's reference inside a checkpointed state
REF_KEY = "__client_table__"
#: bytes copied per chunk when filling or restoring a table file
CHUNK = 64 << 20


@dataclass
class _FileTable:
    name: str
    path: Path
    handle: Any  # the open file
    mapping: mmap.mmap
    tensor: torch.Tensor
    row_bytes: int


class ClientTables:
    """Where the per-client tables of one run live (see the module docstring)."""

    def __init__(self, num_clients: int, memory_mb: float | None = None, directory: str | os.PathLike | None = None
                 ) -> None:
        if memory_mb is not None and not memory_mb > 0:
            raise ValueError(f"client_state.memory_mb={memory_mb!r} is invalid: give a number of MB > 0, or null to "
                             "keep every per-client table in memory")
        if memory_mb is not None and directory is None:
            raise ValueError("client_state.memory_mb is set but no directory for the table files: set "
                             "client_state.dir")
        self.num_clients = num_clients
        self.budget = None if memory_mb is None else int(memory_mb * 2**20)
        self.directory = Path(directory) if directory is not None else None
        self.in_memory = 0  # bytes of the tables kept in memory
        self.files: dict[int, _FileTable] = {}  # by the tensor's data pointer
        self.steps = 0
        self._exports: deque[set[str]] = deque(maxlen=2)  # snapshots the last two checkpoints refer to

    # ----------------------------------------------------------------- tables
    def table(self, row: torch.Tensor) -> torch.Tensor:
        """A ``[num_clients, row.numel()]`` tensor, every row a copy of ``row`` (in memory or memory-mapped)."""
        nbytes = self.num_clients * row.numel() * row.element_size()
        if self.budget is None or row.device.type != "cpu" or self.in_memory + nbytes <= self.budget:
            self.in_memory += nbytes
            return row.repeat(self.num_clients, 1)
        table = self._new_file(row.numel(), row.dtype)
        step = max(1, CHUNK // table.row_bytes)
        for start in range(0, self.num_clients, step):
            table.tensor[start:start + step] = row
            self._drop(table)
        return table.tensor

    def _new_file(self, width: int, dtype: torch.dtype) -> _FileTable:
        assert self.directory is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"table{len(self.files)}"
        path = self.directory / f"{name}.bin"
        row_bytes = width * torch.empty((), dtype=dtype).element_size()
        handle = open(path, "w+b")  # noqa: SIM115 (kept open as long as the mapping)
        handle.truncate(self.num_clients * row_bytes)
        mapping = mmap.mmap(handle.fileno(), self.num_clients * row_bytes, mmap.MAP_SHARED)
        tensor = torch.frombuffer(mapping, dtype=dtype).view(self.num_clients, width)
        table = _FileTable(name, path, handle, mapping, tensor, row_bytes)
        self.files[tensor.data_ptr()] = table
        return table

    def is_file(self, tensor: Any) -> bool:
        return torch.is_tensor(tensor) and tensor.data_ptr() in self.files

    # ----------------------------------------------------------------- memory
    def step(self) -> None:
        """One client trained or evaluated: drop the mapped pages once about the budget's worth of rows was used."""
        if not self.files:
            return
        self.steps += 1
        per_client = sum(t.row_bytes for t in self.files.values())
        if (self.steps + 1) * per_client > max((self.budget or 0) - self.in_memory, per_client):
            self.release()

    def release(self) -> None:
        """Drop every file table's pages from this process (their contents stay in the file)."""
        for table in self.files.values():
            self._drop(table)
        self.steps = 0

    @staticmethod
    def _drop(table: _FileTable) -> None:
        table.mapping.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Unmap and delete the live table files (the snapshots of the last checkpoints stay)."""
        for table in self.files.values():
            del table.tensor
            table.mapping.close()
            table.handle.close()
            table.path.unlink(missing_ok=True)
        self.files.clear()

    # ------------------------------------------------------------- checkpoint
    @contextlib.contextmanager
    def exporting(self) -> Iterator[None]:
        """Around one checkpoint's :meth:`export` calls: afterwards only the snapshots of this checkpoint and the
        one before it (``checkpoint.prev.pt``) are kept."""
        self._exports.append(set())
        yield
        keep = set().union(*self._exports)
        for path in (self.directory / "snapshots").glob("*.bin") if self.directory else ():
            if path.stem not in keep:
                path.unlink(missing_ok=True)

    def export(self, tensor: torch.Tensor) -> dict[str, Any]:
        """A file table's reference for a checkpoint: its file copied to a snapshot named by its sha256."""
        table = self.files[tensor.data_ptr()]
        table.mapping.flush()
        snapshots = self.directory / "snapshots"  # type: ignore[operator]
        snapshots.mkdir(parents=True, exist_ok=True)
        tmp = snapshots / f".{table.name}.tmp"
        shutil.copyfile(table.path, tmp)  # copy_file_range / sendfile: the kernel copies, nothing is mapped here
        with open(tmp, "rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        os.replace(tmp, snapshots / f"{digest}.bin")
        if self._exports:
            self._exports[-1].add(digest)
        return {REF_KEY: digest, "shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch.")}

    def restore(self, ref: Mapping[str, Any]) -> torch.Tensor:
        """A fresh file table holding the snapshot ``ref`` names (resuming from a checkpoint)."""
        if self.directory is None:
            raise ValueError("this checkpoint keeps a per-client table in a file: resume it with client_state.dir "
                             "and client_state.memory_mb set as when it was written")
        source = self.directory / "snapshots" / f"{ref[REF_KEY]}.bin"
        if not source.exists():
            raise FileNotFoundError(f"the checkpoint's per-client table snapshot {source} is missing: delete the run "
                                    "directory to run it again from the start")
        rows, width = ref["shape"]
        table = self._new_file(width, getattr(torch, ref["dtype"]))
        view = memoryview(table.mapping)
        with open(source, "rb") as handle:
            for start in range(0, len(view), CHUNK):
                handle.readinto(view[start:start + CHUNK])
                self._drop(table)
        view.release()
        if not self._exports:
            self._exports.append(set())
        self._exports[-1].add(str(ref[REF_KEY]))
        return table.tensor

