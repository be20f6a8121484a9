"""The dynamic batcher's request queue: one FIFO of entries, de-duplicated by key, with withdrawal.

One concept: what waits for a batch. An entry is one distinct item with the callers (futures) waiting
for it; a request whose key equals that of a queued entry joins it instead of adding a row (the
de-duplication window is the queue). A caller that gives up leaves at once, and an entry left with no
caller leaves the queue, so it never reaches the model. ``waiting`` counts requests (duplicates
included), which is what ``max_queue_size`` bounds. The batcher
(:mod:`course_lib.serving.batching.batcher`) decides when to take how many entries; this module only
keeps them and counts in :class:`BatcherStats`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from course_lib.serving.batching._results import BatcherClosedError, BatcherStats


@dataclass(eq=False)  # identity, not field equality: two equal items are two entries
class QueueEntry:
    """One distinct queued item and its waiting callers as ``(future, arrival_ns)`` pairs, oldest first."""

    item: Any
    key: Hashable | None
    arrival_ns: int
    waiters: list[tuple[asyncio.Future, int]] = field(default_factory=list)


class RequestQueue:
    """FIFO of :class:`QueueEntry`; joins duplicates by key and counts outcomes in ``stats``.

    Parameters
    ----------
    stats : BatcherStats
        The batcher's counters; ``deduplicated``, ``cancelled_by_caller`` and ``closed_before_scoring``
        are counted here.
    """

    def __init__(self, stats: BatcherStats):
        self.stats = stats
        self._entries: deque[QueueEntry] = deque()
        self._by_key: dict[Hashable, QueueEntry] = {}
        self.waiting = 0  # requests, duplicates included

    def __len__(self) -> int:
        """Distinct entries (rows a batch would hold)."""
        return len(self._entries)

    @property
    def oldest_arrival_ns(self) -> int:
        """``perf_counter_ns`` arrival of the oldest entry. Raises ``IndexError`` when empty."""
        return self._entries[0].arrival_ns

    def add(self, item: Any, key: Hashable | None, future: asyncio.Future, now_ns: int) -> QueueEntry:
        """Queue ``future``'s request: join the queued entry with an equal ``key``, else a new entry."""
        entry = self._by_key.get(key) if key is not None else None
        if entry is not None:
            entry.waiters.append((future, now_ns))
            self.stats.deduplicated += 1
        else:
            entry = QueueEntry(item, key, now_ns, [(future, now_ns)])
            self._entries.append(entry)
            if key is not None:
                self._by_key[key] = entry
        self.waiting += 1
        return entry

    def withdraw(self, entry: QueueEntry, future: asyncio.Future) -> bool:
        """The caller of ``future`` cancelled: free its slot now if its entry is still queued.

        A queued entry loses this waiter; an entry left with no waiters leaves the queue. Counted
        once in ``cancelled_by_caller`` here; returns False (nothing counted) when the entry was
        already taken for a batch or failed by a stop, where the caller is counted instead.
        """
        waiter = next((w for w in entry.waiters if w[0] is future), None)
        if waiter is None or not any(e is entry for e in self._entries):
            return False
        entry.waiters.remove(waiter)
        self.waiting -= 1
        self.stats.cancelled_by_caller += 1
        if not entry.waiters:
            self._entries.remove(entry)
            if entry.key is not None and self._by_key.get(entry.key) is entry:
                del self._by_key[entry.key]
        return True

    def fail_all(self, error: BatcherClosedError) -> None:
        """Empty the queue: every still-waiting caller gets a copy of ``error``."""
        while self._entries:
            entry = self._entries.popleft()
            for future, _ in entry.waiters:
                if future.cancelled():
                    self.stats.cancelled_by_caller += 1
                elif not future.done():
                    future.set_exception(BatcherClosedError(str(error)))
                    self.stats.closed_before_scoring += 1
        self._by_key.clear()
        self.waiting = 0

    def take(self, size: int) -> list[QueueEntry]:
        """Remove and return the ``size`` oldest entries (a new request with their key starts a new entry)."""
        entries = [self._entries.popleft() for _ in range(size)]
        for entry in entries:
            if entry.key is not None:
                self._by_key.pop(entry.key, None)
            self.waiting -= len(entry.waiters)
        return entries
