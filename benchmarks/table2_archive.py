"""Table 2's archives: what ``benchmarks.table2`` writes beside ``table2.json`` so that an
ablation's finished runs can be committed, audited and put back on another machine.

- :data:`RECORDS_FILE`, :data:`METRICS_FILE`, :data:`RUNS_FILE`: every run's per-question
  validation records, metrics rows and ``run.json`` record, as deterministic gzip
  (:func:`write_gzip_jsonl`: the same runs give the same bytes);
- :func:`restore_runs`: the finished runs of a written table back into an ablation's
  directory, without checkpoints (``python -m benchmarks table2 --restore``);
- :func:`publish_table`: a written table and its archives copied into ``docs/`` as the pages
  keep them (``python -m benchmarks table2 --publish``).
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from algos.mechanism import QUESTION_SUBSETS_FILE, SKIP_FILE
from benchmarks.ablate import RUN_FILE, TEACHER, run_name

RECORDS_FILE = "table2_records.jsonl.gz"
METRICS_FILE = "table2_metrics.jsonl.gz"
RUNS_FILE = "table2_runs.jsonl.gz"
"""Every run's ``run.json`` record and measured skip probability: with the two archives above,
what :func:`restore_runs` needs to put finished runs back into an ablation's directory."""
RECORD_KEYS = ("run", "variant", "seed", "final", "style")
"""The keys a :data:`RECORDS_FILE` row adds to a validation record, and a :data:`METRICS_FILE`
row (``run``) to a metrics row; neither has them of its own."""


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``table2_records.jsonl.gz`` (or ``table2_metrics.jsonl.gz``)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_gzip_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """JSON lines, gzipped byte for byte the same for the same rows (no time, no file name
    in the header), written atomically."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as f:
        for row in rows:
            f.write((json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, path)
    return path


def restore_runs(table_json: str | Path, out: str | Path) -> list[str]:
    """Put the finished runs of a written table (its ``table2.json`` and the three archives
    beside it) back into the ablation directory ``out``, as the runs left them for the table
    (``run.json``, ``metrics.jsonl``, the step-0 and final validation records, the skip
    probability; the marked question sets, :data:`algos.mechanism.QUESTION_SUBSETS_FILE`), without
    their checkpoints; returns the runs restored. A later ``python -m
    benchmarks ablate`` with the same settings and ``--out`` takes them as finished and
    trains only the rest, and ``python -m benchmarks table2 out`` tables them all: an
    ablation longer than one machine's life goes on from the committed archives.

    A run already in ``out`` is left as it is. A seed's Teacher is restored only when all the
    planned variants of that seed are (the ablation's ``--variants``; its checkpoint, which a
    missing variant would start from, is not in the archives): otherwise the ablation trains
    it again. ``out`` gets the table's plan (``ablation.json``) when it has none, so the
    ablation refuses other settings as it would for its own runs. Raises ValueError naming
    the file that is missing or not an archive of this table."""
    from algos.trainer import validation_path

    table_json, out = Path(table_json), Path(out)
    try:
        table = json.loads(table_json.read_text(encoding="utf-8"))
        names = [table[key] for key in ("records", "metrics", "run_records")]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{table_json}: not a table2.json with its archives ({type(err).__name__}: {err})") from None
    paths = [table_json.parent / name for name in names]
    try:
        records, metrics, runs = (read_records(path) for path in paths)
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f"{table_json.parent}: cannot read the archives {names} ({err})") from None
    planned, archived = table.get("planned_variants") or table["variants"], {r["run"] for r in runs}
    complete = {int(s) for s in table["seeds"] if all(run_name(int(s), v) in archived for v in planned)}
    restored = []
    for row in runs:
        record, run_dir = row["record"], out / row["run"]
        if (run_dir / RUN_FILE).exists() or (record["variant"] == TEACHER and int(record["seed"]) not in complete):
            continue
        mine = [r for r in records if r["run"] == row["run"]]
        files = {validation_path(run_dir, 0): [r for r in mine if not r["final"]],
                 run_dir / record["final_validation"]: [r for r in mine if r["final"]]}
        files[run_dir / "metrics.jsonl"] = [m for m in metrics if m["run"] == row["run"]]
        for path, rows in files.items():  # each row as the run wrote it, without what the archive added
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps({k: v for k, v in r.items() if k not in RECORD_KEYS},
                                               ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        if row.get("skip_probability") is not None:
            (run_dir / SKIP_FILE).write_text(json.dumps(row["skip_probability"], indent=2), encoding="utf-8")
        (run_dir / RUN_FILE).write_text(json.dumps(record, indent=2), encoding="utf-8")  # last: the run is done
        restored.append(row["run"])
    subsets = out / QUESTION_SUBSETS_FILE
    if restored and table.get("question_subsets") and not subsets.exists():
        subsets.write_text(json.dumps({name: {"about": kept["about"], "questions": kept["questions"]}
                                       for name, kept in table["question_subsets"].items()}, indent=1) + "\n",
                           encoding="utf-8")
    plan = out / "ablation.json"
    if restored and not plan.exists():
        plan.write_text(json.dumps({"preset": table.get("preset"), "seeds": table["seeds"],
                                    "base_seeds": table.get("base_seeds"), "variants": planned,
                                    "overrides": table.get("overrides", {}), "bases": table.get("bases", {}),
                                    "runs": {}, "restored_from": str(table_json)}, indent=2), encoding="utf-8")
    return restored


PUBLISHED_CURVES = "table2_curves.png"
"""The name a published table's curves take beside the other pages' figures in ``docs/``."""


def publish_table(out: str | Path, dest: str | Path) -> list[Path]:
    """Copy the table written in the ablation directory ``out`` into ``dest`` as ``docs/``
    keeps it: ``table2.json`` and its three archives under their own names, the curves as
    :data:`PUBLISHED_CURVES` (the JSON's ``curves_png`` says so); returns the files written.
    :func:`restore_runs` takes the runs back from there, and ``python -m benchmarks table2
    --render-docs`` renders the pages' tables from it. Raises ValueError naming a file that
    is missing."""
    out, dest = Path(out), Path(dest)
    try:
        table = json.loads((out / "table2.json").read_text(encoding="utf-8"))
        sources = {table[key]: table[key] for key in ("records", "metrics", "run_records")}
        sources[table["curves_png"]] = PUBLISHED_CURVES
        copies = {name: (out / name).read_bytes() for name in sources}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{out}: no written table with its archives and curves to publish "
                         f"({type(err).__name__}: {err})") from None
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in copies.items():
        (dest / sources[name]).write_bytes(data)
        written.append(dest / sources[name])
    table["curves_png"] = PUBLISHED_CURVES
    (dest / "table2.json").write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    return [dest / "table2.json", *written]
