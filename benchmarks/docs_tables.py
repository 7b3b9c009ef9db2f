"""The tables the README and ``docs/table2.md`` show, rendered from the committed JSON
(``docs/table2.json``, ``docs/micro_seeds.json``, and ``docs/table2_search/table2.json``: the
running six-seed ablation's finished runs), so that no figure in them is typed by hand.

Each table sits between ``<!-- name -->`` and ``<!-- /name -->`` in its page (:data:`BLOCKS`);
``tests/test_committed_tables.py`` fails when a page's block differs from its rendering, and

    python -m benchmarks table2 --render-docs

rewrites the blocks after new runs (copy the ablation's ``table2.json``, its two
``table2_*.jsonl.gz`` archives and ``curves.png`` as ``table2_curves.png`` into ``docs/``
first; ``python -m algos.recipes.micro.seeds collect`` writes ``docs/micro_seeds.json``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.table2 import markdown

ROOT = Path(__file__).resolve().parents[1]


def summary_table(table: Mapping[str, Any], *, per_seed: bool = True) -> str:
    """Table 2 in short (the top of ``docs/table2.md``; the README's without ``per_seed``):
    per variant avg@k in points, the difference to ``opd`` with its question-paired
    interval, the interval over seeds, each seed's difference and the searches per
    validation workflow; avg@k without the two-choice questions when the table has them;
    then what each interval covers."""
    rows = table["rows"]
    k = min(r["k"] for r in rows.values())
    subset = all(r.get("without_two_choice") for r in rows.values())
    head = ["signal", f"avg@{k}", "vs opd, questions paired [95% CI]", "over seeds [95% CI]"]
    head += ["per seed"] * per_seed + ["w/o two-choice"] * subset + ["searches"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for v, r in rows.items():
        ci = r.get("vs_opd")
        cells = [f"`{v}`", f"{100 * r['macro_avg@k']:.2f}"]
        if ci is None:
            cells += [""] * (2 + per_seed)
        else:
            paired, over = ci["questions_paired"], ci["over_seeds"]
            cells += [f"{100 * ci['difference']:+.2f} [{100 * paired['low']:+.2f}, {100 * paired['high']:+.2f}]",
                      "none (one seed)" if over["low"] is None
                      else f"[{100 * over['low']:+.2f}, {100 * over['high']:+.2f}]"]
            cells += [", ".join(f"{100 * d:+.2f}" for d in ci["per_seed"].values())] * per_seed
        if subset:
            cells.append(f"{100 * r['without_two_choice']['macro_avg@k']:.2f}")
        cells.append(f"{r['macro_searches_per_workflow']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    seeds = table["seeds"]
    lines += ["", f"Points, seeds {', '.join(map(str, seeds))}. Questions paired: these runs on new "
              f"questions; over seeds (Student-t, df {len(seeds) - 1}): the training recipe."]
    if subset:
        count = next(iter(rows.values()))["two_choice_questions"]
        lines[-1] += (f" Two-choice: the {count['two_choice']} of {count['questions']} questions whose "
                      "answer is one of two names in the question.")
    return "\n".join(lines) + "\n"


STAGE_NAMES = {"teacher": "I (Teacher)", "team": "II (team)"}
"""The stages as the README names them."""


def seeds_table(result: Mapping[str, Any]) -> str:
    """The seed distribution of a ``docs/micro_seeds.json`` (``python -m
    algos.recipes.micro.seeds collect``) as a markdown table (the README's "Train"
    headline): per stage avg@1 before and after (mean [min, max] over seeds), the seeds that
    improved with the exact sign test over seeds, and the pooled test labelled with what it
    assumes."""
    lines = ["| stage | base avg@1 | trained | seeds up (sign test) | "
             "pooled, (seed, question) pairs assumed independent |", "|---|---|---|---|---|"]
    for stage, f in result["stages"].items():
        over, pooled = f["over_seeds"], f.get("pooled_paired")
        tied = f", {over['ties']} tied" if over["ties"] else ""
        cells = [STAGE_NAMES.get(stage, stage),
                 *(f"{f[k]['mean']:.3f} [{f[k]['min']:.3f}, {f[k]['max']:.3f}]" for k in ("base_em", "trained_em")),
                 f"{over['better']} of {over['seeds']}{tied} (p = {over['p_value']:.2g})",
                 "-" if not pooled else (f"{pooled['better']} up, {pooled['worse']} down of "
                                         f"{pooled['questions']} (p = {pooled['p_value']:.2g})")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


BLOCKS: dict[str, dict[str, tuple[str, Callable[[Any], str]]]] = {
    "README.md": {"micro-seeds": ("docs/micro_seeds.json", seeds_table),
                  "table2": ("docs/table2.json", lambda table: summary_table(table, per_seed=False))},
    "docs/table2.md": {"table2-summary": ("docs/table2.json", summary_table),
                       "table2-full": ("docs/table2.json", markdown),
                       "table2-search": ("docs/table2_search/table2.json", markdown)},
}
"""Page -> block name -> (the JSON it renders, the renderer)."""


def block(text: str, name: str) -> str:
    """The text between ``<!-- name -->`` and ``<!-- /name -->`` (each on its own line)."""
    start, end = f"<!-- {name} -->\n", f"<!-- /{name} -->"
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"the page must hold <!-- {name} --> and <!-- /{name} --> once each")
    return text.split(start, 1)[1].split(end, 1)[0]


def rendered(root: str | Path = ROOT) -> dict[str, dict[str, str]]:
    """Page -> block name -> the block as the committed JSON renders it."""
    root = Path(root)
    cache: dict[str, Any] = {}
    out: dict[str, dict[str, str]] = {}
    for page, blocks in BLOCKS.items():
        for name, (source, render) in blocks.items():
            if source not in cache:
                cache[source] = json.loads((root / source).read_text(encoding="utf-8"))
            out.setdefault(page, {})[name] = render(cache[source])
    return out


def render_docs(root: str | Path = ROOT) -> list[str]:
    """Rewrite every block of :data:`BLOCKS` from the committed JSON; returns the pages that
    changed."""
    root = Path(root)
    changed = []
    for page, blocks in rendered(root).items():
        path = root / page
        text = new = path.read_text(encoding="utf-8")
        for name, body in blocks.items():
            new = new.replace(f"<!-- {name} -->\n{block(new, name)}<!-- /{name} -->",
                              f"<!-- {name} -->\n{body}<!-- /{name} -->")
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


def render_command() -> int:
    """``python -m benchmarks table2 --render-docs``: :func:`render_docs` in this checkout."""
    changed = render_docs()
    print(f"rewrote the tables of {', '.join(changed)}" if changed else "the tables were up to date")
    return 0
