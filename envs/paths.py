"""Where mopd keeps what it builds once and reuses: converted tokenizers and models,
retrieval embeddings and indexes, the synthetic world. Override with ``MOPD_CACHE``.

And where a name read from a file or a request may lead: :func:`contained` is the one check
that such a name stays inside its folder; :func:`read_lines` reads a file we did not write
line by line under a size cap."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any


def cache_dir(*parts: str) -> Path:
    """``$MOPD_CACHE`` (default ``~/.cache/mopd``) joined with ``parts``, created on demand."""
    root = Path(os.environ.get("MOPD_CACHE", Path.home() / ".cache" / "mopd"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)`` then rename the file over ``path`` (folders made), so readers
    never see half a file. It is readable by all, as an ordinary file (mkstemp's 0600 would
    hide a shared corpus's offset table or a shared cache from other users)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def contained(root: str | os.PathLike[str], name: Any, *, source: str | os.PathLike[str] | None = None) -> Path:
    """``root / name`` for a ``name`` read from a file or a request (an archive's run name, a
    checkpoint pointer, a shard or record file name), once it is sure to stay under ``root``:
    the one check every such join goes through before anything is opened or written.

    Refused (the checks below) with a one-line ValueError naming ``source`` (the file the name
    came from), the name and why; links that stay inside are followed. Returns the join as
    given (not resolved), so messages keep the paths the user typed.

    >>> contained("runs/x", "seed0/opd")
    PosixPath('runs/x/seed0/opd')
    """
    from envs.terminal import terminal_safe

    def refuse(why: str) -> ValueError:
        where = f"{os.fspath(source)}: " if source is not None else ""
        shown = repr(name) if isinstance(name, str) else f"a {type(name).__name__}"
        return ValueError(terminal_safe(f"{where}refusing the name {shown:.200}: {why} (a name read from a file "
                                        f"must stay inside {os.fspath(root)})", one_line=True))

    if not isinstance(name, str) or not name:
        raise refuse("not a non-empty file name")
    if "\x00" in name:
        raise refuse("it holds a NUL byte")
    if os.path.isabs(name):
        raise refuse("an absolute path")
    if ".." in Path(name).parts:
        raise refuse("it climbs out with '..'")
    try:
        base = Path(root).resolve()
        target = (base / name).resolve()
    except (OSError, RuntimeError, ValueError) as err:  # a link loop, a name too long
        raise refuse(f"it cannot be resolved ({type(err).__name__})") from None
    if target == base:
        raise refuse("it names the folder itself")
    if not target.is_relative_to(base):
        raise refuse(f"a symbolic link on the way leads outside, to {target}")
    return Path(root) / name


def read_lines(stream: IO[bytes], *, max_line: int, max_total: int, label: str) -> Iterator[tuple[int, bytes]]:
    """``(1-based line, raw bytes)`` of a binary stream we did not write, read line by line
    with a size cap: a line longer than ``max_line`` bytes, or more than ``max_total`` bytes
    in all, is a one-line ValueError naming ``label`` and the line, raised after reading at
    most ``max_line + 1`` bytes of that line (a 2 GB line is never held whole)."""
    lineno = total = 0
    while True:
        raw = stream.readline(max_line + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > max_line:
            raise ValueError(f"{label}, line {lineno}: longer than {max_line:,} bytes, the most a line may hold")
        total += len(raw)
        if total > max_total:
            raise ValueError(f"{label}, line {lineno}: more than {max_total:,} bytes in all, the most it may hold")
        yield lineno, raw


def read_capped(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of a file we did not write when it holds at most ``limit`` of them, else a
    ValueError naming it; read in chunks, so neither a large file nor a large ``limit`` costs
    more memory than the file's own size (``read(limit)`` would reserve ``limit`` at once)."""
    chunks, total = [], 0
    with open(path, "rb") as f:
        while chunk := f.read(min(1 << 20, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise ValueError(f"{os.fspath(path)}: larger than {limit:,} bytes, the most it may hold")
    return b"".join(chunks)
