"""The retrieval server's queue: requests served a query at a time, fairly
(:class:`FairQueue`), so a one-query request is not held behind large ones."""

from __future__ import annotations

import asyncio
import heapq
from dataclasses import dataclass, field


@dataclass
class Job:
    """One validated request's queries, served by the batcher a few at a time.

    ``pieces[i]`` is query i's rendered hit list once a batch has served it; ``reply`` is
    set when every query is served (200) or one of them failed (5xx)."""

    queries: list[str]
    topk: int
    return_scores: bool
    future: asyncio.Future | None = None
    reply: tuple[int, bytes] | None = field(default=None, repr=False)
    taken: int = 0
    """Queries handed to batches so far."""
    answered: int = 0
    """Queries served so far."""
    abandoned: bool = False
    """The client got its 503 (``request_timeout_s``): serve no more of it."""
    pieces: list[bytes | None] = field(default_factory=list, repr=False)


Segment = tuple[Job, int, int]
"""Queries ``start:stop`` of a job, in one batch."""


class FairQueue:
    """Requests waiting for the retriever, served a query at a time by start-time fair queuing
    (docs/retrieval_server.md says why, and why the cost counted is queries).

    A request's tag is the virtual time it arrived at, plus one per query taken since;
    :meth:`take` fills a batch, each query from the request with the lowest tag, among equals
    the one with the fewest queries left (then the earliest). Used from the event loop only.
    """

    def __init__(self, max_batch: int):
        self.max_batch = max_batch
        self.queued = 0
        """Queries waiting, not yet taken into a batch."""
        self._heap: list[tuple[int, int, int, Job]] = []  # (tag, left, arrival, job)
        self._vtime = 0
        self._arrivals = 0

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, job: Job) -> None:
        left = len(job.queries) - job.taken
        if left > 0:
            self._arrivals += 1
            heapq.heappush(self._heap, (self._vtime, left, self._arrivals, job))
            self.queued += left

    def discard(self, job: Job) -> None:
        for n, entry in enumerate(self._heap):
            if entry[3] is job:
                self._heap[n] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                self.queued -= entry[1]
                return

    def drain(self) -> list[Job]:
        jobs = [entry[3] for entry in self._heap]
        self._heap, self.queued = [], 0
        return jobs

    def take(self) -> list[Segment]:
        """The next batch: (job, start, stop) segments in the order their queries are searched."""
        batch: list[Segment] = []
        room = self.max_batch
        while room > 0 and self._heap:
            tag, left, arrival, job = heapq.heappop(self._heap)
            self._vtime = tag
            if batch and batch[-1][0] is job:  # the same request again: extend its segment
                _, start, _ = batch.pop()
            else:
                start = job.taken
            job.taken += 1
            batch.append((job, start, job.taken))
            room -= 1
            self.queued -= 1
            if left > 1:
                heapq.heappush(self._heap, (tag + 1, left - 1, arrival, job))
        return batch
