"""The data-parallel learner on ``torch.distributed``: what a Trainer does differently under
``torchrun --nproc-per-node K -m algos train ...`` (``docs/scaleout.md``, "The data-parallel
learner": why one step on K ranks equals the one-process step, and the measurements).

The ranks' gradients are summed (:meth:`Dist.all_reduce_grads`), not averaged: each rank
divides by the whole minibatch's token count (``algos.losses.Totals``). Why not
``DistributedDataParallel``'s wrapper: it all-reduces inside each backward and needs the same
number of backwards on every rank, but a rank's share of rows can take a different number of
memory-bounded chunks; the sum is what DDP computes, once per minibatch.

The Trainer always holds a :class:`Dist` (:func:`this_process`; outside torchrun a
:class:`OneProcess`), and the trained model's layout is chosen once (:func:`layout_for`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch

__all__ = ["Dist", "FullOptimizer", "OneProcess", "Replicated", "Sharded", "copy_into", "from_env",
           "full_optimizer_state", "fully_shard_model", "layout_for", "load_full_optimizer_state",
           "local_norm", "local_tensor", "run_main", "shard_by_tokens", "sharded_masks",
           "this_process"]


DIST_TIMEOUT_S = 2 * 3600
"""Seconds a rank waits inside a collective (``MOPD_DIST_TIMEOUT_S`` overrides it); not NCCL's
10 minutes: the others wait while rank 0 alone validates or checkpoints a 4B model."""

GRAD_BUCKET_BYTES = 1 << 28
"""The largest bucket of gradients summed at once (one bucket's copy, not the whole model's)."""


def shard_by_tokens(sizes: Sequence[int], world: int) -> list[list[int]]:
    """Indices of ``sizes`` for each of ``world`` ranks, balanced by total size (the largest
    first, to the least loaded rank), each in index order; every rank computes the same split."""
    loads = [0] * world
    parts: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        parts[r].append(i)
        loads[r] += sizes[i]
    return [sorted(p) for p in parts]


def _json_bytes(obj: Any, device: torch.device) -> torch.Tensor:
    """``obj`` as ASCII JSON bytes (any ``str``, lone surrogates included, is escaped)."""
    raw = json.dumps(obj, separators=(",", ":")).encode("ascii")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device)


def _from_json_bytes(data: torch.Tensor) -> Any:
    return json.loads(bytes(data.cpu().numpy()).decode("ascii"))


def _array_json(value: Any) -> list[Any] | None:
    """``[dtype, values]`` of an array (None stays None): floats round-trip exactly."""
    if value is None:
        return None
    array = np.asarray(value)
    return [array.dtype.str, array.tolist()]


@dataclass
class Dist:
    """This process's place in a ``torch.distributed`` job (world size >= 1)."""

    rank: int
    world: int
    device: torch.device

    launched = True
    """Whether torchrun started this process (False: :class:`OneProcess`)."""

    @property
    def is_main(self) -> bool:
        """Rank 0: writes metrics, validation records and checkpoints."""
        return self.rank == 0

    def shard(self, rows: Sequence[Any]) -> list[Any]:
        """This rank's rows of ``rows`` (every rank passes the same list), split by tokens."""
        part = shard_by_tokens([len(r.token_ids) for r in rows], self.world)[self.rank]
        return [rows[i] for i in part]

    def all_gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order. JSON values only: they travel as ASCII JSON in
        byte tensors, never pickled (rollouts carry model- and corpus-written text)."""
        data = _json_bytes(obj, self.device)
        sizes = [torch.zeros(1, dtype=torch.long, device=self.device) for _ in range(self.world)]
        torch.distributed.all_gather(sizes, torch.tensor([data.numel()], device=self.device))
        width = max(int(n.item()) for n in sizes)
        padded = torch.zeros(width, dtype=torch.uint8, device=self.device)
        padded[:data.numel()] = data
        parts = [torch.empty(width, dtype=torch.uint8, device=self.device) for _ in range(self.world)]
        torch.distributed.all_gather(parts, padded)
        return [_from_json_bytes(part[:int(n.item())]) for part, n in zip(parts, sizes)]

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank (JSON values only, as :meth:`all_gather_objects`)."""
        data = _json_bytes(obj, self.device) if self.rank == src else None
        size = torch.tensor([0 if data is None else data.numel()], device=self.device)
        torch.distributed.broadcast(size, src=src)
        if data is None:
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        torch.distributed.broadcast(data, src=src)
        return _from_json_bytes(data)

    def gather_row_values(self, rows: Sequence[Any], mine: Sequence[Any], attrs: Sequence[str]) -> None:
        """Each rank filled ``attrs`` of its rows ``mine``: every rank gets every row's, as
        bit-equal numpy arrays (or None) read from the same JSON."""
        index = {id(r): i for i, r in enumerate(rows)}
        local = [[index[id(r)], [_array_json(getattr(r, a)) for a in attrs]] for r in mine]
        for part in self.all_gather_objects(local):
            for i, values in part:
                for a, v in zip(attrs, values):
                    setattr(rows[i], a, None if v is None else np.asarray(v[1], dtype=v[0]))

    def all_reduce_grads(self, parameters: Sequence[torch.nn.Parameter],
                         bucket_bytes: int = GRAD_BUCKET_BYTES) -> None:
        """Sum the gradients over the ranks, in place (a missing one counts as 0: a rank may
        have had no rows), one collective per bucket of at most ``bucket_bytes`` of one dtype."""
        params = [p for p in parameters if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        buckets: list[list[torch.Tensor]] = []
        open_bucket: dict[torch.dtype, tuple[list[torch.Tensor], list[int]]] = {}
        for p in params:
            grad, size = p.grad, p.grad.numel() * p.grad.element_size()
            bucket, used = open_bucket.get(grad.dtype, (None, [0]))
            if bucket is None or used[0] + size > bucket_bytes:
                bucket, used = [], [0]
                buckets.append(bucket)
                open_bucket[grad.dtype] = (bucket, used)
            bucket.append(grad)
            used[0] += size
        for bucket in buckets:
            if len(bucket) == 1 and bucket[0].is_contiguous():
                torch.distributed.all_reduce(bucket[0], op=torch.distributed.ReduceOp.SUM)
                continue
            flat = torch.cat([g.reshape(-1) for g in bucket])
            torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    def sum_floats(self, values: dict[str, float]) -> dict[str, float]:
        """``values`` summed over the ranks (same keys on every rank)."""
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return dict(zip(keys, t.tolist()))

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is True on any rank."""
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item() > 0)

    def barrier(self) -> None:
        torch.distributed.barrier()

    def metrics(self) -> dict[str, float]:
        """What a step's metrics say about the job (``dist/world_size``)."""
        return {"dist/world_size": float(self.world)}

    def collect(self, env_fn: Callable[[], Any], policy: Any, questions: Sequence[Any], group_size: int,
                seed: int) -> list[list[Any]]:
        """``group_size`` Episodes per question, each rank rolling its share, each group with
        its own seed (``agents.ray_rollout.collect_groups``: the batch does not depend on the
        world size), gathered on every rank."""
        from agents.ray_rollout import collect_groups
        from envs.episode import groups_from_dicts, groups_to_dicts

        part = np.array_split(np.arange(len(questions)), self.world)[self.rank]
        first = int(part[0]) if len(part) else 0
        mine = collect_groups(env_fn, policy, [questions[i] for i in part], group_size, seed=seed, first_index=first)
        return [g for share in self.all_gather_objects(groups_to_dicts(mine)) for g in groups_from_dicts(share)]

    def share_groups(self, groups: list[list[Any]] | None) -> list[list[Any]]:
        """Rank 0's Episodes grouped by question (the Ray workers' batch) on every rank; the
        other ranks pass None. They travel as JSON (``envs.episode.groups_to_dicts``)."""
        from envs.episode import groups_from_dicts, groups_to_dicts

        return groups_from_dicts(self.broadcast_object(groups_to_dicts(groups or [])))

    def close(self) -> None:
        """On success only (after a failure the others would wait here for ever): wait for
        every rank, then destroy the group; a rank tearing gloo down while another finishes its
        last collective aborts it. Drop every FSDP2 model first: one still alive at the
        interpreter's teardown aborts gloo in 4 of 12 runs (0 of 22 dropped)."""
        if torch.distributed.is_initialized():
            gc.collect()
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()


class OneProcess(Dist):
    """The :class:`Dist` of a process torchrun did not start: rank 0 of 1, every collective the
    identity."""

    launched = False

    def __init__(self, device: str | torch.device = "cpu"):
        super().__init__(rank=0, world=1, device=torch.device(device))

    def shard(self, rows: Sequence[Any]) -> list[Any]:
        return list(rows)

    def all_gather_objects(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return obj

    def gather_row_values(self, rows: Sequence[Any], mine: Sequence[Any], attrs: Sequence[str]) -> None:
        """Nothing to gather: this process scored every row."""

    def all_reduce_grads(self, parameters: Sequence[torch.nn.Parameter],
                         bucket_bytes: int = GRAD_BUCKET_BYTES) -> None:
        """Nothing to sum (a missing gradient stays None, as in any one-process step)."""

    def sum_floats(self, values: dict[str, float]) -> dict[str, float]:
        return dict(values)

    def any(self, flag: bool) -> bool:
        return bool(flag)

    def barrier(self) -> None:
        """No other rank to wait for."""

    def metrics(self) -> dict[str, float]:
        return {}

    def collect(self, env_fn: Callable[[], Any], policy: Any, questions: Sequence[Any], group_size: int,
                seed: int) -> list[list[Any]]:
        """Every question here, one batch (``agents.collect.collect``)."""
        from agents.collect import collect

        return collect(env_fn, policy, questions, group_size, seed=seed)

    def share_groups(self, groups: list[list[Any]] | None) -> list[list[Any]]:
        return groups if groups is not None else []

    def close(self) -> None:
        """No process group to destroy."""


def this_process(device: str = "cpu", timeout_s: float | None = None) -> Dist:
    """This process's :class:`Dist`: :func:`from_env`'s under torchrun, else a :class:`OneProcess`."""
    dist = from_env(device, timeout_s)
    return dist if dist is not None else OneProcess(device)


def from_env(device: str = "cpu", timeout_s: float | None = None) -> Dist | None:
    """The :class:`Dist` of a process started by ``torchrun`` (its process group created here,
    gloo on CPU, NCCL on CUDA, timeout ``timeout_s``: default :data:`DIST_TIMEOUT_S`), or None."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(dev)
    if not torch.distributed.is_initialized():
        if timeout_s is None:
            timeout_s = float(os.environ.get("MOPD_DIST_TIMEOUT_S", DIST_TIMEOUT_S))
        torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                             timeout=timedelta(seconds=timeout_s))
    return Dist(rank=rank, world=world, device=dev)


def fully_shard_model(model: Any, mp_policy: Any = None) -> Any:
    """FSDP2: shard each decoder layer, then the whole model, in place; returns it.
    ``mp_policy``: ``Precision.fsdp_policy()`` (None: compute in the parameters' dtype). What
    it changes for the update (averaged gradients, lock-step): ``docs/scaleout.md``."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as err:  # torch < 2.6
        raise ImportError(f"fsdp=true needs torch >= 2.6 (torch.distributed.fsdp.fully_shard): {err}") from None
    kwargs = {"mp_policy": mp_policy} if mp_policy is not None else {}
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def run_main(main: Callable[[], int]) -> int:
    """Run ``main``; under torchrun an exception is one line ``rank R of K failed: Error:
    message`` and the traceback, and exit 1 (torchrun stops every rank and reports this one)."""
    try:
        return main()
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001 (any failure must name its rank)
        rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        if rank is None:
            raise
        print(f"rank {rank} of {world} failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        traceback.print_exc()
        sys.exit(1)


# ---------------------------------------------------------------------- FSDP2 inside the Trainer


def copy_into(full_model: Any, sharded: Any) -> None:
    """Gather ``sharded``'s weights into the plain replica ``full_model`` (every rank calls
    it), one parameter at a time (not a second whole model)."""
    params = dict(full_model.named_parameters())
    buffers = dict(full_model.named_buffers())
    with torch.no_grad():
        for name, p in sharded.named_parameters():
            params[name].copy_(p.full_tensor() if hasattr(p, "full_tensor") else p)
        for name, b in sharded.named_buffers():  # (not sharded by FSDP2)
            buffers[name].copy_(b)


def sharded_masks(model: Any, masks: dict[str, torch.Tensor]) -> list[tuple[Any, Any]]:
    """``algos.engine.freeze.frozen_masks``' masks as (parameter, mask) pairs, each mask laid out
    like its FSDP2 parameter, so that ``grad * mask`` zeroes the frozen elements of a shard."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = dict(model.named_parameters(remove_duplicate=False))
    out = []
    for name, mask in masks.items():
        p = params[name]
        m = mask.to(dtype=p.dtype, device=p.device if not isinstance(p, DTensor) else p.to_local().device)
        out.append((p, distribute_tensor(m, p.device_mesh, p.placements) if isinstance(p, DTensor) else m))
    return out


def full_optimizer_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The FSDP2 ``optimizer``'s whole state in a plain AdamW's ``state_dict()`` layout, so a
    checkpoint loads at any world size. Every rank calls it; it is gathered into rank 0's CPU
    memory, never whole on a GPU (the other ranks get ``{}``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    sd = get_optimizer_state_dict(model, optimizer,
                                  options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not sd.get("param_groups"):  # not rank 0
        return {}
    index = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[n] for n in g["params"]]}
              for g in sd["param_groups"]]
    return {"state": {index[n]: s for n, s in sd["state"].items()}, "param_groups": groups}


def load_full_optimizer_state(model: Any, optimizer: Any, plain: dict[str, Any]) -> None:
    """Load a plain optimizer state dict (:func:`full_optimizer_state`'s layout, or one
    process's ``optimizer.state_dict()``) into the FSDP2 ``optimizer``. Every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [name for name, _ in model.named_parameters()]
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[i] for i in g["params"]]}
              for g in plain["param_groups"]]
    sd = {"state": {names[int(i)]: s for i, s in plain["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, optim_state_dict=sd,
                             options=StateDictOptions(full_state_dict=True))


def local_norm(norm: Any) -> float:
    """A gradient norm as a float (an FSDP2 norm is a DTensor: its full value)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def local_tensor(t: Any) -> torch.Tensor:
    """This rank's part of ``t`` (an FSDP2 DTensor's shard; a plain tensor itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


class FullOptimizer:
    """An FSDP2 ``optimizer`` as ``algos.engine.checkpoint`` sees it: one process's layout,
    ``gathered`` before a save; a loaded one is scattered back onto the shards."""

    def __init__(self, model: Any, optimizer: Any, gathered: dict[str, Any] | None = None):
        self.model, self.optimizer, self.gathered = model, optimizer, gathered

    def state_dict(self) -> dict[str, Any] | None:
        return self.gathered

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_full_optimizer_state(self.model, self.optimizer, state)


class Replicated:
    """Every rank holds all of the trained model, which is also the replica that generates,
    scores, validates and is saved."""

    chunk_elements: int | None = None
    """``agents.logprobs.token_logprobs``' output layer chunking (None: its default)."""

    def __init__(self, dist: Dist):
        self.dist = dist

    def prepare(self, model: Any, precision: Any) -> Any:
        """Lay ``model`` (the trained one) out; returns the replica that reads its weights."""
        return model

    def frozen(self, model: Any) -> contextlib.AbstractContextManager[Any]:
        """The context of an update: what ``model`` declares frozen gets no gradient."""
        from algos.engine.freeze import frozen

        return frozen(model)

    def mask_frozen_grads(self) -> None:
        """(The hooks of :meth:`frozen` did it.)"""

    def chunk_count(self, chunks: int) -> int:
        """How many chunks this rank runs in a minibatch where it has ``chunks``."""
        return chunks

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss whose backward gives this rank's share of the summed gradient."""
        return loss

    def any_rank(self, flag: bool) -> bool:
        """``flag`` where every rank must act on it together (FSDP2's lock-step); here this rank's."""
        return flag

    def reduce_grads(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Sum the ranks' gradients after a minibatch's backwards."""
        self.dist.all_reduce_grads(parameters)

    def sync_replica(self, replica: Any, model: Any) -> None:
        """Bring the replica up to the trained weights (it is the trained model: nothing)."""

    def checkpoint_optimizer(self, model: Any, optimizer: Any, gather: bool = False) -> Any:
        """What a checkpoint saves (``gather``: every rank calls it) or loads as the optimizer."""
        return optimizer


class Sharded(Replicated):
    """FSDP2 (``TrainConfig.fsdp``): each rank holds a shard of the trained model and a gathered
    replica; what else differs: ``docs/scaleout.md``, "FSDP2 inside the Trainer"."""

    chunk_elements = 0  # the model's own forward: FSDP2 gathers parameters in the root module's

    def __init__(self, dist: Dist):
        super().__init__(dist)
        self.masks: list[tuple[Any, Any]] = []

    def prepare(self, model: Any, precision: Any) -> Any:
        import copy

        from algos.engine.freeze import frozen_masks

        replica = copy.deepcopy(model)
        masks = frozen_masks(model)  # full shapes, before sharding
        fully_shard_model(model, mp_policy=precision.fsdp_policy())
        self.masks = sharded_masks(model, masks)
        return replica

    def frozen(self, model: Any) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # (masks on the shards: mask_frozen_grads)

    def mask_frozen_grads(self) -> None:
        for p, mask in self.masks:
            if p.grad is not None:
                p.grad.mul_(mask)

    def chunk_count(self, chunks: int) -> int:
        most = torch.tensor([chunks], device=self.dist.device)
        torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
        return int(most.item())

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.dist.world

    def any_rank(self, flag: bool) -> bool:
        return self.dist.any(flag)

    def reduce_grads(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """(The reduce-scatter in each backward did it.)"""

    def sync_replica(self, replica: Any, model: Any) -> None:
        copy_into(replica, model)

    def checkpoint_optimizer(self, model: Any, optimizer: Any, gather: bool = False) -> Any:
        return FullOptimizer(model, optimizer, full_optimizer_state(model, optimizer) if gather else None)


def layout_for(dist: Dist, fsdp: bool) -> Replicated:
    """:class:`Sharded` with ``fsdp`` (refused outside torchrun), else :class:`Replicated`."""
    if not fsdp:
        return Replicated(dist)
    if not dist.launched:
        raise ValueError("fsdp=true shards the model over torchrun's ranks: run under `torchrun "
                         "--nproc-per-node K -m algos train ...` (one process has nothing to shard)")
    return Sharded(dist)
