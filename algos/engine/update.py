"""One update of the policy on 1..K processes: the trained rows in ``minibatches`` optimizer
steps, each minibatch's gradient accumulated in chunks of at most ``max_tokens_per_batch``
padded tokens, all or nothing.

The engine runs rows and knows no roles: a row says whether it is trained (``Row.trained``)
and whether the KL toward the Teacher is on its tokens (``Row.kl``), both set once by
``algos.roles.assign_advantages``. Where the rows' gradients are computed (one process, the
summed gradients of K ranks, FSDP2's shards) is the ``layout``'s business
(``algos.engine.distributed``); this file tells the one-process story and calls its
collectives unconditionally (the identity in one process).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from agents.logprobs import token_logprobs
from algos.batch import Row, batches_by_tokens, pad_rows, split_flat
from algos.engine.distributed import Replicated, local_norm, local_tensor
from algos.losses import LossOutput, Totals, policy_loss

__all__ = ["NonFiniteLoss", "Update", "WeightOverflow", "totals_of"]

STATS = ("policy", "kl", "clip", "approx_kl", "loss")


class NonFiniteLoss(RuntimeError):
    """A step was skipped: a loss, a gradient norm or an updated weight was NaN or infinite.
    The step changed nothing (parameters and optimizer state are as before it) and does
    not count toward ``TrainConfig.steps``."""


class WeightOverflow(RuntimeError):
    """Finite gradients made a weight non-finite in the one optimizer step of an update that
    kept no snapshot (one minibatch): there is nothing to go back to."""


def totals_of(rows: Sequence[Row]) -> Totals:
    """The denominators of ``rows`` as one minibatch (the KL ones from ``Row.kl``)."""
    return Totals.of_rows([r.num_targets for r in rows], [r.kl for r in rows])


class Update:
    """``Update(...).step(rows, step) -> stats``: one update of ``model`` by ``optimizer``.

    ``settings``: anything with the attributes ``minibatches``, ``max_tokens_per_batch``,
    ``max_grad_norm``, ``clip_eps``, ``kl_coef``, ``aggregation``, ``sampling`` (its temperature) and
    ``freeze_embeddings`` (a ``TrainConfig``), read at each step. ``rng`` orders the
    minibatches; ``pad_id`` pads rows."""

    def __init__(self, model: Any, optimizer: Any, layout: Replicated, precision: Any, settings: Any, *,
                 rng: np.random.Generator, pad_id: int = 0):
        self.model, self.optimizer, self.layout, self.precision = model, optimizer, layout, precision
        self.settings, self.rng, self.pad_id = settings, rng, pad_id

    def score(self, rows: Sequence[Row], *scorers: Callable[[list[Row]], None]) -> None:
        """Steps 2-3's scoring, split across the ranks by tokens: each ``scorer(mine)`` fills
        ``old_logp`` or ``teacher_logp`` of this rank's rows; then every rank holds every row's."""
        mine = self.layout.dist.shard(rows)
        with self.precision.compute():
            for scorer in scorers:
                scorer(mine)
        self.layout.dist.gather_row_values(rows, mine, ("old_logp", "teacher_logp"))

    def sync_replica(self, full_model: Any) -> Any:
        """``full_model`` (what generates and is saved) made equal to the trained weights."""
        self.layout.sync_replica(full_model, self.model)
        return full_model

    def step(self, rows: Sequence[Row], step: int = 1) -> dict[str, float]:
        """``minibatches`` optimizer steps over the trained rows (``step`` names the update in
        messages); the update's means under stable names (``losses/...``).

        All or nothing: a non-finite loss, gradient norm or updated weight puts the parameters
        and the optimizer state back and raises :class:`NonFiniteLoss`. The snapshot that
        allows it is taken only with several minibatches: with one, the checks before its
        single step suffice, and a large model does not pay a copy of itself every step; the
        one case they miss, a weight overflowed by the step, raises :class:`WeightOverflow`."""
        s = self.settings
        trained = [r for r in rows if r.trained]
        if not trained:
            return {"losses/policy": 0.0, "losses/kl_teacher": 0.0, "losses/clip_fraction": 0.0,
                    "losses/approx_kl": 0.0, "losses/grad_norm": 0.0, "losses/tokens": 0.0, **self.layout.dist.metrics()}
        order = self.rng.permutation(len(trained))
        parts = [[trained[i] for i in p] for p in np.array_split(order, min(s.minibatches, len(trained)))]
        totals = [totals_of(mb) for mb in parts]  # one per minibatch; the update's are their sums
        tokens, kl_tokens = sum(t.tokens for t in totals), sum(t.kl_tokens for t in totals)
        sums = dict.fromkeys(("policy", "kl", "clip", "approx_kl"), 0.0)
        grad_norms = []
        snapshot = self._snapshot() if len(parts) > 1 else None
        self.model.train()
        try:
            # what the model declares frozen (config.mopd_frozen) stays put (FSDP2: masks on the shards)
            with self.layout.frozen(self.model):
                for m, (mb, mb_totals) in enumerate(zip(parts, totals)):
                    where = f"minibatch {m + 1} of {len(parts)} at step {step}"
                    self.optimizer.zero_grad(set_to_none=True)
                    stats = self.backward(mb, mb_totals, where)
                    for key in ("policy", "clip", "approx_kl"):  # minibatch means, weighted by its tokens
                        sums[key] += stats[key] * mb_totals.tokens / tokens
                    sums["kl"] += stats["kl"] * mb_totals.kl_tokens / max(kl_tokens, 1.0)
                    if s.freeze_embeddings:
                        self.model.get_input_embeddings().weight.grad = None
                    self.layout.mask_frozen_grads()
                    norm = local_norm(torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.max_grad_norm))
                    if not math.isfinite(norm):
                        raise _skipped(f"gradient norm {norm} in {where}")
                    grad_norms.append(norm)
                    self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            overflow = not all(bool(torch.isfinite(local_tensor(p)).all()) for p in self.model.parameters())
            if self.layout.any_rank(overflow):  # (FSDP2: a shard's overflow stops every rank)
                if snapshot is None:
                    raise WeightOverflow(f"step {step} made a weight non-finite (learning rate "
                                         f"{self.optimizer.param_groups[0]['lr']}?)")
                raise _skipped(f"a non-finite weight after step {step}")
        except NonFiniteLoss:
            self._restore(snapshot)
            raise
        return {"losses/policy": sums["policy"], "losses/kl_teacher": sums["kl"],
                "losses/clip_fraction": sums["clip"], "losses/approx_kl": sums["approx_kl"],
                "losses/grad_norm": float(np.mean(grad_norms)), "losses/tokens": tokens,
                **self.layout.dist.metrics()}

    def backward(self, mb: Sequence[Row], totals: Totals | None = None, where: str = "a minibatch") -> dict[str, float]:
        """Accumulate the gradient of minibatch ``mb`` (this rank's share of it), chunk by chunk,
        every chunk over ``mb``'s ``totals``, so neither the loss nor the gradient depends on
        ``max_tokens_per_batch`` or the world size; returns the minibatch's means (:data:`STATS`)
        summed over the ranks. A non-finite loss on any rank raises :class:`NonFiniteLoss`."""
        totals = totals if totals is not None else totals_of(mb)
        mine = sorted(self.layout.dist.shard(list(mb)), key=lambda r: len(r.token_ids))  # less padding
        chunks: list[list[Row] | None] = list(batches_by_tokens(mine, self.settings.max_tokens_per_batch))
        chunks += [None] * (self.layout.chunk_count(len(chunks)) - len(chunks))  # (FSDP2's lock-step)
        stats = dict.fromkeys(STATS, 0.0)
        why = None
        for chunk in chunks:
            out = self.chunk_loss(chunk if chunk is not None else [mb[0]], totals)
            bad = chunk is not None and not bool(torch.isfinite(out.loss))
            if self.layout.any_rank(bad):  # (FSDP2: every rank stops at the same chunk)
                why = f"loss {out.loss.item()}" if bad else "a non-finite loss on another rank"
                break
            if chunk is None:  # lock-step padding: the collectives run, the gradient is 0
                (out.loss * 0.0).backward()
                continue
            self.layout.scaled(out.loss).backward()
            share = sum(r.num_targets for r in chunk) / totals.tokens
            stats["policy"] += out.policy_loss  # chunk shares of the minibatch's means: they add up
            stats["kl"] += out.kl
            stats["loss"] += float(out.loss.detach())
            stats["clip"] += out.clip_fraction * share  # chunk means over its tokens: weighted
            stats["approx_kl"] += out.approx_kl_old * share
        if self.layout.dist.any(why is not None):
            raise _skipped(f"{why or 'a non-finite loss on another rank'} in {where}")
        self.layout.reduce_grads(list(self.model.parameters()))
        return self.layout.dist.sum_floats(stats)

    def chunk_loss(self, chunk: list[Row], totals: Totals | None = None) -> LossOutput:
        """The loss of ``chunk`` (rows of one minibatch) with the minibatch's ``totals`` as
        denominators (default: the chunk's own). Every per-token tensor is (B, N_max): row b's
        generated tokens, right-padded, with ``mask`` 1 on real ones."""
        s = self.settings
        device = next(self.model.parameters()).device
        counts = [r.num_targets for r in chunk]
        for r, n in zip(chunk, counts):
            if not len(r.old_logp) == len(r.advantages) == n:
                raise ValueError(f"a row of {r.role or 'a bare row'} has {n} target tokens but "
                                 f"{len(r.old_logp)} old log-probs and {len(r.advantages)} advantages")
        totals = totals if totals is not None else totals_of(chunk)
        ids, att, tgt = (t.to(device) for t in pad_rows(chunk, self.pad_id))
        # (N,) with graph; FSDP2 gathers parameters in the root module's forward, which the
        # chunked output layer (decoder, then head) bypasses: the model's own forward there
        with self.precision.compute(cache=False):  # (the backward runs outside: autocast recorded each op's dtype)
            flat = token_logprobs(self.model, ids, att, tgt, s.sampling.temperature, chunk_elements=self.layout.chunk_elements)

        def per_row(pieces: Sequence[Any]) -> torch.Tensor:  # B pieces of (n_b,) -> (B, N_max)
            return torch.nn.utils.rnn.pad_sequence(
                [torch.as_tensor(p, dtype=flat.dtype, device=device) for p in pieces], batch_first=True)

        logp = torch.nn.utils.rnn.pad_sequence(split_flat(flat, chunk), batch_first=True)
        old = per_row([r.old_logp for r in chunk])
        adv = per_row([r.advantages for r in chunk])
        mask = per_row([np.ones(n) for n in counts])
        ref = kl_mask = None
        if any(r.kl for r in chunk):
            ref = per_row([r.teacher_logp if r.kl else r.old_logp for r in chunk])
            kl_mask = per_row([np.full(n, float(r.kl)) for n, r in zip(counts, chunk)])
        return policy_loss(logp, old, adv, mask, clip_eps=s.clip_eps, ref_logp_BT=ref, kl_mask_BT=kl_mask,
                           kl_coef=s.kl_coef, aggregation=s.aggregation, totals=totals)

    def _snapshot(self) -> tuple[list[torch.Tensor], dict[str, Any]]:
        """Copies of the parameters and of the optimizer state, for :meth:`_restore`."""
        params = [p.detach().clone() for p in self.model.parameters()]
        return params, copy.deepcopy(self.optimizer.state_dict())

    def _restore(self, snapshot: tuple[list[torch.Tensor], dict[str, Any]] | None) -> None:
        """Undo this update: no gradient, the parameters and optimizer state of ``snapshot``."""
        self.optimizer.zero_grad(set_to_none=True)
        if snapshot is not None:
            params, optimizer_state = snapshot
            with torch.no_grad():
                for p, saved in zip(self.model.parameters(), params, strict=True):
                    p.copy_(saved)
            self.optimizer.load_state_dict(optimizer_state)


def _skipped(why: str) -> NonFiniteLoss:
    return NonFiniteLoss(f"{why}: the step is skipped, nothing of it applied")
