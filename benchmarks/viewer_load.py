"""How fast the episode viewer's page opens in a real browser (issue 20: a 10,000-token
workflow must open in under a second).

    python -m benchmarks.viewer_load                      # ~10,000 tokens, 5 runs
    python -m benchmarks.viewer_load --tokens 20000 --runs 9 --chromium /usr/bin/chromium

Opens a scripted-team workflow repeated to ``--tokens`` tokens ``--runs`` times in a fresh
headless Chromium and prints what the page measured itself (``data-ready-ms``, after a forced
layout of every token; ``data-script-ms`` before it) beside the browser process's wall time.
docs/performance.md ("Viewer") says more and has the figures.
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agents.viewer.records import EpisodeValues, SegmentValues
from envs.episode import Episode

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def repeat_episode(ep: Episode, copies: int, seed: int = 0) -> tuple[Episode, EpisodeValues]:
    """``ep`` (changed in place) with every context and its turns repeated ``copies`` times,
    and made-up per-token values on every generated token: a big workflow for load checks."""
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    rng = np.random.default_rng(seed)
    spans = []
    for s, seg in enumerate(ep.segments):
        n = len(seg.token_ids)
        mine = [(start, end) for t, start, end in ep.turn_spans if t == s]
        seg.token_ids, seg.loss_mask = seg.token_ids * copies, seg.loss_mask * copies
        spans += [[s, start + c * n, end + c * n] for c in range(copies) for start, end in mine]
    ep.turn_spans = spans
    segments = []
    for s, seg in enumerate(ep.segments):
        pos = [p for p, m in enumerate(seg.loss_mask) if m and p > 0]
        segments.append(SegmentValues(s, pos, (-rng.random(len(pos))).tolist(), (-rng.random(len(pos))).tolist(),
                                      rng.normal(size=len(pos)).tolist(), kl=seg.role != "searcher"))
    return ep, EpisodeValues("train", 1, segments=segments)


def scripted_episode(dataset: str = "hotpotqa", index: int = 0) -> Episode:
    """One scripted-team workflow on a synthetic question (the word-overlap retriever)."""
    from agents.collect import collect
    from agents.scripted import ScriptedPolicy
    from envs import env_fn
    from envs.data import load_qa
    from envs.retrieval.factory import make_retriever

    question = load_qa(dataset, "test", root="synthetic")[index]
    [[ep]] = collect(env_fn(retriever=make_retriever("words"), questions=[question]), ScriptedPolicy(), [question])
    return ep


def build_page(folder: str | Path, tokens: int = 10_000) -> tuple[Path, int]:
    """Write a sample of about ``tokens`` tokens (at least that many) and its page into
    ``folder``; returns the page's path and its token count."""
    from agents.viewer import sample_line, write_page

    ep = scripted_episode()
    one = sum(len(s.token_ids) for s in ep.segments)
    ep, values = repeat_episode(ep, max(1, math.ceil(tokens / one)))
    sample = Path(folder) / "long.jsonl"
    sample.write_text(sample_line(ep, values), encoding="utf-8")
    page = write_page(sample, 0, out=Path(folder) / "long.html")
    return page, sum(len(s.token_ids) for s in ep.segments)


def find_browser(name: str | None = None) -> str:
    """The Chromium to run: ``name`` when given, else the first of :data:`BROWSERS` on PATH."""
    found = shutil.which(name) if name else next((b for b in map(shutil.which, BROWSERS) if b), None)
    if found is None:
        wanted = name or " / ".join(BROWSERS)
        raise SystemExit(f"python -m benchmarks.viewer_load: no browser {wanted} on PATH "
                         "(Debian: apt-get install chromium; or pass --chromium PATH)")
    return found


BODY_MS = re.compile(r'<body[^>]*?\sdata-ready-ms="(\d+)"[^>]*?>')
SCRIPT_MS = re.compile(r'<body[^>]*?\sdata-script-ms="(\d+)"[^>]*?>')


def open_once(browser: str, page: Path, timeout: float = 120) -> dict[str, Any]:
    """One cold open of ``page`` in a fresh headless profile: the page's own ready and
    script times (ms) and the browser process's wall time (s)."""
    with tempfile.TemporaryDirectory(prefix="viewer-load-") as profile:
        start = time.perf_counter()
        out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              f"--user-data-dir={profile}", "--dump-dom", page.resolve().as_uri()],
                             capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - start
    ready, script = BODY_MS.search(out.stdout), SCRIPT_MS.search(out.stdout)
    if out.returncode != 0 or ready is None or script is None:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"python -m benchmarks.viewer_load: {browser} did not run the page's script "
                         f"(exit status {out.returncode}; {tail})")
    return {"ready_ms": int(ready.group(1)), "script_ms": int(script.group(1)), "wall_s": wall}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.viewer_load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=10_000, help="tokens in the workflow (default 10000)")
    parser.add_argument("--runs", type=int, default=5, help="cold opens of the page (default 5)")
    parser.add_argument("--chromium", default=None, help="the browser (default: chromium on PATH)")
    parser.add_argument("--keep", default=None, metavar="DIR", help="write the sample and page here and keep them")
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.runs < 1:
        parser.error(f"--tokens {args.tokens} and --runs {args.runs} must both be >= 1")
    browser = find_browser(args.chromium)
    with tempfile.TemporaryDirectory(prefix="viewer-page-") as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        page, tokens = build_page(folder, args.tokens)
        print(f"page: {tokens} tokens, {page.stat().st_size / 1e6:.2f} MB ({page if args.keep else 'temporary'})")
        print(f"browser: {browser}")
        runs = []
        for i in range(args.runs):
            runs.append(r := open_once(browser, page))
            print(f"  open {i + 1}: ready {r['ready_ms']} ms (script {r['script_ms']} ms), "
                  f"browser process {r['wall_s']:.2f} s", flush=True)
    ready, script, wall = ([r[key] for r in runs] for key in ("ready_ms", "script_ms", "wall_s"))
    print(f"ready ms: median {statistics.median(ready):.0f}, max {max(ready)}, min {min(ready)} "
          f"(script ms median {statistics.median(script):.0f}); browser process s: median "
          f"{statistics.median(wall):.2f}, max {max(wall):.2f}; over {len(runs)} opens of {tokens} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
