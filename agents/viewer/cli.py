"""``python -m agents view``: write the page of an episode (or two side by side), print its
path, and optionally serve it on 127.0.0.1 for a browser on the same machine."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agents.viewer.page import render_page
from agents.viewer.records import (
    EpisodeValues,
    ViewError,
    check_tokenizer,
    pick,
    read_records,
    tokenizer_fingerprint,
)
from envs.episode import Episode
from envs.terminal import first_line, terminal_safe


def add_view_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``view`` subcommand on an argparse ``add_subparsers()`` object."""
    v = sub.add_parser("view", help="write one self-contained HTML page of an episode, token by token")
    v.add_argument("file", help="episodes JSONL (play --save) or a training sample (<run>/samples/step_NNNNNN.jsonl)")
    v.add_argument("--index", type=int, default=0, help="which episode of FILE (default 0; -1: the last)")
    v.add_argument("--compare", default=None, metavar="FILE2",
                   help="show a second episode of the same question side by side (FILE2 may be FILE)")
    v.add_argument("--compare-index", type=int, default=None,
                   help="its index in FILE2 (default: the first other episode on the same question)")
    v.add_argument("--out", default=None, help="where to write the page (default: next to FILE, FILE.N.html)")
    v.add_argument("--tokenizer", default=None,
                   help="the tokenizer the episodes were played with (default: the one a sample, or a benchmark "
                        "run's summary.json, records; else smollm2)")
    v.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 until Ctrl-C")
    v.add_argument("--port", type=int, default=0, help="port for --serve (default: any free one)")
    return v


RUN_SUMMARY = "summary.json"
"""A benchmark run's summary, beside its ``episodes.jsonl``: ``meta.tokenizer`` is the
record (:func:`agents.viewer.records.tokenizer_record`) of the tokenizer it played with."""


def recorded_tokenizer(values: EpisodeValues | None, file: str | Path) -> dict[str, Any]:
    """The tokenizer record an episode of ``file`` names: a sample's own, else the one in the
    ``summary.json`` of the benchmark run ``file`` belongs to, else {} (nothing recorded)."""
    if values is not None and values.tokenizer:
        return dict(values.tokenizer)
    summary = Path(file).with_name(RUN_SUMMARY)
    try:
        meta = json.loads(summary.read_text(encoding="utf-8")).get("meta", {})
        record = meta.get("tokenizer") if isinstance(meta, dict) else None
    except (OSError, ValueError, AttributeError):  # no run summary there, or not one: nothing recorded
        return {}
    ok = isinstance(record, dict) and all(isinstance(record.get(k), str) for k in ("name", "fingerprint"))
    return dict(record) if ok else {}


def _load_tokenizer(name: str | None, recorded: dict[str, Any], file: str | Path) -> Any:
    """``--tokenizer`` when given; else the recorded tokenizer (:func:`recorded_tokenizer`)
    when it loads and is the one recorded (same fingerprint), else SmolLM2's when nothing is
    recorded or it is the recorded one (``check_tokenizer`` then judges it). A recorded
    tokenizer that cannot be loaded is a one-line :class:`ViewError` asking for ``--tokenizer``."""
    from envs.tokenizer import load_tokenizer

    if name is not None:
        try:
            return load_tokenizer(name)
        except Exception as err:  # noqa: BLE001  (any loader failure is one line for the user)
            raise ViewError(f"cannot load --tokenizer {name}: {first_line(err)}") from None
    wanted, fingerprint = recorded.get("name") or "", recorded.get("fingerprint")
    loaded, failure = None, None
    candidates = [wanted] if wanted else []
    if wanted and not Path(wanted).is_absolute() and not Path(wanted).exists():
        # a relative folder, recorded before names were made absolute: under a folder above file
        candidates += [str(parent / wanted) for parent in Path(file).resolve().parents
                       if (parent / wanted).is_dir()]
    for candidate in candidates:
        try:
            tokenizer = load_tokenizer(candidate)
        except Exception as err:  # noqa: BLE001  (moved or deleted since: the default may be it)
            local = (Path(candidate).is_absolute() or candidate.startswith(".")
                     or candidate.count("/") > 1)
            gone = local and not Path(candidate).exists()
            failure = failure or (f"no such folder: {candidate}" if gone else first_line(err))
            continue
        if not fingerprint or tokenizer_fingerprint(tokenizer) == fingerprint:
            return tokenizer
        loaded = loaded or tokenizer
    try:
        default = load_tokenizer(None)
    except Exception as err:  # noqa: BLE001
        default, failure = None, failure or first_line(err)
    if default is not None and (not fingerprint or tokenizer_fingerprint(default) == fingerprint):
        return default
    if loaded is not None:  # the recorded name loads another vocabulary now: check_tokenizer says so
        return loaded
    if wanted:
        raise ViewError(f"{file}: cannot load the recorded tokenizer {wanted}; pass --tokenizer ({failure})")
    if default is None:
        raise ViewError(f"cannot load a tokenizer for {file} ({failure}); pass the one the "
                        "episode was played with as --tokenizer")
    return default


def _same_question(a: Episode, b: Episode) -> bool:
    return a.question.get("question") == b.question.get("question")


def write_page(file: str | Path, index: int = 0, *, out: str | Path | None = None, compare: str | Path | None = None,
               compare_index: int | None = None, tokenizer: Any = None) -> Path:
    """Write the page of episode ``index`` of ``file`` (with ``compare``: beside an episode of
    the same question from that file) and return its path. ``tokenizer``: a tokenizer object,
    a name or path for ``envs.tokenizer.load_tokenizer``, or None (the one a sample or the
    benchmark run's ``summary.json`` names, else SmolLM2's). Bad input raises
    :class:`ViewError` with a one-line message."""
    records = read_records(file)
    ep, values = pick(records, index, file)
    index = index % len(records)
    shown: list[tuple[Episode, EpisodeValues | None, str]] = [(ep, values, f"{Path(file).name} #{index}")]
    if compare is not None:
        same_file = Path(compare).resolve() == Path(file).resolve()
        others = records if same_file else read_records(compare)
        if compare_index is None:
            compare_index = next((i for i, (other, _) in enumerate(others)
                                  if _same_question(other, ep) and not (same_file and i == index)), None)
            if compare_index is None:
                raise ViewError(f"{compare} holds no other episode on the question "
                                f"{ep.question.get('question', '')!r}; pass --compare-index")
        ep2, values2 = pick(others, compare_index, compare)
        if not _same_question(ep, ep2):
            raise ViewError(f"{compare} #{compare_index} is on another question ({ep2.question.get('question')!r}) "
                            f"than {file} #{index} ({ep.question.get('question')!r}): side by side needs the same one")
        shown.append((ep2, values2, f"{Path(compare).name} #{compare_index % len(others)}"))
    records_of = [recorded_tokenizer(v, f) for (_, v, _), f in zip(shown, (file, compare))]
    if tokenizer is None or isinstance(tokenizer, str):
        tokenizer = _load_tokenizer(tokenizer, records_of[0], file)
    places = [f"{file} #{index}", f"{compare} #{compare_index}"]
    for (e, v, _), where, recorded in zip(shown, places, records_of):
        check_tokenizer(e, v, tokenizer, where, recorded)
    page = render_page(shown, tokenizer)
    path = Path(out) if out is not None else Path(file).with_name(f"{Path(file).stem}.{index}.html")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def make_server(path: str | Path, port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 that answers ``/`` (and ``/<page name>``) with the page
    and 404 otherwise; the caller runs ``serve_forever()``."""
    path = Path(path)
    page = path.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802  (the http.server API)
            if self.path.split("?")[0] not in ("/", f"/{path.name}"):
                self.send_error(404, "the viewer serves one page, at /")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # the terminal shows the page's address, not every request

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def view(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    """The ``view`` command: 0 on success; 2 with one line on stderr on bad input."""
    try:
        path = write_page(args.file, args.index, out=args.out, compare=args.compare,
                          compare_index=args.compare_index, tokenizer=args.tokenizer)
    except ViewError as err:  # its message may quote the file's text: escape sequences shown, not obeyed
        print(f"python -m agents view: {terminal_safe(str(err), one_line=True)}", file=sys.stderr)
        return 2
    out(str(path))
    if args.serve:
        server = make_server(path, args.port)
        out(f"serving it at http://127.0.0.1:{server.server_port}/ (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0
