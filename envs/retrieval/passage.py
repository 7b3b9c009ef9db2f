"""The retrieval data types: a ``Passage``, the ``Retriever`` protocol, and corpus loading.

A corpus is FlashRAG / wiki-18 JSONL, one passage a line::

    {"id": "0", "contents": "\\"Evan Morris\\"\\nEvan Morris Evan L. Morris (January 26, ..."}

``{"id", "title", "text"}`` rows (and BEIR's ``_id``) are accepted too, as is a
gzip-compressed file (``.jsonl.gz``, the form wiki-18 ships in).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from envs.data.items import iter_lines


@dataclass(frozen=True)
class Passage:
    """One retrievable passage."""

    id: str
    title: str
    """The title line, without wiki-18's wrapping double quotes."""
    text: str
    """The body, exactly as in the corpus (wiki-18's may begin by repeating the title)."""
    score: float = 0.0
    """The retriever's similarity (a cosine, in [-1, 1]); 0.0 for a passage not retrieved."""
    row: int | None = field(default=None, compare=False, repr=False)
    """Its row in its corpus (file order, blank lines skipped) when the retriever knows it:
    a server returns the stored row without an id map over 21M passages."""

    @classmethod
    def from_contents(cls, id: str, contents: str, score: float = 0.0) -> Passage:
        """Parse FlashRAG's ``"Title\\ntext"``.

        >>> Passage.from_contents("0", '"Evan Morris"\\nEvan Morris Evan L. Morris was ...')
        Passage(id='0', title='Evan Morris', text='Evan Morris Evan L. Morris was ...', score=0.0)

        Contents without a newline are all text, with an empty title.
        """
        title, sep, text = contents.partition("\n")
        if not sep:
            return cls(str(id), "", contents, float(score))
        return cls(str(id), _unquote_title(title), text, float(score))

    @classmethod
    def from_row(cls, row: Mapping[str, Any], score: float = 0.0) -> Passage:
        """Build from a corpus row: ``{"id", "contents"}`` or ``{"id", "title", "text"}``.

        Raises ValueError saying what is missing or of the wrong type.
        """
        if not isinstance(row, Mapping):
            raise ValueError(f"a corpus row must be a JSON object, got {type(row).__name__}")
        pid = row.get("id", row.get("_id"))
        if pid is None or isinstance(pid, bool) or not isinstance(pid, (str, int)):
            raise ValueError(f"a corpus row needs a string or integer 'id', got {pid!r}")
        if "contents" in row:
            contents = row["contents"]
            if not isinstance(contents, str):
                raise ValueError(f"'contents' must be a string, got {type(contents).__name__}")
            return cls.from_contents(str(pid), contents, score)
        title, text = row.get("title", ""), row.get("text")
        if not isinstance(text, str) or not isinstance(title, str):
            raise ValueError(
                f"a corpus row needs 'contents' or string 'title' and 'text', got keys {sorted(row)}"
            )
        return cls(str(pid), _unquote_title(title), text, float(score))

    @property
    def contents(self) -> str:
        """FlashRAG's ``"Title\\ntext"`` (just the text when there is no title)."""
        return f"{self.title}\n{self.text}" if self.title else self.text


def _unquote_title(title: str) -> str:
    # wiki-18 writes titles CSV-style: wrapped in double quotes, inner quotes doubled.
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        return title[1:-1].replace('""', '"')
    return title


@runtime_checkable
class Retriever(Protocol):
    """Anything that answers a batch of queries with ranked passages."""

    def search(self, queries: Sequence[str], top_k: int = 3) -> list[list[Passage]]:
        """One ranked list per query, best first, at most ``top_k`` long (shorter only when
        the corpus is smaller); each Passage carries its score."""
        ...


def check_search(queries: Sequence[str], top_k: int) -> None:
    """A ``search`` call's arguments: a sequence of queries (TypeError for one bare string)
    and ``top_k >= 1`` (ValueError)."""
    if isinstance(queries, str):
        raise TypeError("search takes a sequence of query strings; wrap a single query in a list")
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")


class MemoRetriever:
    """Remembers each (query, top_k) answer of a deterministic retriever, and asks it only
    for the queries it has not seen: scripted teams and repeated questions send the same
    queries again and again, and query encoding is most of a dense retriever's cost."""

    def __init__(self, retriever: Retriever):
        self.retriever = retriever
        self._hits: dict[tuple[str, int], list[Passage]] = {}

    def search(self, queries: Sequence[str], top_k: int = 3) -> list[list[Passage]]:
        missing = list(dict.fromkeys(q for q in queries if (q, top_k) not in self._hits))
        if missing:
            for query, passages in zip(missing, self.retriever.search(missing, top_k), strict=True):
                self._hits[(query, top_k)] = passages
        return [self._hits[(q, top_k)] for q in queries]


CorpusSource = str | os.PathLike | Iterable[Mapping[str, Any] | Passage]


def load_corpus(path_or_rows: CorpusSource) -> list[Passage]:
    """Load a corpus from a JSONL(.gz) file or an iterable of row dicts / Passages.

    Raises FileNotFoundError naming a missing file, and ValueError naming the file and the
    1-based line number (or the row index) of a malformed row or a repeated id.
    """
    if isinstance(path_or_rows, (str, os.PathLike)):
        path = Path(path_or_rows)
        if not path.is_file():
            raise FileNotFoundError(f"corpus file not found: {str(path)!r}")
        return _dedup(_read_jsonl(path), lambda n: f"{path}:{n}")
    if isinstance(path_or_rows, Mapping):
        raise TypeError("load_corpus takes a path or an iterable of rows, not a single dict")
    return _dedup(_read_rows(path_or_rows), lambda n: f"corpus row {n}")


def _read_jsonl(path: Path) -> Iterator[tuple[int, Passage]]:
    for lineno, line in iter_lines(path):  # a truncated .gz: ValueError naming file and line
        if not line.strip():
            continue
        try:
            yield lineno, Passage.from_row(json.loads(line))
        except (ValueError, TypeError, RecursionError) as e:  # bad JSON or UTF-8 are ValueErrors
            raise ValueError(f"{path}:{lineno}: malformed corpus line: {e}") from None


def _read_rows(rows: Iterable[Mapping[str, Any] | Passage]) -> Iterator[tuple[int, Passage]]:
    for i, row in enumerate(rows, start=1):
        if isinstance(row, Passage):
            yield i, row
            continue
        try:
            yield i, Passage.from_row(row)
        except ValueError as e:
            raise ValueError(f"corpus row {i}: {e}") from None


def _dedup(numbered: Iterable[tuple[int, Passage]], where) -> list[Passage]:
    seen: dict[str, int] = {}
    passages = []
    for n, passage in numbered:
        if passage.id in seen:
            raise ValueError(
                f"{where(n)}: duplicate passage id {passage.id!r} (first at {where(seen[passage.id])})"
            )
        seen[passage.id] = n
        passages.append(passage)
    return passages
