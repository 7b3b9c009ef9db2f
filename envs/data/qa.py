"""QA items and their loaders, in the FlashRAG layout.

A dataset lives at ``<root>/<name>/<split>.jsonl`` (or ``.parquet``), one question per
row: ``{"id", "question", "golden_answers": [...], "dataset"?, "metadata"?}``. This is
the layout of the hub dataset ``RUC-NLPIR/FlashRAG_datasets``, which ``load_qa`` reads
when no ``root`` is given, and of what ``write_flashrag`` (the synthetic world) writes.

>>> item = QAItem("test_0", "where was Maren Tolvik born", ["Kessa"], "nq")
>>> item.golden_answers
('Kessa',)
>>> QAItem.from_dict(item.to_dict()) == item
True
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATASETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
SINGLE_HOP = DATASETS[:3]
MULTI_HOP = DATASETS[3:]

HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"
SYNTHETIC = "synthetic"
"""Pass ``root=SYNTHETIC`` to ``load_qa`` for the questions of the default synthetic world."""


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
            raise ValueError(
                f"golden_answers must be a string or a list of strings, got {type(answers).__name__} {answers!r}"
            )
        answers = tuple(answers)
        for answer in answers:
            if not isinstance(answer, str):
                raise ValueError(
                    f"golden_answers must hold strings, got {type(answer).__name__} {answer!r}"
                )
        if not answers or not any(answer.strip() for answer in answers):
            raise ValueError(f"golden_answers is empty: {self.golden_answers!r}")
        object.__setattr__(self, "golden_answers", answers)
        for name in ("id", "question", "dataset"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(f"{name} must be a string, got {type(value).__name__} {value!r}")
        if not self.question.strip():
            raise ValueError(f"question is empty: {self.question!r}")
        if not isinstance(self.metadata, Mapping):
            raise ValueError(
                f"metadata must be a mapping, got {type(self.metadata).__name__} {self.metadata!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The FlashRAG row: id, question, golden_answers, dataset, and metadata when non-empty."""
        row: dict[str, Any] = {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "dataset": self.dataset,
        }
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
            raise ValueError(f"a row must be a JSON object, got {type(row).__name__} {row!r}")
        for key in ("id", "question", "golden_answers"):
            if key not in row:
                raise ValueError(f"missing {key!r} (keys: {sorted(row)})")
        row_id = row["id"]
        if isinstance(row_id, int) and not isinstance(row_id, bool):
            row_id = str(row_id)
        answers = row["golden_answers"]
        if isinstance(answers, (list, tuple)):
            answers = [
                str(a) if isinstance(a, int) and not isinstance(a, bool) else a for a in answers
            ]
        return cls(
            id=row_id,
            question=row["question"],
            golden_answers=answers,
            dataset=row.get("dataset") or dataset,
            metadata=row.get("metadata") or {},
        )


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every row of a JSONL file (blank lines skipped).

    Raises ``ValueError`` naming the file and the 1-based line of a row that is not a
    JSON object.
    """
    return [row for _, row in _iter_jsonl(Path(path))]


def write_jsonl(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write one JSON object per line (UTF-8, parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(dict(row), ensure_ascii=False) + "\n")
    return path


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}, line {lineno}: bad JSON ({e.msg}): {line.strip()[:80]!r}"
                ) from e
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}, line {lineno}: a row must be a JSON object, got {type(row).__name__} {row!r:.80}"
                )
            yield lineno, row


def _iter_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow.parquet as pq

    yield from enumerate(pq.read_table(path).to_pylist(), start=1)


def read_qa_file(
    path: str | os.PathLike, dataset: str = "", limit: int | None = None
) -> list[QAItem]:
    """The QA items of one ``.jsonl`` or ``.parquet`` file (the first ``limit`` when given).

    A malformed row raises ``ValueError`` naming the file, the 1-based line (row for
    parquet) and what was wrong.
    """
    path = Path(path)
    if path.suffix == ".parquet":
        rows, where = _iter_parquet(path), "row"
    else:
        rows, where = _iter_jsonl(path), "line"
    items: list[QAItem] = []
    for lineno, row in itertools.islice(rows, limit):  # stops before reading past the limit
        try:
            items.append(QAItem.from_dict(row, dataset=dataset))
        except ValueError as e:
            raise ValueError(f"{path}, {where} {lineno}: {e}") from None
    return items


def load_qa(
    name: str,
    split: str = "test",
    root: str | os.PathLike | None = None,
    limit: int | None = None,
) -> list[QAItem]:
    """The questions of one dataset split.

    ``root`` selects the source:

    - a directory in the FlashRAG layout: ``<root>/<name>/<split>.jsonl`` or ``.parquet``
      (any ``name`` the directory has, not only the seven ``DATASETS``);
    - ``"synthetic"``: the default synthetic world (``synthwiki.default_world()``);
    - ``None``: ``<name>/<split>.jsonl`` of the hub dataset ``RUC-NLPIR/FlashRAG_datasets``
      (cached by ``huggingface_hub``); offline this raises ``FileNotFoundError`` saying
      how to point at local files instead.

    ``limit`` keeps the first rows. Raises ``ValueError`` for an unknown dataset or a
    malformed row, ``FileNotFoundError`` for a missing split (listing those that exist).
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit!r}")
    if root is not None and str(root) == SYNTHETIC:
        _check_name(name)
        from envs.data.synthwiki import default_world

        items = default_world().questions(name, split)
        return items if limit is None else items[:limit]
    if root is None:
        _check_name(name)
        return read_qa_file(_hub_file(name, split), dataset=name, limit=limit)

    root = Path(root)
    directory = root / name
    if not directory.is_dir():
        _check_name(name)
        if not root.is_dir():
            raise FileNotFoundError(f"no dataset directory {directory}: {root} is not a directory")
        available = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise FileNotFoundError(
            f"no dataset directory {directory}; datasets in {root}: {', '.join(available) or 'none'}"
        )
    for suffix in (".jsonl", ".parquet"):
        path = directory / f"{split}{suffix}"
        if path.is_file():
            return read_qa_file(path, dataset=name, limit=limit)
    splits = sorted({p.stem for p in directory.iterdir() if p.suffix in (".jsonl", ".parquet")})
    raise FileNotFoundError(
        f"no split {split!r} for {name!r}: neither {directory / (split + '.jsonl')} nor .parquet exists; "
        f"splits in {directory}: {', '.join(splits) if splits else 'none'}"
    )


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; expected one of: {', '.join(DATASETS)}")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hub_file(name: str, split: str) -> Path:
    """Download (or find in the cache) ``<name>/<split>.jsonl`` of the FlashRAG hub dataset."""
    from huggingface_hub import hf_hub_download

    filename = f"{name}/{split}.jsonl"
    how_to = (
        "To use local files, pass root=DIR with DIR in the FlashRAG layout "
        f'(DIR/{name}/{split}.jsonl with rows {{"id", "question", "golden_answers"}}), '
        "or write the synthetic world with `python -m envs data synth --out DIR` and pass "
        'root=DIR (or root="synthetic" to use it in memory).'
    )
    # Checked here rather than left to huggingface_hub, which reads HF_HUB_OFFLINE once at import.
    offline = _offline()
    try:
        return Path(
            hf_hub_download(HUB_REPO, filename, repo_type="dataset", local_files_only=offline)
        )
    except Exception as e:  # network, offline mode, missing entry: all end in the same advice
        reason = (
            "HF_HUB_OFFLINE is set and the file is not in the local cache"
            if offline
            else f"{type(e).__name__}: {e}"
        )
        raise FileNotFoundError(
            f"cannot load {filename} from the hub dataset {HUB_REPO} ({reason}). {how_to}"
        ) from e
