"""QA items and JSON-lines rows: what every QA source yields and how it is stored.

Shared by the loaders (``envs.data.qa``) and the synthetic world (``envs.data.synthwiki``),
which import this module and never each other.

>>> item = QAItem("test_0", "where was Maren Tolvik born", ["Kessa"], "nq")
>>> item.golden_answers
('Kessa',)
>>> QAItem.from_dict(item.to_dict()) == item
True
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATASETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
SINGLE_HOP = DATASETS[:3]
MULTI_HOP = DATASETS[3:]


@dataclass(frozen=True)
class QAItem:
    """One question with every answer that counts as correct.

    ``golden_answers`` is stored as a tuple (a list or a single string is accepted);
    ``metadata`` takes part in ``==`` but not in ``hash``. The synthetic world puts
    ``{"style", "hops", "supporting"}`` there; real benchmark rows usually have none.
    """

    id: str
    """Row id, unique within a split (``"test_6233"``, ``"2hop__647996_551681"``)."""
    question: str
    golden_answers: tuple[str, ...]
    """Aliases of the answer; an exact match against any of them is correct."""
    dataset: str = ""
    """One of ``DATASETS`` for the seven benchmarks; empty when unknown."""
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        answers = self.golden_answers
        if isinstance(answers, str):
            answers = (answers,)
        if not isinstance(answers, (list, tuple)):
            raise _wrong("golden_answers must be a string or a list of strings", answers)
        answers = tuple(answers)
        for answer in answers:
            if not isinstance(answer, str):
                raise _wrong("golden_answers must hold strings", answer)
        if not answers or not any(answer.strip() for answer in answers):
            raise ValueError(f"golden_answers is empty: {self.golden_answers!r}")
        object.__setattr__(self, "golden_answers", answers)
        for name in ("id", "question", "dataset"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise _wrong(f"{name} must be a string", value)
        if not self.question.strip():
            raise ValueError(f"question is empty: {self.question!r}")
        if not isinstance(self.metadata, Mapping):
            raise _wrong("metadata must be a mapping", self.metadata)

    def to_dict(self) -> dict[str, Any]:
        """The FlashRAG row: id, question, golden_answers, dataset, and metadata when non-empty."""
        row: dict[str, Any] = {"id": self.id, "question": self.question,
                               "golden_answers": list(self.golden_answers), "dataset": self.dataset}
        if self.metadata:
            row["metadata"] = dict(self.metadata)
        return row

    @classmethod
    def from_dict(cls, row: Mapping[str, Any], dataset: str = "") -> QAItem:
        """Parse a FlashRAG row; ``dataset`` fills in a row without one.

        Real-data quirks accepted: an int id (stored as str), a single string for
        ``golden_answers``, int answers (stored as str), unknown keys (ignored).
        Raises ``ValueError`` saying which field is wrong and its value.
        """
        if not isinstance(row, Mapping):
            raise _wrong("a row must be a JSON object", row)
        for key in ("id", "question", "golden_answers"):
            if key not in row:
                raise ValueError(f"missing {key!r} (keys: {sorted(row)})")
        row_id = row["id"]
        if isinstance(row_id, int) and not isinstance(row_id, bool):
            row_id = str(row_id)
        answers = row["golden_answers"]
        if isinstance(answers, (list, tuple)):
            answers = [str(a) if isinstance(a, int) and not isinstance(a, bool) else a
                       for a in answers]
        return cls(id=row_id, question=row["question"], golden_answers=answers,
                   dataset=row.get("dataset") or dataset, metadata=row.get("metadata") or {})


def _wrong(what: str, value: Any) -> ValueError:
    """``what`` was expected: the error names the type and value found."""
    return ValueError(f"{what}, got {type(value).__name__} {value!r}")


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every row of a JSONL file, ``.gz``-compressed or not (blank lines skipped).

    Raises ``ValueError`` naming the file and the 1-based line of a row that is not a
    JSON object (or nests deeper than :data:`MAX_DEPTH`), of bytes that are not UTF-8, or
    where a ``.gz`` file is cut short.
    """
    return [row for _, row in iter_jsonl(Path(path))]


def write_jsonl(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write one JSON object per line (UTF-8, parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(dict(row), ensure_ascii=False) + "\n")
    return path


MAX_DEPTH = 100
"""How deeply a JSON value read from a file may nest (arrays and objects). A FlashRAG row
nests 3 levels, an episode record 4; ``json.loads`` itself gives up near 1,000 with a
``RecursionError``, and code that walks a value recursively may fail before that."""

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def loads(text: str) -> Any:
    """``json.loads`` for text from a file we did not write: a value that nests deeper than
    :data:`MAX_DEPTH` is a ``ValueError`` saying so (not a ``RecursionError``, here or in
    whatever walks the value later). Bad JSON is ``json.JSONDecodeError``, a ``ValueError``.
    Costs nothing more on text with at most :data:`MAX_DEPTH` brackets."""
    if text.count("[") + text.count("{") > MAX_DEPTH:  # else it cannot nest deeper
        depth = deepest = 0  # brackets outside strings: a bound, bad JSON gets a number too
        for bracket in _JSON_BRACKET.findall(_JSON_STRING.sub("", text)):
            depth += 1 if bracket in "[{" else -1
            deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            raise ValueError(f"nested {deepest} levels deep, more than the {MAX_DEPTH} a row may have")
    try:
        return json.loads(text)
    except RecursionError:  # cannot happen below MAX_DEPTH; kept so no traceback can escape
        raise ValueError(f"nested more than the {MAX_DEPTH} levels a row may have") from None


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(1-based line, row)`` for each non-blank line of ``path`` (``.gz``: decompressed
    as it is read); errors as :func:`read_jsonl`."""
    for lineno, raw in iter_lines(path):
        try:
            # A byte-order mark may open a file written on Windows; it is not part of the row.
            line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}, line {lineno}: not UTF-8 text (byte {raw[e.start]:#04x} at "
                             f"column {e.start + 1})") from None
        if not line.strip():
            continue
        try:
            row = loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {lineno}: bad JSON ({e.msg}): "
                             f"{line.strip()[:80]!r}") from None
        except ValueError as e:  # nested too deep
            raise ValueError(f"{path}, line {lineno}: bad JSON ({e})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}, line {lineno}: a row must be a JSON object, got "
                             f"{type(row).__name__} {row!r:.80}")
        yield lineno, row


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(1-based line, raw bytes)`` of a file, ``.gz`` decompressed as it is read: a bad
    byte is then reported with its line rather than as a decode error somewhere in the
    file, and a truncated or corrupt ``.gz`` is a ``ValueError`` naming the file and line."""
    if path.suffix != ".gz":
        with path.open("rb") as f:
            yield from enumerate(f, start=1)
        return
    lineno = 0
    with gzip.open(path, "rb") as f:
        try:
            for lineno, raw in enumerate(f, start=1):
                yield lineno, raw
        except (EOFError, OSError, zlib.error) as e:  # cut short, or not gzip at all
            raise ValueError(f"{path}, line {lineno + 1}: the gzip data is truncated or corrupt "
                             f"({e})") from None
