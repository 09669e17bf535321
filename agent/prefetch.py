"""Read-ahead of one batch: the next GetRecords runs while the processor handles the current batch.

KCL's polling retrieval prefetches the same way; a processor that takes as long as a GetRecords call (a MultiLang
child answering a checkpoint, say) then costs no read time. Invariants: batches come out in the order the reader made
them, and a read error comes out in its place after the batches before it; at most one batch waits (the read-ahead
thread blocks until it is taken); `stop` ends the thread within a poll and makes `read_batch` return at once (the
reader's own empty batch), so a stopped shard never keeps a thread or a GetRecords loop alive.
"""

from __future__ import annotations

import queue
import threading

from shardherd.agent.reader import Batch, ShardReader

POLL_SECONDS = 0.1


class Prefetcher:
    """Wraps a ShardReader with `read_batch` and `stop` as the reader has them."""

    def __init__(self, reader: ShardReader, name: str) -> None:
        self._reader = reader
        self._ready: queue.Queue[Batch | Exception] = queue.Queue(maxsize=1)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def read_batch(self) -> Batch:
        """The next batch read ahead (or the error reading it raised); the reader's empty batch once stopped."""
        while not self._stopped.is_set():
            try:
                item = self._ready.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if isinstance(item, Exception):
                raise item
            return item
        return self._reader.read_batch()  # stopped: an empty batch, without a call

    def stop(self) -> None:
        """Stop reading ahead and wake a waiting `read_batch`."""
        self._stopped.set()
        self._reader.stop()

    def _run(self) -> None:
        while not self._stopped.is_set():
            item: Batch | Exception
            try:
                item = self._reader.read_batch()
            except Exception as exc:  # handed to the shard thread, which decides as without read-ahead
                item = exc
            while not self._stopped.is_set():
                try:
                    self._ready.put(item, timeout=POLL_SECONDS)
                    break
                except queue.Full:
                    continue
            if isinstance(item, Exception) or item.shard_ended:
                return
