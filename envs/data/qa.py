"""QA loaders, in the FlashRAG layout (the hub dataset ``RUC-NLPIR/FlashRAG_datasets``'s, and
what ``write_flashrag`` writes): ``<root>/<name>/<split>.jsonl`` (or ``.jsonl.gz``, ``.json``,
``.parquet``), one row ``{"id", "question", "golden_answers": [...], "dataset"?, "metadata"?}``
per question.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envs.data.items import DATASETS, QAItem, iter_jsonl, loads
from envs.data.synthwiki import default_world

SPLIT_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")
"""The files ``load_qa`` looks for, in this order: ``<root>/<name>/<split><suffix>``."""

HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"
SYNTHETIC = "synthetic"
"""Pass ``root=SYNTHETIC`` to ``load_qa`` for the questions of the default synthetic world."""


def _iter_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow.parquet as pq

    yield from enumerate(pq.read_table(path).to_pylist(), start=1)


def _is_json_array(path: Path) -> bool:
    """Whether a ``.json`` split holds one JSON array of rows (else it is JSON Lines under
    that name; FlashRAG writes both)."""
    with path.open("rb") as f:
        return f.read(64).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[")


def _iter_json_array(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        rows = loads(path.read_text(encoding="utf-8-sig"))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not a JSON array of rows ({e})") from None
    yield from enumerate(rows, start=1)


def _no_answer(row: Any) -> bool:
    """A row whose ``golden_answers`` is present but empty (``[]``, ``""``, ``[""]``):
    FlashRAG keeps such rows; nothing can be scored against them."""
    if not isinstance(row, dict) or "golden_answers" not in row:
        return False
    answers = row["golden_answers"]
    if isinstance(answers, str):
        answers = [answers]
    return isinstance(answers, list) and all(isinstance(a, str) and not a.strip() for a in answers)


def read_qa_file(path: str | os.PathLike, dataset: str = "",
                 limit: int | None = None) -> list[QAItem]:
    """The QA items of one ``.jsonl``, ``.json`` or ``.parquet`` file (the first ``limit``
    when given).

    A row with an empty ``golden_answers`` is left out with a ``UserWarning`` naming the
    file and its lines (it could never be scored). A malformed row, bytes that are not
    UTF-8 or a truncated ``.gz`` raise ``ValueError`` naming the file, the 1-based line
    (row for parquet and JSON arrays) and what was wrong.
    """
    path = Path(path)
    if path.suffix == ".parquet":
        rows, where = _iter_parquet(path), "row"
    elif path.suffix == ".json" and _is_json_array(path):
        rows, where = _iter_json_array(path), "row"
    else:
        rows, where = iter_jsonl(path), "line"
    items: list[QAItem] = []
    unanswered: list[int] = []
    for lineno, row in rows if limit != 0 else ():
        if _no_answer(row):
            unanswered.append(lineno)
            continue
        try:
            items.append(QAItem.from_dict(row, dataset=dataset))
        except ValueError as e:
            raise ValueError(f"{path}, {where} {lineno}: {e}") from None
        if len(items) == limit:
            break  # before reading past the limit
    if unanswered:
        shown = ", ".join(map(str, unanswered[:10])) + (", ..." if len(unanswered) > 10 else "")
        warnings.warn(f"{path}: left out {len(unanswered)} rows with an empty golden_answers "
                      f"({where} {shown}): they cannot be scored", stacklevel=2)
    return items


def load_qa(
    name: str,
    split: str = "test",
    root: str | os.PathLike | None = None,
    limit: int | None = None,
) -> list[QAItem]:
    """The questions of one dataset split.

    ``root`` selects the source:

    - a directory in the FlashRAG layout: ``<root>/<name>/<split>.jsonl``, ``.jsonl.gz``,
      ``.json`` or ``.parquet`` (any ``name`` the directory has, not only the seven ``DATASETS``);
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
        raise FileNotFoundError(f"no dataset directory {directory}; datasets in {root}: "
                                f"{', '.join(available) or 'none'}")
    for suffix in SPLIT_SUFFIXES:
        path = directory / f"{split}{suffix}"
        if path.is_file():
            return read_qa_file(path, dataset=name, limit=limit)
    splits = sorted(p.name[: -len(suffix)] for p in directory.iterdir() for suffix in SPLIT_SUFFIXES
                    if p.name.endswith(suffix))
    raise FileNotFoundError(
        f"no split {split!r} for {name!r}: none of {directory / split}{{{','.join(SPLIT_SUFFIXES)}}} "
        f"exists; splits in {directory}: {', '.join(dict.fromkeys(splits)) if splits else 'none'}")


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; expected one of: {', '.join(DATASETS)}")


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hub_file(name: str, split: str) -> Path:
    """Download (or find in the cache) ``<name>/<split>.jsonl`` of the FlashRAG hub dataset."""
    from huggingface_hub import hf_hub_download

    filename = f"{name}/{split}.jsonl"
    how_to = ("To use local files, pass root=DIR with DIR in the FlashRAG layout "
              f'(DIR/{name}/{split}.jsonl with rows {{"id", "question", "golden_answers"}}), '
              "or write the synthetic world with `python -m envs data synth --out DIR` and pass "
              'root=DIR (or root="synthetic" to use it in memory).')
    # Checked here rather than left to huggingface_hub, which reads HF_HUB_OFFLINE once at import.
    offline = hub_offline()
    try:
        return Path(hf_hub_download(HUB_REPO, filename, repo_type="dataset",
                                    local_files_only=offline))
    except Exception as e:  # network, offline mode, missing entry: all end in the same advice
        reason = ("HF_HUB_OFFLINE is set and the file is not in the local cache" if offline
                  else f"{type(e).__name__}: {e}")
        raise FileNotFoundError(f"cannot load {filename} from the hub dataset {HUB_REPO} "
                                f"({reason}). {how_to}") from e
