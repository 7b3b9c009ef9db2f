"""Issue 44.1 and 44.3: ``python -m benchmarks table2 --restore`` on a table someone else
published. Every name an archive gives (run names, the final validation's file, the archives'
own names) stays inside its folder or the restore is refused before anything is written; a
malformed archive (missing keys, wrong types, a line past the stated limit, run names with
escape codes) is one line, never a KeyError or MemoryError traceback, and never echoes an
escape code to the terminal."""

from __future__ import annotations

import gzip
import json

import pytest
from test_ablate import fake_ablation  # noqa: F401 (a fixture)

from benchmarks.table2.archive import (
    MAX_LINE_BYTES,
    RECORDS_FILE,
    RUNS_FILE,
    publish_table,
    restore_runs,
    write_gzip_jsonl,
)
from benchmarks.table2.render import write_table2


@pytest.fixture
def table(fake_ablation):  # noqa: F811
    """A written table2.json beside its archives."""
    write_table2(fake_ablation, n_resamples=50)
    return fake_ablation / "table2.json"


def _rows(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _edit_rows(path, change):
    rows = _rows(path)
    change(rows)
    write_gzip_jsonl(path, rows)


def _edit_table(table, change):
    data = json.loads(table.read_text())
    change(data)
    table.write_text(json.dumps(data))


def _refused(table, out, match):
    with pytest.raises(ValueError, match=match) as info:
        restore_runs(table, out)
    text = str(info.value)
    assert "\n" not in text and "\x1b" not in text and "\x07" not in text
    return text


def _files_under(path):
    return sorted(p for p in path.rglob("*")) if path.exists() else []


@pytest.mark.parametrize("run", ["../../escaped", "/ABS/escaped", "seed0/../../escaped", "."])
def test_a_run_name_leading_outside_out_is_refused_before_anything_is_written(table, tmp_path, run):
    run = run.replace("/ABS", str(tmp_path))
    _edit_rows(table.parent / RUNS_FILE, lambda rows: rows[-1].update(run=run))
    out = tmp_path / "deep" / "out"
    text = _refused(table, out, "refusing the name")
    assert RUNS_FILE in text and repr(run) in text
    assert not (tmp_path / "escaped").exists() and _files_under(out) == []


def test_a_final_validation_leading_outside_its_run_is_refused(table, tmp_path):
    _edit_rows(table.parent / RUNS_FILE, lambda rows: rows[0]["record"].update(final_validation="../../../../pwned"))
    out = tmp_path / "a" / "b" / "out"
    _refused(table, out, "refusing the name '../../../../pwned'")
    assert not (tmp_path / "pwned").exists() and _files_under(out) == []


def test_a_run_folder_planted_as_a_link_out_is_refused(table, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "seed0").symlink_to(victim)
    _refused(table, out, "symbolic link")
    assert list(victim.iterdir()) == []


@pytest.mark.parametrize("key", ["records", "metrics", "run_records"])
def test_an_archive_name_leading_outside_the_tables_folder_is_refused(table, tmp_path, key):
    outside = tmp_path / "elsewhere.gz"
    write_gzip_jsonl(outside, [])
    _edit_table(table, lambda t: t.update({key: "../elsewhere.gz"}))
    _refused(table, tmp_path / "out", "refusing the name '../elsewhere.gz'")


def test_publish_never_writes_outside_its_destination(table, tmp_path):
    _edit_table(table, lambda t: t.update(records="../../../outside.gz"))
    with pytest.raises(ValueError, match="refusing the name") as info:
        publish_table(table.parent, tmp_path / "docs")
    assert "\n" not in str(info.value) and not (tmp_path / "outside.gz").exists()


@pytest.mark.parametrize("where, change, match", [
    ("runs", lambda rows: rows[0].pop("record"), "'record' is missing or not a run record"),
    ("runs", lambda rows: rows[0].pop("run"), "'run' is missing or not a plain name"),
    ("runs", lambda rows: rows[0]["record"].pop("variant"), "'record' is missing"),
    ("runs", lambda rows: rows[0]["record"].update(seed="zero"), "'record' is missing"),
    ("runs", lambda rows: rows[0]["record"].pop("final_validation"), "'record' is missing"),
    ("runs", lambda rows: rows[0].update(record=[1, 2]), "'record' is missing"),
    ("runs", lambda rows: rows.__setitem__(0, [1, 2]), "a row must be a JSON object"),
    ("runs", lambda rows: rows[0].update(run=["seed0", "opd"]), "'run' is missing or not a plain name"),
    ("records", lambda rows: rows[0].pop("final"), "'final' is missing or not true or false"),
    ("records", lambda rows: rows[0].update(run=None), "'run' is missing"),
    ("table", lambda t: t.pop("seeds"), "'seeds' is missing or malformed"),
    ("table", lambda t: t.update(seeds="0,1"), "'seeds' is missing or malformed"),
    ("table", lambda t: t.update(seeds=[0, "1"]), "'seeds' is missing or malformed"),
    ("table", lambda t: (t.pop("planned_variants"), t.pop("variants")), "'planned_variants' is missing"),
    ("table", lambda t: t.update(planned_variants={"opd": 1}), "'planned_variants' is missing"),
    ("table", lambda t: t.update(question_subsets={"x": {"about": "y"}}), "'question_subsets.x' is missing"),
    ("table", lambda t: t.update(records=["x"]), "not a table2.json"),
])
def test_a_malformed_archive_is_one_line_not_a_traceback(table, tmp_path, where, change, match):
    if where == "table":
        _edit_table(table, change)
    else:
        _edit_rows(table.parent / (RUNS_FILE if where == "runs" else RECORDS_FILE), change)
    _refused(table, tmp_path / "out", match)
    assert _files_under(tmp_path / "out") == []


def test_a_line_past_the_limit_is_refused_after_reading_the_limit(table, tmp_path):
    rows = _rows(table.parent / RUNS_FILE)
    rows[1]["padding"] = "x" * MAX_LINE_BYTES  # one line, a little past the limit
    write_gzip_jsonl(table.parent / RUNS_FILE, rows)
    text = _refused(table, tmp_path / "out", f"line 2: longer than {MAX_LINE_BYTES:,} bytes")
    assert RUNS_FILE in text


def test_a_line_past_the_limit_is_never_read_whole(table, tmp_path):
    """A 2 GB line is refused after about the limit: a 64 MiB one is refused with a peak of
    Python memory far below its size (it compresses to a few KB)."""
    import tracemalloc

    import algos.trainer  # noqa: F401 (what restore_runs imports is not what it reads)
    import envs.data.items  # noqa: F401

    with gzip.GzipFile(table.parent / RECORDS_FILE, "wb", compresslevel=9) as f:
        for _ in range(64):
            f.write(b"x" * (1 << 20))
    tracemalloc.start()
    try:
        _refused(table, tmp_path / "out", f"line 1: longer than {MAX_LINE_BYTES:,} bytes")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * MAX_LINE_BYTES


def test_a_cut_archive_is_one_line(table, tmp_path):
    path = table.parent / RECORDS_FILE
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _refused(table, tmp_path / "out", "cut or damaged")


@pytest.mark.parametrize("run", ["seed0/opd\x1b]52;c;ZXZpbA==\x07", "seed0/\x1b[2Jopd", "seed0/op\u202ed",
                                 "seed0/opd\r\nrestored 99 runs"])
def test_a_run_name_with_escape_codes_is_refused_quoted(table, tmp_path, run):
    _edit_rows(table.parent / RUNS_FILE, lambda rows: rows[0].update(run=run))
    _refused(table, tmp_path / "out", "'run' is missing or not a plain name")


def test_the_command_prints_escape_codes_quoted_in_one_line(table, tmp_path, capsys):
    from benchmarks.__main__ import main

    _edit_rows(table.parent / RUNS_FILE, lambda rows: rows[0].update(run="seed0/\x1b]52;c;ZXZpbA==\x07"))
    with pytest.raises(SystemExit) as info:
        main(["table2", "--restore", str(table), str(tmp_path / "out"), "--resamples", "50"])
    message = str(info.value.code)
    assert message.startswith("python -m benchmarks table2: error: ") and "\n" not in message
    assert "\x1b" not in message and "\\x1b]52" in message
    assert "\x1b" not in capsys.readouterr().out


@pytest.mark.parametrize("record", [{"run": "seed0/opd", "final_validation": "../../../etc/passwd"},
                                    {"run": "seed0/opd", "final_validation": "/etc/passwd"},
                                    {"run": "../elsewhere", "final_validation": "validation.jsonl"}])
def test_a_run_record_naming_files_outside_the_ablation_is_refused(tmp_path, record):
    """A ``run.json`` planted in an ablation folder (not only a restored one) names its
    validation records inside its own run folder, or the table refuses it in one line."""
    from benchmarks.table2.table import validation_records

    (tmp_path / "seed0" / "opd").mkdir(parents=True)
    with pytest.raises(ValueError, match="refusing the name .* must stay inside"):
        validation_records(tmp_path, record)
