"""The tables the README and docs pages show, rendered from the committed JSON (:data:`BLOCKS`)
between ``<!-- name -->`` and ``<!-- /name -->``, so that no figure in them is typed by hand;
``python -m benchmarks table2 --render-docs`` rewrites them after new runs."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.table2.render import markdown

ROOT = Path(__file__).resolve().parents[1]


def summary_table(table: Mapping[str, Any], *, per_seed: bool = True) -> str:
    """Table 2 in short (the top of ``docs/table2.md``; the README's without ``per_seed``),
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
    """The seed distribution of ``docs/micro_seeds.json`` (``python -m algos.recipes.micro.seeds
    collect``), one row a stage: avg@1 as mean [min, max] over seeds, then the tests."""
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


def bases_table(mechanism: Mapping[str, Any]) -> str:
    """The ``micro_search`` bases measured before training (``docs/table2_mechanism.json``'s
    ``bases`` that name their ``base_seed``), one row a base ("-" where not measured)."""
    default_env = mechanism.get("environment") or {}
    vendors = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}

    def cpu(base: Mapping[str, Any]) -> str:
        vendor = (base.get("environment") or default_env).get("cpu_vendor", "")
        return vendors.get(vendor, vendor or "CPU not recorded")

    bases = sorted((b for b in mechanism["bases"].values() if "base_seed" in b),
                   key=lambda b: (cpu(b), b["base_seed"]))
    lines = ["| base seed (weights, CPU) | avg@1 (right) | without two-choice | retriever finds nothing | "
             "Searchers never skip | searches: greedy / never skip | sampled: searched / R_EM | mixed groups | "
             "cov(searches, R_EM) [95%] |", "|---|" + "---:|" * 7 + "---|"]
    for b in bases:
        greedy, first, sampled = b["greedy"], b.get("greedy_search_first"), b.get("sampled")
        cells = [f"{b['base_seed']} ({b['weight_hash']}, {cpu(b)})", _right(greedy),
                 f"{greedy['macro_avg@1_not_two_choice']:.3f}", _right(b.get("greedy_nothing_found")), _right(first),
                 f"{greedy['searches_per_workflow']:.2f} / "
                 + ("-" if first is None else f"{first['searches_per_workflow']:.2f}")]
        if sampled is None:
            cells += ["-"] * 3
        else:
            cells += [f"{sampled['searched_share']:.2f} / {sampled['team_em']:.2f}",
                      f"{100 * sampled['mixed_group_share']:.0f}%", _covariance(sampled)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def closed_book_table(mechanism: Mapping[str, Any]) -> str:
    """The closed-book candidates (bases that learnt geography facts, issue 30) of
    ``docs/table2_mechanism.json``, one row a base ("-" where not measured)."""
    lines = ["| base (weights) | worlds known | fact passes | skip (known tasks) | practice episodes | SFT steps | "
             "facts recalled | avg@1 (right) | retriever finds nothing | from memory alone | searches | "
             "cov(searches, R_EM) [95%] |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for b in mechanism.get("closed_book_candidates", {}).values():
        s = b["settings"]
        known = s["known_worlds"] if s["known_worlds"] is not None else s["worlds"]
        skip = f"{s['skip_search']:g}" + ("" if s["skip_known"] is None else f" ({s['skip_known']:g})")
        cells = [f"{b['model']} ({b['weight_hash']})", ", ".join(map(str, known)), str(s["facts"]), skip,
                 str(b.get("practised_episodes", 0)), f"{b['sft_steps']:,}", f"{b['fact_recall']['all']:.2f}", _right(b["greedy"]),
                 _right(b["greedy_nothing_found"]), _right(b["greedy_closed_book"]),
                 f"{b['greedy']['searches_per_workflow']:.2f}", _covariance(b.get("sampled"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _right(fig: Mapping[str, Any] | None) -> str:
    """A greedy measurement's macro avg@1 and its count of right answers, or "-"."""
    return "-" if fig is None else f"{fig['macro_avg@1']:.3f} ({fig['right']})"


def _covariance(sampled: Mapping[str, Any] | None) -> str:
    """A sampled measurement's covariance of searches with R_EM and its interval, or "-"."""
    if sampled is None:
        return "-"
    low, high = sampled["cov_searches_em_ci95"]
    return f"{sampled['cov_searches_em']:+.3f} [{low:+.3f}, {high:+.3f}]"


BLOCKS: dict[str, dict[str, tuple[str, Callable[[Any], str]]]] = {
    "README.md": {"micro-seeds": ("docs/micro_seeds.json", seeds_table),
                  "table2": ("docs/table2.json", lambda table: summary_table(table, per_seed=False))},
    "docs/table2.md": {"table2-summary": ("docs/table2.json", summary_table),
                       "table2-full": ("docs/table2.json", markdown),
                       "table2-bases": ("docs/table2_mechanism.json", bases_table),
                       "table2-closed-book": ("docs/table2_mechanism.json", closed_book_table),
                       "table2-facts-summary": ("docs/table2_facts/table2.json", summary_table),
                       "table2-facts-full": ("docs/table2_facts/table2.json", markdown),
                       "table2-micro": ("docs/table2_micro/table2.json", markdown)},
    "docs/positive_control.md": {"table2-control-summary": ("docs/table2_control/table2.json", summary_table),
                                 "table2-control-full": ("docs/table2_control/table2.json", markdown)},
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
    """Rewrite every block of :data:`BLOCKS` from the committed JSON; returns the changed pages."""
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
