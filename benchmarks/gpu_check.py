"""GPU check of the scale-out path, for a GPU machine with the checkout and a folder of wheels
but no package index (docs/scaleout.md):

    python -m benchmarks.gpu_check --steps 3 --out runs/gpu_check

First it names each missing piece in one line (a module and its wheel, or no visible GPU) and
stops; vLLM missing only drops its backend. Then it runs the tiny preset's Stage II on CUDA
(bfloat16 over float32 weights) with ``rollout_backend=hf`` and then ``vllm``, writing
``gpu_check.json`` after each. Per backend, steps 2..N averaged: the step split (rollout /
scoring / update), the weight sync (the engine's sleep and weight push), peak memory and the
gradient norm. The headline: generated tokens per second of rollout *plus weight sync*, vLLM
over HF, beside the end-to-end step-time ratio. Imports only the standard library until the
pieces are found.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BACKENDS = ("hf", "vllm")

ROOT = Path(__file__).resolve().parents[1]
OWN = ("agents", "algos", "envs", "benchmarks", "integrations")
ENTRIES = ("benchmarks.gpu_check", "algos.commands.presets", "algos.trainer", "algos.recipes.tiny", "agents.hf",
           "envs.search_team", "envs.retrieval")
"""The modules the tiny preset's HF run loads (the env factory ``envs.make_env`` and the retriever
are imported lazily, so they are named here): what they import is what the run needs."""
OPTIONAL = {"vllm": "the vllm backend", "ray": "rollout workers"}
"""Modules that narrow the check when absent (a backend left out) instead of stopping it."""
WHEELS = {"torch": "torch (with CUDA: expected on the GPU image)", "faiss": "faiss-cpu", "yaml": "pyyaml",
          "sklearn": "scikit-learn", "PIL": "pillow"}
"""Wheels whose name is not the module's (else the module's, ``_`` as ``-``)."""


def _project_file(name: str, root: Path) -> Path | None:
    path = root / Path(*name.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def needed_modules(root: Path = ROOT, entries: tuple[str, ...] = ENTRIES) -> dict[str, str]:
    """``{top-level module: the project module that imports it}`` for every third-party module the
    run imports, read from the source (``ast``, nothing imported): the project modules that
    ``entries`` load at import time, followed through their module-level imports, and every
    import statement in them (functions' too: ``transformers`` is imported when a model loads),
    except those under ``try: ... except ImportError`` (optional by construction)."""
    import ast

    found: dict[str, str] = {}
    seen: set[str] = set()
    todo = list(entries)
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # packages load first
        path = _project_file(name, root)
        if path is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        guarded: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(
                    isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                    for h in node.handlers):
                guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))

        def loaded(nodes: list[ast.stmt]) -> None:  # import-time statements (not function bodies)
            for node in nodes:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if isinstance(node, ast.Import):
                    todo.extend(a.name for a in node.names if a.name.split(".")[0] in OWN)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                        and node.module.split(".")[0] in OWN:
                    todo.append(node.module)
                    todo.extend(f"{node.module}.{a.name}" for a in node.names)
                for attr in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, attr, None)
                    if isinstance(inner, list):
                        loaded(inner)

        loaded(tree.body)
        for node in ast.walk(tree):
            if id(node) in guarded:
                continue
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in OWN and top not in sys.stdlib_module_names and top != "__future__":
                    found.setdefault(top, name)
    return dict(sorted(found.items(), key=lambda kv: (kv[0] != "torch", kv[0].lower())))


def _normal(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _required_by(dist: str, requires_of: Callable[[str], Any]) -> list[str]:
    """The distributions ``dist`` needs (its Requires-Dist without extras, markers evaluated where
    ``packaging`` can; an unevaluable marker is skipped rather than guessed)."""
    import re

    try:
        from packaging.markers import Marker
    except ImportError:  # no packaging: requirements with markers are skipped
        Marker = None  # noqa: N806
    out = []
    for line in requires_of(dist) or []:
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if name is None:
            continue
        marker = line.split(";", 1)[1].strip() if ";" in line else ""
        if "extra" in marker:
            continue
        if marker:
            try:
                if Marker is None or not Marker(marker).evaluate():
                    continue
            except Exception:  # noqa: BLE001 (a marker packaging cannot read)
                continue
        out.append(name.group(1))
    return out


def missing_requirements(modules: list[str], version_of: Callable[[str], Any] | None = None,
                         requires_of: Callable[[str], Any] | None = None,
                         distributions_of: Callable[[str], list[str]] | None = None) -> list[tuple[str, str]]:
    """``(distribution, needed by)`` for each distribution that an installed needed module's
    distribution requires, directly or further down, and that is not installed (fastapi 0.165
    imports ``opentelemetry``: its wheel installed ``--no-deps`` alone fails at import)."""
    import importlib.metadata as metadata

    def installed(name: str) -> bool:
        try:
            (version_of or metadata.version)(name)
            return True
        except metadata.PackageNotFoundError:
            return False

    if distributions_of is None:
        table = metadata.packages_distributions()
        distributions_of = lambda module: table.get(module, [])  # noqa: E731
    requires_of = requires_of or metadata.requires
    missing: list[tuple[str, str]] = []
    seen: set[str] = set()
    todo = [(dist, dist) for module in modules for dist in distributions_of(module)]
    while todo:
        dist, parent = todo.pop(0)
        if _normal(dist) in seen:
            continue
        seen.add(_normal(dist))
        if not installed(dist):
            missing.append((dist, parent))
            continue
        try:
            needs = _required_by(dist, requires_of)
        except metadata.PackageNotFoundError:
            continue
        todo.extend((need, dist) for need in needs)
    return missing


def _note(text: str) -> None:
    print(f"gpu_check: {text}", file=sys.stderr, flush=True)


def missing_pieces(backends: list[str], find_spec: Callable[[str], Any] | None = None,
                   cuda_available: Callable[[], bool] | None = None,
                   requirements: Callable[[list[str]], list[tuple[str, str]]] | None = None,
                   ) -> tuple[list[str], list[str], list[str]]:
    """``(missing, notes, backends)``: one line per missing piece that stops the check (a module
    the run imports, found by :func:`needed_modules`, with the wheel to install: ``pip install
    --no-index --find-links WHEELS NAME``; a distribution one of them requires,
    :func:`missing_requirements`; no visible GPU), notes for what only narrows it (no vLLM), and
    the backends left to run."""
    find_spec = find_spec or importlib.util.find_spec
    needed = needed_modules()
    missing, present = [], []
    for module, importer in needed.items():
        if module in OPTIONAL:
            continue
        if find_spec(module) is None:
            wheel = WHEELS.get(module, module.replace("_", "-"))
            missing.append(f"missing: {module} (install the wheel {wheel}; imported by {importer})")
        else:
            present.append(module)
    if requirements is None and find_spec is importlib.util.find_spec:
        requirements = missing_requirements
    for dist, parent in (requirements(present) if requirements else []):
        missing.append(f"missing: {dist} (install its wheel: {parent} requires it)")
    notes = []
    if "vllm" in backends and find_spec("vllm") is None:
        notes.append("vLLM is not installed (pip install -e '.[vllm]' where an index is reachable): HF backend only")
        backends = [b for b in backends if b != "vllm"] or ["hf"]
    if find_spec("torch") is not None:
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available
        if not cuda_available():
            missing.append("missing: a CUDA GPU (torch.cuda.is_available() is False: a CPU-only torch, or no "
                           "visible device)")
    return missing, notes, backends


def _timed(calls: list[float], fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            calls.append(time.perf_counter() - start)
    return wrapper


def run(backend: str, model_dir: str, steps: int, out: Path) -> dict[str, Any]:
    """``steps`` Stage-II steps of the tiny preset with ``backend`` on CUDA; the averages of
    steps 2..N (the first pays compilation and warm-up)."""
    import torch

    from algos.commands.presets import preset_config
    from algos.trainer import Trainer

    torch.cuda.reset_peak_memory_stats()
    cfg = preset_config("tiny", stage="team", teacher="base", model=model_dir, out_dir=str(out / backend),
                        steps=steps, device="cuda", dtype="bfloat16", rollout_backend=backend,
                        eval_every=1000, save_every=1000)
    started = time.perf_counter()
    trainer = Trainer(cfg, progress=False)
    built = time.perf_counter() - started
    sync: list[float] = []  # the engine's sleep and the push of new weights, per call
    trainer._push_weights = _timed(sync, trainer._push_weights)
    backend_obj = getattr(trainer, "backend", None) or trainer.policy
    if hasattr(backend_obj, "sleep"):
        with contextlib.suppress(AttributeError):  # no instance attributes: its sleep is in score_s
            backend_obj.sleep = _timed(sync, backend_obj.sleep)
    rows = []
    for _ in range(steps):
        sync.clear()
        metrics = trainer.train_step()
        metrics["sync_s"] = sum(sync)
        rows.append(metrics)
    later = rows[1:] or rows
    result: dict[str, Any] = {k: sum(r[k] for r in later) / len(later)
                              for k in ("perf/rollout_s", "perf/score_s", "perf/update_s", "sync_s")}
    result["tokens_per_step"] = sum(r["perf/generated_tokens_per_s"] * r["perf/rollout_s"] for r in later) / len(later)
    result["step_s"] = result["perf/rollout_s"] + result["perf/score_s"] + result["perf/update_s"]
    free, total = torch.cuda.mem_get_info()
    # torch's peak counts the learner (and an in-process engine's tensors from torch's
    # allocator); vLLM's sleep-mode pool and KV cache show only in the device's used memory
    result.update({"backend": backend, "steps": steps, "setup_s": built,
                   "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30,
                   "device_used_gib": (total - free) / 2**30,
                   "losses/grad_norm": rows[-1]["losses/grad_norm"]})
    print(json.dumps(result), flush=True)
    if hasattr(trainer, "close"):
        trainer.close()
    del trainer
    torch.cuda.empty_cache()
    return result


def rate_with_sync(result: dict[str, Any]) -> float:
    """Generated tokens per second of rollout plus weight sync (what keeping the engine's
    copy of the weights current costs is part of the price of its speed)."""
    tokens = result.get("tokens_per_step", result.get("perf/generated_tokens_per_s", 0.0) * result["perf/rollout_s"])
    return tokens / max(result["perf/rollout_s"] + result.get("sync_s", 0.0), 1e-9)


def _step_s(result: dict[str, Any]) -> float:
    return result.get("step_s", result["perf/rollout_s"] + result["perf/score_s"] + result["perf/update_s"])


def headline(results: list[dict[str, Any]]) -> list[str]:
    """The summary lines: the vLLM / HF ratio (weight sync included) and the end-to-end
    step-time ratio when both ran, then one line per backend."""
    by = {r["backend"]: r for r in results}
    lines = []
    if "hf" in by and "vllm" in by:
        ratio = rate_with_sync(by["vllm"]) / max(rate_with_sync(by["hf"]), 1e-9)
        steps = _step_s(by["hf"]) / max(_step_s(by["vllm"]), 1e-9)
        lines.append(f"vllm / hf generated tokens per second of rollout + weight sync (tiny model): {ratio:.2f}x; "
                     f"end-to-end step time hf / vllm: {steps:.2f}x")
    for r in results:
        lines.append(f"{r['backend']:>5}: {rate_with_sync(r):.0f} generated tok/s with sync; step "
                     f"{_step_s(r):.2f}s = rollout {r['perf/rollout_s']:.2f}s / scoring {r['perf/score_s']:.2f}s / "
                     f"update {r['perf/update_s']:.2f}s (weight sync {r.get('sync_s', 0.0):.2f}s of scoring + update); "
                     f"peak GPU memory {r['peak_gpu_gib']:.2f} GiB (torch), {r['device_used_gib']:.2f} GiB used at the end")
    return lines


def model_dir() -> str:
    """The tiny preset's base (built on first use, cached after)."""
    from algos.commands.presets import prepare_model

    return prepare_model("tiny", progress=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3,
                        help="Stage-II steps per backend; the first is warm-up, the rest are averaged (default 3)")
    parser.add_argument("--backends", default="hf,vllm",
                        help="comma list of rollout backends, run in this order (default hf,vllm; vllm is left "
                             "out, with a note, when it is not installed)")
    parser.add_argument("--out", default="runs/gpu_check",
                        help="folder for each backend's run and gpu_check.json (default runs/gpu_check)")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.steps < 1:
        _note(f"error: --steps {args.steps}: must be >= 1")
        return 2
    if not backends or any(b not in BACKENDS for b in backends):
        _note(f"error: --backends {args.backends!r}: a comma list of {', '.join(BACKENDS)}")
        return 2
    missing, notes, backends = missing_pieces(backends)
    for line in missing:
        _note(line)
    if missing:
        return 2
    for line in notes:
        _note(line)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_check.json"
    base = model_dir()
    results: list[dict[str, Any]] = []
    failed = False
    for backend in backends:
        try:
            results.append(run(backend, base, args.steps, out))
        except ImportError as err:  # an install that is there but does not import: keep HF's figures
            if backend != "vllm":
                raise
            _note(f"vLLM does not import ({' '.join(str(err).split())}): HF figures only")
        except Exception as err:  # noqa: BLE001 (the figures so far are kept; the failure is named)
            _note(f"{backend} failed: {type(err).__name__}: {' '.join(str(err).split())}")
            failed = True
        path.write_text(json.dumps(results, indent=1))  # after each backend: a later crash keeps these
        if failed:
            break
    for line in headline(results):
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
