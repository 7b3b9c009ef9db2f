"""What a large corpus costs to load and search: a prebuilt index over a lazy corpus against
today's loader (every passage a Python object, the index built from cached embeddings).

    python -m benchmarks.retrieval_scale --passages 1000000 --workdir /tmp/mopd-scale

Writes into ``--workdir`` (never the repository) a synthetic wiki-18-like corpus, a flat index
over random unit vectors and, for the old loader, the same vectors as its embedding cache; then
runs each loader in a fresh process and prints its start-up time, resident memory and
queries/s. docs/retrieval_scale.md says what each figure covers and has the results.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

WORDS_PER_SENTENCE = 10
SENTENCES_PER_PASSAGE = 10  # ~100 words, as wiki-18's passages
SENTENCE_POOL = 20_000


def write_corpus(path: Path, n: int, seed: int = 0) -> None:
    """``n`` passages of made-up words in wiki-18's layout, deterministic for ``seed``."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, size=rng.integers(3, 10))) for _ in range(8_000)]
    pool = [" ".join(vocab[i] for i in rng.integers(0, len(vocab), WORDS_PER_SENTENCE)) + "."
            for _ in range(SENTENCE_POOL)]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for start in range(0, n, 100_000):
            picks = rng.integers(0, SENTENCE_POOL, (min(100_000, n - start), SENTENCES_PER_PASSAGE))
            for j, row in enumerate(picks):
                title = f"Passage {start + j}"
                contents = f'"{title}"\n{title} ' + " ".join(pool[i] for i in row)
                f.write(json.dumps({"id": str(start + j), "contents": contents}) + "\n")
    os.replace(tmp, path)


def random_unit_vectors(n: int, dim: int, seed: int = 1, chunk: int = 100_000):
    """Yield (rows, dim) float32 blocks of random unit vectors, ``n`` rows in all."""
    rng = np.random.default_rng(seed)
    for start in range(0, n, chunk):
        block = rng.standard_normal((min(chunk, n - start), dim), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        yield block


def prepare(workdir: Path, n: int, dim: int) -> dict[str, str]:
    """Write (or reuse) the corpus, the index file and the old loader's embedding cache."""
    import faiss

    from envs.retrieval.dense import corpus_hash, default_encoder_path, embedding_cache_key
    from envs.retrieval.passage import load_corpus

    workdir.mkdir(parents=True, exist_ok=True)
    corpus = workdir / f"corpus-{n}.jsonl"
    index_file = workdir / f"flat-{n}-{dim}.index"
    cache = workdir / "cache"
    if not corpus.is_file():
        print(f"writing {n} passages to {corpus}", file=sys.stderr)
        write_corpus(corpus, n)
    if not index_file.is_file():
        print(f"writing a flat index of {n} random {dim}-d unit vectors", file=sys.stderr)
        index = faiss.IndexFlatIP(dim)
        for block in random_unit_vectors(n, dim):
            index.add(block)
        faiss.write_index(index, str(index_file) + ".tmp")
        os.replace(str(index_file) + ".tmp", index_file)
        del index
    marker = workdir / f"old-cache-{n}-{dim}.txt"
    if not marker.is_file():
        print("seeding the old loader's embedding cache", file=sys.stderr)
        key = embedding_cache_key(corpus_hash(load_corpus(corpus)), str(default_encoder_path()), "",
                                  "model")
        target = cache / key / "embeddings.npy"
        target.parent.mkdir(parents=True, exist_ok=True)
        header = np.lib.format.open_memmap(target, mode="w+", dtype=np.float32, shape=(n, dim))
        start = 0
        for block in random_unit_vectors(n, dim):  # the same vectors as the index file
            header[start : start + len(block)] = block
            start += len(block)
        header.flush()
        del header
        marker.write_text(key)
    return {"corpus": str(corpus), "index_file": str(index_file), "cache": str(cache)}


def _proc_status() -> dict[str, int]:
    """VmRSS and VmHWM (peak) of this process, in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def measure(loader: str, files: dict[str, str], queries: int, batch: int) -> dict[str, float]:
    """Run in the child process: build the retriever ``loader`` names and time it."""
    from envs.retrieval.dense import DenseRetriever, default_encoder_path, load_encoder

    base = _proc_status()["VmRSS"]
    # the encoder is loaded before the clock starts: both loaders need it, neither owns it
    load_encoder(str(default_encoder_path()))
    with_encoder = _proc_status()["VmRSS"]
    if loader == "new-cold":  # the first start over a corpus builds its offset table
        Path(files["corpus"] + ".offsets.npy").unlink(missing_ok=True)
    start = time.perf_counter()
    if loader == "old":
        # flat: the same exact search as the index file, so only loading differs
        r = DenseRetriever(files["corpus"], index="flat", cache_dir=files["cache"])
        assert r.loaded_from_cache, "the old loader's cache was not seeded: it would encode"
    else:
        r = DenseRetriever(files["corpus"], index_file=files["index_file"],
                           mmap_index=loader in ("new-mmap", "new-cold"), cache_dir=files["cache"])
    startup_s = time.perf_counter() - start
    after_start = _proc_status()
    texts = [f"what is known about passage {i} and its words" for i in range(queries)]
    start = time.perf_counter()
    hits = 0
    for i in range(0, queries, batch):
        hits += sum(len(h) for h in r.search(texts[i : i + batch], top_k=3))
    search_s = time.perf_counter() - start
    end = _proc_status()
    mib = 1 << 20
    return {"loader": loader, "passages": len(r), "startup_s": round(startup_s, 2),
            "rss_encoder_mib": round((with_encoder - base) / mib),
            "rss_after_startup_mib": round(after_start["VmRSS"] / mib),
            "rss_end_mib": round(end["VmRSS"] / mib), "peak_rss_mib": round(end["VmHWM"] / mib),
            "queries_per_s": round(queries / search_s, 1), "hits": hits}


def run_child(loader: str, files: dict[str, str], queries: int, batch: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "benchmarks.retrieval_scale", "--child", loader,
           "--files", json.dumps(files), "--queries", str(queries), "--batch", str(batch)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the {loader} loader failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.retrieval_scale",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=int, default=1_000_000, help="corpus size")
    parser.add_argument("--workdir", default="/tmp/mopd-retrieval-scale",
                        help="where the corpus, index and caches are written (reused)")
    parser.add_argument("--dim", type=int, default=384, help="vector width (MiniLM's: 384)")
    parser.add_argument("--queries", type=int, default=256, help="queries timed per loader")
    parser.add_argument("--batch", type=int, default=64, help="queries per search call")
    parser.add_argument("--loaders", default="new-cold,new-mmap,new,old",
                        help="which to run: new-cold (memory-mapped, offset table built "
                        "first), new-mmap (memory-mapped), new (index read into memory), old")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--files", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import faiss

        faiss.omp_set_num_threads(1)
        print(json.dumps(measure(args.child, json.loads(args.files), args.queries, args.batch)))
        return 0
    if args.passages < 1 or args.queries < 1 or args.batch < 1:
        parser.error("--passages, --queries and --batch must be positive")
    files = prepare(Path(args.workdir), args.passages, args.dim)
    rows = []
    for loader in args.loaders.split(","):
        print(f"measuring {loader} ...", file=sys.stderr)
        rows.append(run_child(loader.strip(), files, args.queries, args.batch))
        print(json.dumps(rows[-1]), file=sys.stderr)
    cols = ["loader", "passages", "startup_s", "rss_after_startup_mib", "peak_rss_mib",
            "queries_per_s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in cols) + " |")
    (Path(args.workdir) / f"results-{args.passages}.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
