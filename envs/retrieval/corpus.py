"""``JsonlCorpus``: a JSONL corpus read lazily, one row at a time, by byte offset.

wiki-18's 21M passages would not fit in memory as Python objects: only a memory-mapped
table of each row's byte span is kept (built once by a newline scan, cached as
``<corpus>.offsets.npy``, else under ``envs.paths.cache_dir("retrieval")``, rebuilt when
the corpus's size or mtime changes), and row ``n`` is read with one ``pread``. Rows are
numbered in file order, blank lines skipped: the order of a prebuilt faiss index over the
file. Nothing is parsed up front. docs/retrieval_scale.md has the measurements.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from envs.paths import atomic_write
from envs.paths import cache_dir as default_cache_dir
from envs.retrieval.passage import Passage

_SCAN_BYTES = 1 << 24  # 16 MiB per read while scanning for newlines
_SHORT_LINE = 16  # no JSON row is this short; such lines are checked for being blank
OFFSETS_SUFFIX = ".offsets.npy"


class JsonlCorpus(Sequence[Passage]):
    """The rows of an uncompressed ``.jsonl`` corpus, read on demand; ``cache_dir``: where the
    offset table goes when the corpus's folder is not writable.

    ``corpus[n]`` is the Passage of row ``n`` (negative ``n`` counts from the end, a slice
    gives a list); ``corpus.row(n)`` the row as stored. Thread-safe (``os.pread``).
    """

    def __init__(self, path: str | os.PathLike, cache_dir: str | os.PathLike | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"corpus file not found: {str(self.path)!r}")
        if self.path.suffix == ".gz":
            raise ValueError(f"{self.path}: a lazily read corpus must be uncompressed JSONL "
                             f"(gunzip -k {self.path.name})")
        st = self.path.stat()
        self.size, self.mtime_ns = st.st_size, st.st_mtime_ns
        self.offsets_path, self._spans = _load_or_build_offsets(self.path, st, cache_dir)
        self._fd: int | None = None

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)

    def __len__(self) -> int:
        return len(self._spans)

    @overload
    def __getitem__(self, n: int) -> Passage: ...

    @overload
    def __getitem__(self, n: slice) -> list[Passage]: ...

    def __getitem__(self, n):
        if isinstance(n, slice):
            return [self[i] for i in range(*n.indices(len(self)))]
        row = self.row(n)
        try:
            return Passage.from_row(row)
        except ValueError as e:
            raise ValueError(f"{self.where(n)}: malformed corpus row: {e}") from None

    def row(self, n: int) -> Any:
        """Row ``n`` decoded from JSON, exactly as stored (every key kept)."""
        n = self._check(n)
        start, end = (int(v) for v in self._spans[n])
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        data = os.pread(self._fd, end - start, start)
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"{self.where(n)}: malformed corpus line: {e}") from None

    def fingerprint(self) -> str:
        """What identifies this file's contents cheaply: its resolved path, size and mtime."""
        return f"{self.path.resolve()}:{self.size}:{self.mtime_ns}"

    def _check(self, n: int) -> int:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"corpus rows are indexed by int, got {type(n).__name__}")
        size = len(self)
        if not -size <= n < size:
            raise IndexError(f"{self.path}: row {n} is out of range (the corpus has {size} rows)")
        return int(n) % size

    def where(self, n: int) -> str:
        """``file:line`` of row ``n`` (1-based line, blank lines counted), for error messages:
        the line is counted on demand, so this costs a read of the file up to the row."""
        start = int(self._spans[self._check(n)][0])
        lines, done = 1, 0
        with open(self.path, "rb") as f:
            while done < start:
                chunk = f.read(min(_SCAN_BYTES, start - done))
                if not chunk:
                    break
                lines += chunk.count(b"\n")
                done += len(chunk)
        return f"{self.path}:{lines}"


def _load_or_build_offsets(path: Path, st: os.stat_result,
                           cache_dir: str | os.PathLike | None) -> tuple[Path, np.ndarray]:
    """The (N, 2) int64 table of each row's [start, end) byte span, memory-mapped.

    The file stores one extra first row, ``(size, mtime_ns)`` of the corpus it describes,
    so a changed corpus is noticed without reading it.
    """
    stamp = (st.st_size, st.st_mtime_ns)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir("retrieval")
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    locations = [path.with_name(path.name + OFFSETS_SUFFIX), root / "offsets" / f"{key}{OFFSETS_SUFFIX}"]
    for where in locations:
        table = _read_offsets(where, stamp)
        if table is not None:
            return where, table[1:]
    spans = _scan_rows(path)  # (N, 2)
    table = np.empty((len(spans) + 1, 2), dtype=np.int64)
    table[0] = stamp
    table[1:] = spans
    for where in locations:
        try:
            atomic_write(where, lambda tmp: save_npy(tmp, table))
        except OSError:
            continue  # not writable here: try the cache folder
        return where, np.load(where, mmap_mode="r")[1:]
    return locations[-1], table[1:]  # nowhere writable: keep it in memory


def _read_offsets(where: Path, stamp: tuple[int, int]) -> np.ndarray | None:
    try:
        table = np.load(where, mmap_mode="r")
    except (OSError, ValueError):  # missing, or not an .npy file
        return None
    ok = table.ndim == 2 and table.shape[1] == 2 and len(table) >= 1 and table.dtype == np.int64
    return table if ok and tuple(int(v) for v in table[0]) == stamp else None


def _scan_rows(path: Path) -> np.ndarray:
    """[start, end) of every non-blank line (end excludes the newline), in file order."""
    newlines = []
    with open(path, "rb") as f:
        base = 0
        while chunk := f.read(_SCAN_BYTES):
            newlines.append(np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 0x0A) + base)
            base += len(chunk)
    ends = np.concatenate(newlines) if newlines else np.empty(0, dtype=np.int64)
    starts = np.concatenate([[0], ends + 1])
    ends = np.concatenate([ends, [base]])  # the last line may lack its newline
    spans = np.stack([starts, ends], axis=1).astype(np.int64)  # (lines, 2)
    lengths = spans[:, 1] - spans[:, 0]
    keep = lengths > 0
    short = np.flatnonzero(keep & (lengths < _SHORT_LINE))
    if len(short):  # whitespace-only lines ("\r", "  ") are blank too
        with open(path, "rb") as f:
            for i in short:
                f.seek(int(spans[i, 0]))
                if not f.read(int(lengths[i])).strip():
                    keep[i] = False
    return spans[keep]


def save_npy(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as f:  # a file object: np.save would append ".npy" to a name
        np.save(f, array)
