"""Table 2's archives beside ``table2.json`` (deterministic gzip), :func:`restore_runs` (``table2
--restore``) and :func:`publish_table` (``table2 --publish``): docs/table2.md ("What it writes")."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from algos.mechanism import QUESTION_SUBSETS_FILE, SKIP_FILE
from benchmarks.table2.runs import RUN_FILE, TEACHER, run_name
from envs.data.items import loads
from envs.paths import atomic_write, contained, read_capped, read_lines
from envs.terminal import terminal_safe

RECORDS_FILE = "table2_records.jsonl.gz"
METRICS_FILE = "table2_metrics.jsonl.gz"
RUNS_FILE = "table2_runs.jsonl.gz"
"""Every run's ``run.json`` record and measured skip probability: with the two archives above,
what :func:`restore_runs` needs to put finished runs back into an ablation's directory."""
RECORD_KEYS = ("run", "variant", "seed", "final", "style")
"""The keys a :data:`RECORDS_FILE` row adds to a validation record, and a :data:`METRICS_FILE`
row (``run``) to a metrics row; neither has them of its own."""


MAX_LINE_BYTES = 1 << 20
"""The longest line an archive may hold (1 MiB; a written one's longest is a few KB): a longer
one is refused after reading that much of it, never held whole."""
MAX_ARCHIVE_BYTES = 1 << 30
"""The most an archive may hold decompressed (1 GiB)."""
MAX_TABLE_BYTES = 64 << 20
"""The largest ``table2.json`` read (64 MiB; a written one is well under 1 MiB)."""


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``table2_records.jsonl.gz`` (or ``table2_metrics.jsonl.gz``), read line by
    line under :data:`MAX_LINE_BYTES` a line and :data:`MAX_ARCHIVE_BYTES` in all. ValueError
    (one line naming the file and line) for a line too long, one that is not a JSON object, or
    gzip data cut or damaged."""
    rows, lineno = [], 0
    try:
        with gzip.open(path, "rb") as f:
            for lineno, raw in read_lines(f, max_line=MAX_LINE_BYTES, max_total=MAX_ARCHIVE_BYTES, label=str(path)):
                if not raw.strip():
                    continue
                try:
                    row = loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, ValueError) as err:
                    raise ValueError(f"{path}, line {lineno}: not a JSON row ({type(err).__name__})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{path}, line {lineno}: a row must be a JSON object, got {type(row).__name__}")
                rows.append(row)
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise ValueError(f"{path}, line {lineno + 1}: the gzip data is cut or damaged ({type(err).__name__})") from None
    return rows


def write_gzip_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """JSON lines, gzipped byte for byte the same for the same rows (no time, no file name
    in the header), written atomically."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as f:
        for row in rows:
            f.write((json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))
    atomic_write(Path(path), lambda tmp: Path(tmp).write_bytes(buffer.getvalue()))
    return Path(path)


def restore_runs(table_json: str | Path, out: str | Path) -> list[str]:
    """Put the finished runs of a written table (``table2.json`` and its archives) back into
    the ablation directory ``out`` as the runs left them, without checkpoints; returns the runs
    restored. A run already there is left alone; a seed's Teacher comes back only with all
    its planned variants; ``out`` gets the table's plan when it has none. Raises ValueError
    naming the file that is missing or not an archive of this table."""
    from algos.trainer import validation_path

    table_json, out = Path(table_json), Path(out)
    table = _read_table(table_json)
    paths = [contained(table_json.parent, table[key], source=table_json)
             for key in ("records", "metrics", "run_records")]
    try:
        records, metrics, runs = (read_records(path) for path in paths)
    except OSError as err:
        raise ValueError(f"{table_json.parent}: cannot read the archives "
                         f"{_quote([p.name for p in paths])} ({err.strerror or type(err).__name__})") from None
    planned = _checked(table_json, "planned_variants", table.get("planned_variants") or table.get("variants"),
                       lambda v: isinstance(v, list) and bool(v) and all(map(_is_name, v)))
    seeds = _checked(table_json, "seeds", table.get("seeds"), lambda v: isinstance(v, list) and all(map(_is_int, v)))
    for key, value in table.items():
        if key in ("overrides", "bases", "question_subsets") and value is not None:
            _checked(table_json, key, value, lambda v: isinstance(v, dict))
    subsets = table.get("question_subsets") or {}
    for name, kept in subsets.items():
        _checked(table_json, f"question_subsets.{name}", kept,
                 lambda v: isinstance(v, dict) and {"about", "questions"} <= v.keys())
    for path, rows, row_keys in ((paths[0], records, {"run": _is_name, "final": _is_bool}),
                                 (paths[1], metrics, {"run": _is_name}),
                                 (paths[2], runs, {"run": _is_name, "record": _is_run_record})):
        for lineno, row in enumerate(rows, 1):
            for key, ok in row_keys.items():
                if not ok(row.get(key)):
                    raise ValueError(f"{path}, row {lineno}: {key!r} is missing or not {_KINDS[ok]} "
                                     f"(got {_quote(row.get(key))}); not an archive of this table")
    mine_of: dict[str, list[dict[str, Any]]] = {}
    metrics_of: dict[str, list[dict[str, Any]]] = {}
    for of, rows in ((mine_of, records), (metrics_of, metrics)):
        for r in rows:
            of.setdefault(r["run"], []).append(r)
    archived = {r["run"] for r in runs}
    complete = {s for s in seeds if all(run_name(s, v) in archived for v in planned)}
    # every name checked before anything is written: a hostile row refuses the whole restore
    placed = []
    for lineno, row in enumerate(runs, 1):
        run_dir = contained(out, row["run"], source=f"{paths[2]}, row {lineno}")
        final = contained(run_dir, row["record"]["final_validation"], source=f"{paths[2]}, row {lineno}")
        placed.append((row, run_dir, final))
    restored = []
    for row, run_dir, final in placed:
        record = row["record"]
        if (run_dir / RUN_FILE).exists() or (record["variant"] == TEACHER and record["seed"] not in complete):
            continue
        mine = mine_of.get(row["run"], [])
        files = {validation_path(run_dir, 0): [r for r in mine if not r["final"]],
                 final: [r for r in mine if r["final"]]}
        files[run_dir / "metrics.jsonl"] = metrics_of.get(row["run"], [])
        for path, rows in files.items():  # each row as the run wrote it, without what the archive added
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps({k: v for k, v in r.items() if k not in RECORD_KEYS},
                                               ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        if row.get("skip_probability") is not None:
            (run_dir / SKIP_FILE).write_text(json.dumps(row["skip_probability"], indent=2), encoding="utf-8")
        (run_dir / RUN_FILE).write_text(json.dumps(record, indent=2), encoding="utf-8")  # last: the run is done
        restored.append(row["run"])
    subsets_file = contained(out, QUESTION_SUBSETS_FILE)
    if restored and subsets and not subsets_file.exists():
        subsets_file.write_text(json.dumps({name: {"about": kept["about"], "questions": kept["questions"]}
                                            for name, kept in subsets.items()}, indent=1) + "\n", encoding="utf-8")
    plan = contained(out, "ablation.json")
    if restored and not plan.exists():
        plan.write_text(json.dumps({"preset": table.get("preset"), "seeds": table["seeds"],
                                    "base_seeds": table.get("base_seeds"), "variants": planned,
                                    "overrides": table.get("overrides", {}), "bases": table.get("bases", {}),
                                    "runs": {}, "restored_from": str(table_json)}, indent=2), encoding="utf-8")
    return restored


def _read_table(table_json: Path) -> dict[str, Any]:
    """A ``table2.json`` read under :data:`MAX_TABLE_BYTES`, a JSON object naming its three
    archives; ValueError in one line naming it otherwise."""
    try:
        if not table_json.is_file():
            raise OSError("not a file")
        if table_json.stat().st_size > MAX_TABLE_BYTES:
            raise ValueError(f"larger than {MAX_TABLE_BYTES >> 20} MiB")
        table = loads(read_capped(table_json, MAX_TABLE_BYTES).decode("utf-8"))
        if not isinstance(table, dict):
            raise TypeError(f"a JSON {type(table).__name__}, not an object")
        for key in ("records", "metrics", "run_records"):
            if not isinstance(table.get(key), str):
                raise KeyError(f"{key!r} missing or not a file name")
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else _first_line(err)
        raise ValueError(f"{table_json}: not a table2.json with its archives ({type(err).__name__}: {why})") from None
    return table


def _first_line(err: BaseException) -> str:
    return terminal_safe(str(err).strip().split("\n")[0][:200], one_line=True)


def _quote(value: Any) -> str:
    """``value`` as a message may show it: ``repr``, cut, and terminal-safe (escape codes written
    out, never sent)."""
    return terminal_safe(f"{value!r:.120}", one_line=True)


def _checked(source: Path, key: str, value: Any, ok: Any) -> Any:
    if not ok(value):
        raise ValueError(f"{source}: {key!r} is missing or malformed (got {_quote(value)}); "
                         "not a table2.json with its archives")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_name(value: Any) -> bool:
    """A run or variant name: a non-empty string a terminal shows as it is (no control
    character, no escape code: the restored names are printed)."""
    return isinstance(value, str) and 0 < len(value) <= 200 and terminal_safe(value, one_line=True) == value


def _is_run_record(value: Any) -> bool:
    return (isinstance(value, dict) and _is_name(value.get("variant")) and _is_int(value.get("seed"))
            and isinstance(value.get("final_validation"), str))


_KINDS = {_is_name: "a plain name", _is_bool: "true or false",
          _is_run_record: "a run record with its variant, seed and final_validation"}


PUBLISHED_CURVES = "table2_curves.png"
"""The name a published table's curves take beside the other pages' figures in ``docs/``."""


def publish_table(out: str | Path, dest: str | Path) -> list[Path]:
    """Copy the table written in ``out`` into ``dest`` as ``docs/`` keeps it (the curves as
    :data:`PUBLISHED_CURVES`); returns the files written. Raises ValueError naming a file
    that is missing."""
    out, dest = Path(out), Path(dest)
    try:
        table = _read_table(out / "table2.json")
        if not isinstance(table.get("curves_png"), str):
            raise KeyError("'curves_png' missing or not a file name")
        sources = {table[key]: table[key] for key in ("records", "metrics", "run_records")}
        sources[table["curves_png"]] = PUBLISHED_CURVES
        copies = {name: contained(out, name, source=out / "table2.json").read_bytes() for name in sources}
        targets = {name: contained(dest, sources[name], source=out / "table2.json") for name in sources}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{out}: no written table with its archives and curves to publish "
                         f"({type(err).__name__}: {_first_line(err)})") from None
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in copies.items():
        targets[name].write_bytes(data)
    table["curves_png"] = PUBLISHED_CURVES
    (dest / "table2.json").write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    return [dest / "table2.json", *targets.values()]
