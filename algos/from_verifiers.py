"""verifiers traces of ``mopd-search-team`` back into mopd's Episodes and learner rows, so
that episodes played through verifiers (``vf-eval``, prime-rl's orchestrator) train with
mopd's own per-role GRPO and the Searchers' on-policy distillation (``docs/ecosystems.md``,
"verifiers", has the mapping and the ``tokens`` modes). ``Trainer.learn(groups)`` takes
:func:`groups_from_verifiers`' groups as it takes ``agents.collect``'s. Reads plain JSON
records: verifiers need not be installed.

A record is data from outside: every malformed one (wrong types, node parents that form a
cycle or point nowhere, a field mopd's Segment or Episode does not have, sizes beyond the
``MAX_*`` bounds below) raises a ValueError, never another error or a loop; names from a
record are quoted in messages (escape codes written out, never sent).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from algos.batch import Row, rows_from_episodes
from envs.episode import Episode, Segment
from envs.terminal import first_line

TOKENS = ("auto", "mopd", "trace")
TRACES_FILE = "traces.jsonl"
MAX_LINE_BYTES = 256 << 20
"""The longest episode record (one line of ``traces.jsonl``) read: longer is refused after
reading that much of it."""
MAX_TRACES = 4096
"""The most traces (mopd segments) one episode may hold."""
MAX_NODES = 100_000
"""The most nodes one trace may hold."""
MAX_TRACE_TOKENS = 1 << 22
"""The most token ids one trace's branch may hold (and one segment's)."""
MAX_TOKEN_ID = (1 << 31) - 1
"""Token ids are ``0..MAX_TOKEN_ID``."""


def read_traces(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The episode records of a verifiers run: ``path`` is its ``traces.jsonl`` or the run
    directory holding it. A bad line names file and line."""
    from envs.data.items import loads
    from envs.paths import read_lines

    path = Path(path)
    if path.is_dir():
        path = path / TRACES_FILE
    records = []
    with open(path, "rb") as f:
        for lineno, raw in read_lines(f, max_line=MAX_LINE_BYTES, max_total=1 << 40, label=str(path)):
            if not raw.strip():
                continue
            try:
                record = loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as err:
                raise ValueError(f"{path}:{lineno}: not a JSON episode record: {first_line(err, 200)}") from None
            if not isinstance(record, dict) or not isinstance(record.get("traces"), list):
                raise ValueError(f"{path}:{lineno}: not a verifiers episode record (no traces list)")
            records.append(record)
    return records


def episode_from_verifiers(record: Any, tokens: str = "mopd") -> Episode:
    """The mopd Episode of one verifiers episode (a record or an object), ``tokens`` ``mopd``
    or ``trace``; ValueError unless it is ``ok`` and its traces cover its segments once each."""
    if tokens not in ("mopd", "trace"):
        raise ValueError(f"tokens must be 'mopd' or 'trace' for one episode, got {tokens!r}")
    record = _record(record)
    name = _quote(record.get("id", "?"))
    if not record.get("ok"):
        errors = record.get("errors") or []
        errors = [_quote(e.get("message", "")) if isinstance(e, dict) else _quote(e)
                  for e in (errors[:5] if isinstance(errors, list) else [errors])]
        raise ValueError(f"verifiers episode {name} is not ok: {', '.join(errors) or 'no error recorded'}")
    traces = _dicts(record.get("traces"), f"verifiers episode {name}: traces", MAX_TRACES)
    summary, segments = None, {}
    for trace in traces:
        info = trace.get("info") or {}
        task = trace.get("task") or {}
        data = task.get("data") if isinstance(task, dict) else None
        label = _quote(data.get("id", "?") if isinstance(data, dict) else "?")
        seg = info.get("mopd_segment") if isinstance(info, dict) else None
        ep = info.get("mopd_episode") if isinstance(info, dict) else None
        if not isinstance(seg, dict) or not isinstance(ep, dict):
            raise ValueError(f"verifiers episode {name}: trace {label} has no mopd_segment/mopd_episode "
                             "record (not a mopd-search-team trace, or its finalize did not run)")
        index = seg.get("index")
        if not _is_int(index) or not 0 <= index < MAX_TRACES:
            raise ValueError(f"verifiers episode {name}: trace {label} has segment index {_quote(index)}, "
                             f"not a segment's index (0..{MAX_TRACES - 1})")
        if index in segments:
            raise ValueError(f"verifiers episode {name}: two traces of segment {index}")
        segments[index] = _segment(seg, trace, tokens, f"{name}/{label}")
        summary = summary or _checked_fields(ep, _EPISODE_FIELDS, f"verifiers episode {name}: mopd_episode",
                                             required=("question", "workflow"), extra=("values",))
    if summary is None:
        raise ValueError(f"verifiers episode {name} has no traces")
    if sorted(segments) != list(range(len(segments))):
        raise ValueError(f"verifiers episode {name}: the traces hold segments {sorted(segments)}, "
                         f"not 0..{len(segments) - 1}")
    episode = Episode.from_dict({**summary, "segments": []})
    episode.segments = [segments[i] for i in range(len(segments))]
    return episode


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
        traces = [t for r in records if isinstance(r.get("traces"), list) for t in r["traces"]]
        tokens = "trace" if records and all(_has_tokens(t) for t in traces) else "mopd"
    groups: dict[str, list[Episode]] = {}
    for r in records:
        group, task = r.get("group") or {}, r.get("task") or {}
        key = (group.get("id") if isinstance(group, dict) else None) or \
            (task.get("key") if isinstance(task, dict) else None) or r.get("id", "")
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
        raise ValueError(f"expected a verifiers episode record (dict) or Episode, got {type(record).__name__}")
    dumped = dump(mode="json", context={"float_decimals": None})
    if not isinstance(dumped, dict):
        raise ValueError(f"a verifiers episode's model_dump gave a {type(dumped).__name__}, not a record")
    return dumped


def _quote(value: Any) -> str:
    """A value from a record as a message shows it: ``repr``, cut, terminal-safe."""
    from envs.terminal import terminal_safe

    text = value if isinstance(value, str) else repr(value)
    return terminal_safe(repr(text[:120]) if isinstance(value, str) else text[:120], one_line=True)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _dicts(value: Any, what: str, limit: int) -> list[dict[str, Any]]:
    """``value`` when it is a list of at most ``limit`` dicts (None: empty); ValueError otherwise."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{what}: a list expected, got {type(value).__name__}")
    if len(value) > limit:
        raise ValueError(f"{what}: {len(value)} items, more than the {limit} allowed")
    bad = next((i for i, v in enumerate(value) if not isinstance(v, dict)), None)
    if bad is not None:
        raise ValueError(f"{what}: item {bad} is a {type(value[bad]).__name__}, not an object")
    return value


def _type_ok(value: Any, kind: str) -> bool:
    """Whether a JSON ``value`` fits a dataclass field's annotation ``kind`` (as written in
    envs.episode: str, int, float, bool, Any, ``X | None``, ``list[X]``, ``dict[str, X]``)."""
    kind = kind.strip()
    if kind.endswith("| None"):
        return value is None or _type_ok(value, kind[: -len("| None")])
    if kind == "Any":
        return True
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return _is_int(value)
    if kind == "float":
        return _is_number(value)
    if kind == "bool":
        return isinstance(value, bool)
    if kind.startswith("list[") and kind.endswith("]"):
        return isinstance(value, list) and all(_type_ok(v, kind[5:-1]) for v in value)
    if kind.startswith("dict[str,") and kind.endswith("]"):
        return isinstance(value, dict) and all(isinstance(k, str) and _type_ok(v, kind[9:-1]) for k, v in value.items())
    return False  # a kind this reader does not know: refuse rather than pass it unchecked


_SEGMENT_FIELDS = {f.name: str(f.type) for f in dataclasses.fields(Segment)}
_EPISODE_FIELDS = {f.name: str(f.type) for f in dataclasses.fields(Episode) if f.name != "segments"}


def _checked_fields(data: dict[str, Any], fields: dict[str, str], what: str, *, required: Sequence[str],
                    extra: Sequence[str] = ()) -> dict[str, Any]:
    """``data`` when its keys are ``fields`` (the ``required`` ones present, ``extra`` ones
    allowed and ignored) and each value fits its field's type; ValueError naming the first
    that does not."""
    unknown = sorted(str(k) for k in data if k not in fields and k not in extra)
    if unknown:
        raise ValueError(f"{what}: unknown field {_quote(unknown[0])} ({len(unknown)} such; "
                         "not a record of this mopd)")
    missing = [k for k in required if k not in data]
    if missing:
        raise ValueError(f"{what}: field {missing[0]!r} is missing")
    for key, kind in fields.items():
        if key in data and not _type_ok(data[key], kind):
            raise ValueError(f"{what}: field {key!r} is not {kind} (got {_quote(data[key])})")
    return data


def _check_tokens(ids: Any, mask: Any, logprobs: Any, what: str) -> None:
    """A segment's tokens: ids in ``0..MAX_TOKEN_ID``, at most :data:`MAX_TRACE_TOKENS`, a 0/1
    mask and (unless None) log-probs of the same length."""
    if len(ids) > MAX_TRACE_TOKENS:
        raise ValueError(f"{what}: {len(ids)} token ids, more than the {MAX_TRACE_TOKENS} allowed")
    if any(not 0 <= t <= MAX_TOKEN_ID for t in ids):
        raise ValueError(f"{what}: a token id outside 0..{MAX_TOKEN_ID}")
    if len(mask) != len(ids) or any(m not in (0, 1) for m in mask):
        raise ValueError(f"{what}: the loss mask must hold a 0 or 1 for each of the {len(ids)} token ids")
    if logprobs is not None and len(logprobs) != len(ids):
        raise ValueError(f"{what}: {len(logprobs)} log-probs for {len(ids)} token ids")


def _segment(seg: dict[str, Any], trace: dict[str, Any], tokens: str, label: str) -> Segment:
    what = f"trace {label}: mopd_segment"
    fields = {k: v for k, v in _checked_fields(seg, _SEGMENT_FIELDS, what, required=("agent", "role", "wave"),
                                               extra=("index",)).items() if k != "index"}
    _check_tokens(fields.get("token_ids", []), fields.get("loss_mask", []), fields.get("logprobs", []), what)
    rewards = trace.get("rewards") or {}
    reward = rewards.get("role") if isinstance(rewards, dict) else None
    if not isinstance(reward, dict) or not _is_number(reward.get("score")):
        raise ValueError(f"trace {label} has no role reward (a finite number)")
    fields["reward"] = float(reward["score"])
    if tokens == "trace":
        if not _has_tokens(trace):
            raise ValueError(f"trace {label} carries no token ids (an eval relay's text only): use tokens='mopd'")
        fields["token_ids"], fields["loss_mask"], fields["logprobs"] = trace_tokens(trace)
    return Segment(**fields)


def _has_tokens(trace: Any) -> bool:
    nodes = trace.get("nodes") if isinstance(trace, dict) else None
    return isinstance(nodes, list) and any(isinstance(node, dict) and node.get("token_ids") for node in nodes)


def trace_tokens(trace: dict[str, Any]) -> tuple[list[int], list[int], list[float] | None]:
    """A trace record's one branch as ``(token_ids, loss_mask, logprobs)``: the nodes from
    its root to its leaf, the mask 1 on sampled tokens, the behaviour log-probs spread onto
    them (0.0 elsewhere; None when a sampled node has none). ValueError for a trace with
    several branches (one row per branch is not a mopd segment) or a malformed one."""
    if not isinstance(trace, dict):
        raise ValueError(f"a trace must be an object, got {type(trace).__name__}")
    nodes = _dicts(trace.get("nodes"), "a trace's nodes", MAX_NODES)
    for i, node in enumerate(nodes):
        parent = node.get("parent")
        if parent is not None and (not _is_int(parent) or not 0 <= parent < len(nodes) or parent == i):
            raise ValueError(f"node {i} of a trace has parent {_quote(parent)}, not another node's index "
                             f"(0..{len(nodes) - 1}) or null")
    parents = {n.get("parent") for n in nodes}
    leaves = [i for i in range(len(nodes)) if i not in parents]
    if len(leaves) != 1:
        raise ValueError(f"a trace with {len(leaves)} branches is not one mopd segment")
    path, at, seen = [], leaves[0], set()
    while at is not None:
        if at in seen:
            raise ValueError(f"the node parents of a trace form a cycle (node {at} is its own ancestor)")
        seen.add(at)
        path.append(nodes[at])
        at = nodes[at].get("parent")
    if len(path) != len(nodes):
        raise ValueError(f"{len(nodes) - len(path)} nodes of a trace are off its branch (their parents form a cycle)")
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] | None = []
    for i, node in enumerate(reversed(path)):
        node_ids, node_mask, node_lp = (node.get(k) or [] for k in ("token_ids", "mask", "logprobs"))
        if not isinstance(node_ids, list) or not all(_is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in node_ids):
            raise ValueError(f"node {i} of a trace's branch: token_ids must be a list of token ids "
                             f"(0..{MAX_TOKEN_ID})")
        if not isinstance(node_mask, list) or not all(isinstance(m, bool) or m in (0, 1) for m in node_mask):
            raise ValueError(f"node {i} of a trace's branch: mask must be a list of true/false")
        if not isinstance(node_lp, list) or not all(_is_number(x) for x in node_lp):
            raise ValueError(f"node {i} of a trace's branch: logprobs must be a list of finite numbers")
        node_mask = [bool(m) for m in node_mask]
        if len(node_mask) != len(node_ids):
            raise ValueError(f"a node has {len(node_ids)} token ids but {len(node_mask)} mask values")
        if len(ids) + len(node_ids) > MAX_TRACE_TOKENS:
            raise ValueError(f"a trace's branch holds more than the {MAX_TRACE_TOKENS} token ids allowed")
        ids += node_ids
        mask += [int(m) for m in node_mask]
        if logprobs is not None and sum(node_mask) and len(node_lp) != sum(node_mask):
            logprobs = None
        if logprobs is not None:
            it = iter(node_lp)
            logprobs += [float(next(it)) if m else 0.0 for m in node_mask]
    return ids, mask, logprobs
