"""Command line for retrieval.

python -m envs.retrieval serve --corpus wiki.jsonl [--index-file e5_Flat.index] [--port 8000] ...
python -m envs.retrieval search --corpus wiki.jsonl [--topk 3] "who wrote hamlet" ...
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from envs.retrieval.dense import INDEX_KINDS, POOLINGS, DenseRetriever
from envs.retrieval.server import RetrievalServer
from envs.terminal import safe_print


def _add_retriever_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", required=True,
                   help="JSONL(.gz) corpus, rows {id, contents} (the synthetic world's: python -m "
                        "envs data synth --out data/synth writes data/synth/corpus.jsonl)")
    p.add_argument("--index", default="flat", choices=INDEX_KINDS,
                   help="the index to build from the encoded corpus (not with --index-file)")
    p.add_argument("--index-file", default=None,
                   help="a prebuilt faiss index over the corpus (e.g. Search-R1's e5_Flat.index); "
                        "nothing is encoded and the corpus is read lazily")
    p.add_argument("--no-mmap", dest="mmap_index", action="store_false",
                   help="read --index-file into memory instead of memory-mapping it")
    p.add_argument("--lazy", action="store_true", default=None,
                   help="read the corpus lazily by byte offset (plain .jsonl); implied by "
                        "--index-file")
    p.add_argument("--pooling", default="auto", choices=POOLINGS,
                   help="encoder pooling: auto = Search-R1's mean pooling for e5 models, the "
                        "model's own otherwise")
    p.add_argument("--encoder", default=None,
                   help="sentence-transformers id or path (default: bundled all-MiniLM-L6-v2)")
    p.add_argument("--device", default="cpu",
                   help="torch device of the encoder, e.g. cuda:0 (default cpu)")
    p.add_argument("--cache-dir", default=None,
                   help="embedding/index cache (default: $MOPD_CACHE/retrieval)")
    p.add_argument("--batch-size", type=int, default=64, help="encoder batch size")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no line and no bar while the corpus is encoded")


def _build(args: argparse.Namespace) -> DenseRetriever:
    start = time.perf_counter()
    retriever = DenseRetriever(args.corpus, **{key: getattr(args, key) for key in (
        "encoder", "index", "cache_dir", "batch_size", "device", "index_file", "mmap_index", "lazy",
        "pooling", "progress")})
    if retriever.index_kind == "file":
        how, where = f"read from {args.index_file}", args.index_file
    else:
        how = "loaded from cache" if retriever.loaded_from_cache else "built"
        where = retriever.cache_path
    print(f"{len(retriever)} passages, {retriever.index_kind} index {how} in "
          f"{time.perf_counter() - start:.1f} s ({where})", file=sys.stderr)
    return retriever


_SERVER_OPTIONS = (  # (RetrievalServer setting, flag, type, default, help)
    ("max_batch", "--max-batch", int, None, "most queries per encoder batch (default 4 on a CPU "
     "encoder, which keeps small requests fast beside big ones; 64 on a GPU)"),
    ("batch_wait_s", "--batch-wait-ms", float, 3.0, "how long a batch waits for more requests"),
    ("max_topk", "--max-topk", int, 100, "largest topk accepted"),
    ("max_queries", "--max-queries", int, 1024, "most queries per request"),
    ("max_waiting_queries", "--max-waiting-queries", int, 8192, "most queries waiting for the "
     "encoder, all requests together (503 with Retry-After above)"),
    ("max_body_bytes", "--max-body-bytes", int, 1 << 20, "largest request body (413 above)"),
    ("max_query_chars", "--max-query-chars", int, 4096, "longest query in characters (413 above)"),
    ("keep_alive_s", "--keep-alive", float, 5.0, "seconds before a silent connection is closed"),
    ("request_timeout_s", "--request-timeout", float, 300.0,
     "seconds a request waits for the retriever before a 503"),
)
_FLAGS = {setting: flag for setting, flag, *_ in _SERVER_OPTIONS} | {"default_topk": "--topk"}


def add_server_args(p: argparse._ActionsContainer) -> None:
    """The retrieval server's batching and limits (:class:`RetrievalServer`'s settings but
    the address and ``--topk``), for ``serve`` and for the server that
    ``python -m benchmarks.retrieval_load`` starts; :func:`server_settings` reads them.
    ``p``: a parser or an argument group."""
    for _, flag, kind, default, help in _SERVER_OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=help)


def server_settings(args: argparse.Namespace, device: str = "cpu", **fixed: object) -> dict:
    """:class:`RetrievalServer` keyword arguments from the options of :func:`add_server_args`
    (``device``: the encoder's, which sets the default ``--max-batch``) and ``fixed``
    (``host``, ``port``, ``default_topk``). Checked now, before a corpus is loaded: a value
    the server refuses is a ValueError that names its option."""
    settings = {**fixed, **{setting: getattr(args, flag[2:].replace("-", "_"))
                            for setting, flag, *_ in _SERVER_OPTIONS}}
    if settings["max_batch"] is None:
        settings["max_batch"] = 4 if device == "cpu" else 64
    settings["batch_wait_s"] /= 1000  # the flag is in milliseconds
    try:
        RetrievalServer(None, **settings)  # no retriever yet: only the settings are checked
    except ValueError as e:
        setting = str(e).split(": ", 1)[-1].split("=", 1)[0]
        flag = _FLAGS.get(setting)
        raise ValueError(f"{e} (set by {flag})" if flag else str(e)) from None
    return settings


def main(argv: list[str] | None = None) -> int:
    from envs.__main__ import add_version

    parser = argparse.ArgumentParser(prog="python -m envs.retrieval",
                                     description=__doc__.split("\n")[0])
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve a corpus over Search-R1's HTTP protocol")
    _add_retriever_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    serve.add_argument("--port", type=int, default=8000,
                       help="TCP port to listen on (default 8000; 0: any free one)")
    serve.add_argument("--topk", type=int, default=3,
                       help="topk when a request gives none or 0 (Search-R1's --topk)")
    add_server_args(serve)

    search = sub.add_parser("search", help="print the top passages for some queries")
    _add_retriever_args(search)
    search.add_argument("--topk", type=int, default=3,
                        help="passages printed per query (default 3)")
    search.add_argument("queries", nargs="+", help="one or more queries (quote each one)")

    args = parser.parse_args(argv)
    if args.command == "serve":
        try:  # refuse bad limits before the corpus is loaded and encoded
            settings = server_settings(args, args.device, host=args.host, port=args.port,
                                       default_topk=args.topk)
        except ValueError as e:
            parser.error(str(e))
    if args.command == "search" and args.topk < 1:  # before the corpus is loaded and encoded
        print(f"{parser.prog}: error: --topk {args.topk}: must be >= 1", file=sys.stderr)
        return 2
    try:
        retriever = _build(args)
    except (ValueError, OSError) as e:  # a bad corpus, index (file) or encoder: one line
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    if args.command == "search":
        hits_of = retriever.search(args.queries, top_k=args.topk)
        for query, hits in zip(args.queries, hits_of, strict=True):
            safe_print(f"# {query}")  # queries and passages may hold escape sequences
            for p in hits:
                safe_print(f"{p.score:.4f}  [{p.id}] {p.title}: {p.text[:100]}")
        return 0

    retriever.search(["warm up"])  # load the encoder now, not on the first request
    server = RetrievalServer(retriever, **settings)
    server.start()
    print(f"serving on {server.url} (Ctrl-C stops)", file=sys.stderr)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
