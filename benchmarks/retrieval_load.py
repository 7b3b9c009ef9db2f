"""Load test of the retrieval server: many threads sending Search-R1 requests at once.

    python -m benchmarks.retrieval_load                  # serve the synthetic world, load it
    python -m benchmarks.retrieval_load --url http://127.0.0.1:8000/retrieve   # an external server
    python -m benchmarks.retrieval_load --fairness       # one small client beside six greedy ones

Prints requests/s, latency percentiles and (for our server) the mean queries per encoder
batch; ``--fairness`` prints the ratio of the one-query client's p99 beside ``--greedy``
maximal clients (1,024 queries, topk 100) to its p99 alone. docs/retrieval_server.md has the
figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class LoadReport:
    """What one load run measured."""

    sent: int
    ok: int
    errors: list[str] = field(default_factory=list)
    """The first few error messages (at most 10), for the report."""
    error_count: int = 0
    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list)

    @property
    def requests_per_s(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def latency_ms(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        s = sorted(self.latencies_s)
        return 1000 * s[min(len(s) - 1, int(q * len(s)))]


def run_load(url: str, queries: Sequence[str], requests: int = 2000, threads: int = 16,
             topk: int = 3, queries_per_request: int = 1, time_limit_s: float = 60.0,
             timeout_s: float = 30.0) -> LoadReport:
    """Send up to ``requests`` POSTs to ``url`` from ``threads`` threads, stopping early at
    ``time_limit_s``; each request carries ``queries_per_request`` queries cycled from
    ``queries``. A request counts as ok when it gets 200 and one result list per query."""
    counter = itertools.count()
    lock = threading.Lock()
    report = LoadReport(sent=0, ok=0)
    start = time.perf_counter()
    deadline = start + time_limit_s

    def worker() -> None:
        while time.perf_counter() < deadline and (i := next(counter)) < requests:
            batch = [queries[(i * queries_per_request + j) % len(queries)]
                     for j in range(queries_per_request)]
            t0 = time.perf_counter()
            error = None
            try:
                payload = {"queries": batch, "topk": topk, "return_scores": True}
                result = json.loads(_post(url, payload, timeout_s))["result"]
                if len(result) != len(batch) or any(len(hits) == 0 for hits in result):
                    error = f"bad answer shape for request {i}"
            except Exception as e:  # count everything a client would see as a failure
                error = f"{type(e).__name__}: {e}"
            latency = time.perf_counter() - t0
            with lock:
                report.sent += 1
                if error is None:
                    report.ok += 1
                    report.latencies_s.append(latency)
                else:
                    report.error_count += 1
                    if len(report.errors) < 10:
                        report.errors.append(error)

    pool = [threading.Thread(target=worker, name=f"load-{t}") for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    report.seconds = time.perf_counter() - start
    return report


@dataclass
class FairnessReport:
    """A one-query client's latencies alone and beside greedy clients."""

    alone: LoadReport
    beside: LoadReport
    greedy_requests: int = 0
    """Greedy requests answered while the small client ran."""
    greedy_errors: list[str] = field(default_factory=list)


def _post(url: str, payload: dict, timeout_s: float) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.read()


def run_fairness(url: str, queries: Sequence[str], greedy: int = 6, greedy_queries: int = 1024,
                 greedy_topk: int = 100, small_requests: int = 100, small_topk: int = 3,
                 time_limit_s: float = 60.0, settle_s: float = 2.0) -> FairnessReport:
    """A one-query client's latencies alone (``small_requests`` requests, one at a time), then
    beside ``greedy`` threads sending ``greedy_queries`` queries at ``greedy_topk`` back to
    back (their answers read, not parsed). A greedy request still waiting at the end is
    abandoned: stop the server after this returns."""

    def small_client() -> LoadReport:  # one client sending one-query requests one after another
        return run_load(url, queries, small_requests, threads=1, topk=small_topk,
                        time_limit_s=time_limit_s, timeout_s=300)

    alone = small_client()
    stop = threading.Event()
    lock = threading.Lock()
    done: list[int] = [0]
    errors: list[str] = []

    def greedy_client(g: int) -> None:
        n = 0
        while not stop.is_set():
            batch = [queries[(g * 7919 + n * greedy_queries + j) % len(queries)]
                     for j in range(greedy_queries)]
            n += 1
            try:
                raw = _post(url, {"queries": batch, "topk": greedy_topk, "return_scores": True},
                            time_limit_s + 60)
                ok = raw.startswith(b'{"result":[')
            except Exception as e:
                ok = False
                if not stop.is_set():
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")
            with lock:
                done[0] += ok and not stop.is_set()
            if not ok:
                return

    pool = [threading.Thread(target=greedy_client, args=(g,), daemon=True) for g in range(greedy)]
    for t in pool:
        t.start()
    time.sleep(settle_s)
    beside = small_client()
    stop.set()
    return FairnessReport(alone, beside, done[0], errors[:10])


def _health(url: str) -> dict:
    health_url = url.rsplit("/", 1)[0] + "/health"
    try:
        with urllib.request.urlopen(health_url, timeout=5) as resp:
            return json.loads(resp.read())
    except Exception:
        return {}


def _refuse(reason: str) -> int:
    """One line on stderr for a bad setting, before any server starts; exit status 2."""
    print(f"python -m benchmarks.retrieval_load: error: {reason}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="load this server instead of starting one")
    parser.add_argument("--corpus", default=None,
                        help="JSONL corpus (default: the synthetic world)")
    parser.add_argument("--index", default="flat", choices=("flat", "hnsw", "ivf"), help="index of "
                        "the server this command starts (default flat; not with --url)")
    parser.add_argument("--requests", type=int, default=2000,
                        help="requests to send in all (default 2000)")
    parser.add_argument("--threads", type=int, default=16, help="client threads sending requests "
                        "at once, each one at a time (default 16)")
    parser.add_argument("--topk", type=int, default=3,
                        help="passages asked for per query (default 3)")
    parser.add_argument("--queries-per-request", type=int, default=1,
                        help="queries in each request (default 1)")
    parser.add_argument("--time-limit", type=float, default=45.0,
                        help="seconds after which no new request is sent (default 45)")
    parser.add_argument("--fairness", action="store_true", help="measure a one-query client "
                        "alone and beside --greedy maximal clients instead")
    parser.add_argument("--greedy", type=int, default=6,
                        help="greedy clients for --fairness (default 6)")
    parser.add_argument("--small-requests", type=int, default=100,
                        help="one-query requests per phase of --fairness (default 100)")
    from envs.retrieval.__main__ import add_server_args, server_settings

    add_server_args(parser.add_argument_group("the server this command starts (not with --url)"))
    args = parser.parse_args(argv)
    for option in ("requests", "threads", "topk", "queries_per_request", "greedy", "small_requests"):
        if getattr(args, option) < 1:
            return _refuse(f"--{option.replace('_', '-')} {getattr(args, option)}: must be >= 1")
    if not args.time_limit > 0:
        return _refuse(f"--time-limit {args.time_limit}: must be > 0")
    try:
        settings = server_settings(args)  # a CPU encoder's defaults: --max-batch 4
    except ValueError as e:
        return _refuse(str(e))

    from envs.data.synthwiki import default_world

    world = default_world()
    queries = [q.question for qs in world.all_questions("test").values() for q in qs]
    server = None
    url = args.url
    if url is None:
        from envs.retrieval import DenseRetriever, RetrievalServer

        t0 = time.perf_counter()
        rows = None if args.corpus else world.corpus
        retriever = DenseRetriever(args.corpus or rows, index=args.index)
        how = "loaded from cache" if retriever.loaded_from_cache else "encoded"
        print(f"retriever: {len(retriever)} passages, {retriever.index_kind}, {how} in "
              f"{time.perf_counter() - t0:.1f} s")
        # A corpus file's stored rows are read from retriever.corpus_source; the world's are given.
        server = RetrievalServer(retriever, port=0, documents=rows, **settings)
        server.start()
        url = server.url
        retriever.search(queries[:1])  # warm up outside the timed run
    before = _health(url)
    try:
        if args.fairness:
            report = run_fairness(url, queries, greedy=args.greedy,
                                  small_requests=args.small_requests, time_limit_s=args.time_limit)
        else:
            report = run_load(url, queries, requests=args.requests, threads=args.threads,
                              topk=args.topk, queries_per_request=args.queries_per_request,
                              time_limit_s=args.time_limit)
    finally:
        after = _health(url)
        if server is not None:
            server.stop()
    if args.fairness:
        return _fairness(report, args, after.get("queries", 0) - before.get("queries", 0))
    print(f"{report.ok}/{args.requests} requests ok, {report.error_count} errors, {args.threads} "
          f"threads, {report.seconds:.1f} s: {report.requests_per_s:.0f} requests/s; latency p50 "
          f"{report.latency_ms(0.5):.1f} ms, p99 {report.latency_ms(0.99):.1f} ms")
    batches = after.get("batches", 0) - before.get("batches", 0)
    if batches:
        mean = (after["queries"] - before["queries"]) / batches
        print(f"mean batch: {mean:.1f} queries per search call over {batches} calls")
    for error in report.errors:
        print("error:", error)
    return 0 if report.error_count == 0 else 1


def _fairness(report: FairnessReport, args: argparse.Namespace, served: int) -> int:
    for name, r in (("alone", report.alone), (f"beside {args.greedy} greedy", report.beside)):
        print(f"one-query client {name}: {r.ok}/{r.sent} ok in {r.seconds:.1f} s; latency "
              f"p50 {r.latency_ms(0.5):.1f} ms, p99 {r.latency_ms(0.99):.1f} ms")
    print(f"greedy: {report.greedy_requests} requests of 1024 queries answered meanwhile; "
          f"{served} queries searched in all")
    ratio = report.beside.latency_ms(0.99) / report.alone.latency_ms(0.99)
    print(f"p99 ratio (beside / alone): {ratio:.1f}")
    for error in report.alone.errors + report.beside.errors + report.greedy_errors:
        print("error:", error)
    return 0 if not (report.alone.error_count or report.beside.error_count) else 1


if __name__ == "__main__":
    raise SystemExit(main())
