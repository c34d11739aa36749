"""Verified file I/O: atomic writes that honour the umask, files behind the sha256 of their bytes, and JSON lines
that each carry the CRC-32 of the rest of the line, so that damage is detected when they are read back.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_MAGIC = b"PFLCKPT1"


def file_mode() -> int:
    """The mode a new file gets from the user's umask (0o666 & ~umask), as ``open`` would give it."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder and ``os.replace`` (umask honoured)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_verified(path: Path, obj: Any) -> None:
    """``torch.save`` behind a magic and the sha256 of the payload, so that damage is detected on load."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = buffer.getvalue()
    atomic_write_bytes(path, CHECKPOINT_MAGIC + hashlib.sha256(payload).digest() + payload)


class DamagedFile(ValueError):
    """A file whose bytes are not what was written (checksum, truncation, unreadable)."""


def load_verified(path: Path) -> Any:
    """What :func:`save_verified` wrote; ``DamagedFile`` naming the file if its bytes changed or it is cut."""
    data = path.read_bytes()
    if data.startswith(CHECKPOINT_MAGIC):
        digest, payload = data[8:40], data[40:]
        if hashlib.sha256(payload).digest() != digest:
            raise DamagedFile(f"{path} is damaged: its sha256 does not match the one written with it")
    else:
        payload = data  # written before checksums existed
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means the file is unusable
        raise DamagedFile(f"{path} cannot be read ({type(err).__name__}: {err})") from None


def encode_record(record: Mapping[str, Any]) -> str:
    """One JSON line with ``_crc``, the CRC-32 of the line without it."""
    body = json.dumps(record, sort_keys=True)
    return f'{body[:-1]}, "_crc": "{zlib.crc32(body.encode()):08x}"}}\n'


def decode_record(line: str) -> dict[str, Any]:
    """The record of one line; ``ValueError`` if it is not JSON or its ``_crc`` does not match."""
    record = json.loads(line)
    crc = record.pop("_crc", None)
    if crc is not None and f"{zlib.crc32(json.dumps(record, sort_keys=True).encode()):08x}" != crc:
        raise ValueError("checksum mismatch")
    return record


@dataclass
class RecordScan:
    """The intact records before the first damaged line, and where that line is (None: none is)."""

    records: list[dict[str, Any]]
    damaged_line: int | None = None  # 1-based
    torn_tail: bool = False  # the damaged line is the last one and lacks its newline (a kill mid-write)


def scan_records(path: Path) -> RecordScan:
    """Read a records file, stopping at the first damaged line."""
    if not path.exists():
        return RecordScan([])
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines[:-1] if text.endswith("\n") or not text else lines):
        try:
            out.append(decode_record(line))
        except ValueError:
            last = i == len(lines) - 1 and not text.endswith("\n")
            return RecordScan(out, i + 1, last)
    return RecordScan(out)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The intact records of a JSON-lines file up to its first damaged line (a torn last line is dropped)."""
    return scan_records(path).records


def json_safe(value: Any) -> Any:
    """``value`` with NaN floats as None (strict JSON)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and value != value:
        return None
    return value
