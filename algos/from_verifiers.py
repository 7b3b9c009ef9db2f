"""verifiers traces of ``mopd-search-team`` back into mopd's Episodes and learner rows, so
that episodes played through verifiers (``vf-eval``, prime-rl's orchestrator) train with
mopd's own per-role GRPO and the Searchers' on-policy distillation.

A verifiers episode (one line of a run's ``traces.jsonl``, or an ``Episode`` object) holds
one trace per mopd segment. ``SearchTeamEnv.finalize``
(``integrations/verifiers/mopd_search_team``) recorded on each its role reward
(``rewards["role"]``), its segment (``info["mopd_segment"]``: index, agent, role, wave,
the env's token ids, loss mask and log-probs) and the episode without its segments
(``info["mopd_episode"]``). :func:`episode_from_verifiers` rebuilds the Episode;
:func:`groups_from_verifiers` groups Episodes as the learner's GRPO groups (by the
consumer's ``group.id`` when it set one, else by task: ``-r G`` gives G episodes of a
question); :func:`rows_from_verifiers` gives the groups and their rows. ``Trainer.learn(groups)`` takes the
groups as it takes ``agents.collect``'s.

Which tokens a segment trains on (``tokens``):

- ``mopd``: the env's own (its chat format, as ``agents.collect`` records them). Right for
  a learner whose model reads mopd's chat format; the learner scores old and Teacher
  log-probs itself.
- ``trace``: the trace's own (the model's chat template, as verifiers' training client
  renders it): its one branch's ``token_ids``, ``mask`` (sampled tokens) and ``logprobs``.
  Eval traces carry none (chat relays give text only).
- ``auto``: ``trace`` when every trace carries token ids, else ``mopd``.

Reads plain JSON records: verifiers need not be installed (its extra conflicts with
others'). A trace or episode object is read through its ``model_dump``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from algos.batch import Row, rows_from_episodes
from envs.episode import Episode, Segment

TOKENS = ("auto", "mopd", "trace")
TRACES_FILE = "traces.jsonl"


def read_traces(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The episode records of a verifiers run: ``path`` is its ``traces.jsonl`` or the run
    directory holding it. A bad line names file and line."""
    from envs.data.items import loads

    path = Path(path)
    if path.is_dir():
        path = path / TRACES_FILE
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = loads(line)
            except ValueError as err:
                raise ValueError(f"{path}:{lineno}: not a JSON episode record: {err}") from err
            if not isinstance(record, dict) or not isinstance(record.get("traces"), list):
                raise ValueError(f"{path}:{lineno}: not a verifiers episode record (no traces list)")
            records.append(record)
    return records


def episode_from_verifiers(record: Any, tokens: str = "mopd") -> Episode:
    """The mopd Episode of one verifiers episode (a record or an object); ``tokens`` as
    in the module docstring (``mopd`` or ``trace``). Raises ValueError for an episode that
    is not ``ok``, a trace without the mopd records, or traces that do not cover the
    episode's segments exactly once each."""
    if tokens not in ("mopd", "trace"):
        raise ValueError(f"tokens must be 'mopd' or 'trace' for one episode, got {tokens!r}")
    record = _record(record)
    name = record.get("id", "?")
    if not record.get("ok"):
        errors = [e.get("message", "") for e in record.get("errors") or []]
        raise ValueError(f"verifiers episode {name} is not ok: {errors or 'no error recorded'}")
    traces = record.get("traces") or []
    summary, segments = None, {}
    for trace in traces:
        info = trace.get("info") or {}
        seg, ep = info.get("mopd_segment"), info.get("mopd_episode")
        label = (trace.get("task") or {}).get("data", {}).get("id", "?")
        if not isinstance(seg, dict) or not isinstance(ep, dict):
            raise ValueError(f"verifiers episode {name}: trace {label} has no mopd_segment/mopd_episode "
                             "record (not a mopd-search-team trace, or its finalize did not run)")
        index = seg.get("index")
        if index in segments:
            raise ValueError(f"verifiers episode {name}: two traces of segment {index}")
        segments[index] = _segment(seg, trace, tokens, f"{name}/{label}")
        summary = summary or ep
    if summary is None:
        raise ValueError(f"verifiers episode {name} has no traces")
    if sorted(segments) != list(range(len(segments))):
        raise ValueError(f"verifiers episode {name}: the traces hold segments {sorted(segments)}, "
                         f"not 0..{len(segments) - 1}")
    return _with_segments(summary, [segments[i] for i in range(len(segments))])


def groups_from_verifiers(records: Iterable[Any], tokens: str = "auto", *,
                          skip_failed: bool = False) -> list[list[Episode]]:
    """Episodes grouped as the learner's GRPO groups, in order of first appearance: by the
    episode's ``group.id`` when the consumer set one, else by its task key (the G
    rollouts of a question). ``skip_failed`` leaves out episodes that are not ``ok``
    (otherwise they raise)."""
    if tokens not in TOKENS:
        raise ValueError(f"tokens must be one of {TOKENS}, got {tokens!r}")
    records = [_record(r) for r in records]
    if skip_failed:
        records = [r for r in records if r.get("ok")]
    if tokens == "auto":
        tokens = "trace" if records and all(_has_tokens(t) for r in records for t in r.get("traces") or []) \
            else "mopd"
    groups: dict[str, list[Episode]] = {}
    for r in records:
        key = (r.get("group") or {}).get("id") or (r.get("task") or {}).get("key") or r.get("id", "")
        groups.setdefault(str(key), []).append(episode_from_verifiers(r, tokens))
    return list(groups.values())


def rows_from_verifiers(records: Iterable[Any], max_len: int, tokens: str = "auto", *,
                        skip_failed: bool = False) -> tuple[list[list[Episode]], list[Row]]:
    """:func:`groups_from_verifiers`' groups and their learner rows (``algos.batch.Row``,
    one per segment with a generated token, as ``rows_from_episodes`` cuts them). Each row
    points at its Segment, Episode and group, so the advantage terms' context
    (``algos.advantages.AdvantageContext(groups=...)``) must be given these same groups."""
    groups = groups_from_verifiers(records, tokens, skip_failed=skip_failed)
    return groups, rows_from_episodes(groups, max_len)


# ------------------------------------------------------------------------------ helpers


def _record(record: Any) -> dict[str, Any]:
    if isinstance(record, dict):
        return record
    dump = getattr(record, "model_dump", None)
    if dump is None:
        raise TypeError(f"expected a verifiers episode record (dict) or Episode, got {type(record).__name__}")
    return dump(mode="json", context={"float_decimals": None})


def _segment(seg: dict[str, Any], trace: dict[str, Any], tokens: str, label: str) -> Segment:
    fields = {k: v for k, v in seg.items() if k != "index"}
    reward = (trace.get("rewards") or {}).get("role")
    if not isinstance(reward, dict) or not isinstance(reward.get("score"), (int, float)):
        raise ValueError(f"trace {label} has no role reward")
    fields["reward"] = float(reward["score"])
    if tokens == "trace":
        if not _has_tokens(trace):
            raise ValueError(f"trace {label} carries no token ids (an eval relay's text only): use tokens='mopd'")
        fields["token_ids"], fields["loss_mask"], fields["logprobs"] = trace_tokens(trace)
    return Segment(**fields)


def _with_segments(summary: dict[str, Any], segments: Sequence[Segment]) -> Episode:
    ep = Episode.from_dict({**summary, "segments": []})
    ep.segments = list(segments)
    return ep


def _has_tokens(trace: dict[str, Any]) -> bool:
    return any(node.get("token_ids") for node in trace.get("nodes") or [])


def trace_tokens(trace: dict[str, Any]) -> tuple[list[int], list[int], list[float] | None]:
    """A trace record's one branch as ``(token_ids, loss_mask, logprobs)``: the nodes from
    its root to its leaf, the mask 1 on sampled tokens, the behaviour log-probs spread onto
    them (0.0 elsewhere; None when a sampled node has none). ValueError for a trace with
    several branches (a harness that forks or compacts: one row per branch is not a mopd
    segment)."""
    nodes = trace.get("nodes") or []
    parents = {n.get("parent") for n in nodes}
    leaves = [i for i in range(len(nodes)) if i not in parents]
    if len(leaves) != 1:
        raise ValueError(f"a trace with {len(leaves)} branches is not one mopd segment")
    path, at = [], leaves[0]
    while at is not None:
        path.append(nodes[at])
        at = nodes[at].get("parent")
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] | None = []
    for node in reversed(path):
        node_ids, node_mask = list(node.get("token_ids") or []), [bool(m) for m in node.get("mask") or []]
        if len(node_mask) != len(node_ids):
            raise ValueError(f"a node has {len(node_ids)} token ids but {len(node_mask)} mask values")
        ids += node_ids
        mask += [int(m) for m in node_mask]
        node_lp = list(node.get("logprobs") or [])
        if logprobs is not None and sum(node_mask) and len(node_lp) != sum(node_mask):
            logprobs = None
        if logprobs is not None:
            it = iter(node_lp)
            logprobs += [float(next(it)) if m else 0.0 for m in node_mask]
    return ids, mask, logprobs
