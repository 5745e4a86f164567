"""The `.bin` byte stream of a shard being written: file writes, sha256 and writeback on
threads of their own."""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable

from draftsmith.formats.shards.layout import ShardError

# Writes smaller than this are gathered into one buffer before they reach the I/O threads.
_COALESCE = 1 << 20
# Queued buffers per I/O thread (views of host memory, not copies).
_SINK_DEPTH = 32
# Every this many bytes written, writeback of them is started and older pages are
# dropped (see `_Sink`), so dirty data never piles up for the final fsync. 0 leaves
# it all to the kernel.
_WRITEBACK_CHUNK = 128 << 20


class _Sink:
    """The `.bin` byte stream: file writes, sha256 and writeback each on their own thread.

    All three release the GIL, so they overlap each other and the caller's
    encoding and compression. Buffers are queued as views (never copied),
    except writes under `_COALESCE` bytes, which are gathered first. Every
    `_WRITEBACK_CHUNK` bytes the write thread hands the range to the writeback
    thread, which starts writing it to disk (posix_fadvise DONTNEED starts
    writeback of dirty pages and drops clean ones) and drops the range two
    before it, written back by then. Without that the kernel would hold many GB
    dirty until close()'s fsync, and with it on the write thread the page-cache
    copies would wait for the disk. `write()` raises the first I/O error;
    `finish()` drains, joins and raises it too. `busy` sums each thread's
    working seconds.
    """

    def __init__(self, file) -> None:
        self._file = file
        self.digest = hashlib.sha256()
        self.error: BaseException | None = None
        self.busy = {"io": 0.0, "sha256": 0.0, "writeback": 0.0}
        self._small = bytearray()
        self._stopped = False
        self._written = self._handed = 0
        self._queues = [queue.Queue(maxsize=_SINK_DEPTH) for _ in range(2)]
        self._ranges: queue.Queue = queue.Queue()
        work = (("io", self._write_file), ("sha256", self.digest.update))
        self._threads = [
            threading.Thread(target=self._drain, args=(q, label, fn), name=f"shard-{label}", daemon=True)
            for q, (label, fn) in zip(self._queues, work, strict=True)
        ]
        self._writeback = threading.Thread(target=self._write_back, name="shard-writeback", daemon=True)
        for thread in (*self._threads, self._writeback):
            thread.start()

    def write(self, view: memoryview) -> None:
        if len(view) < _COALESCE:
            self._small += view
            if len(self._small) >= _COALESCE:
                self._flush_small()
            return
        self._flush_small()
        self._put(view)

    def _flush_small(self) -> None:
        if self._small:
            small, self._small = self._small, bytearray()
            self._put(small)

    def _put(self, item) -> None:
        if self.error is not None:
            raise self.error
        for q in self._queues:
            q.put(item)

    def _drain(self, q: queue.Queue, label: str, consume: Callable) -> None:
        while (item := q.get()) is not None:
            if self.error is None:
                start = time.perf_counter()
                try:
                    consume(item)
                except BaseException as exc:  # raised in the caller's thread
                    self.error = exc
                self.busy[label] += time.perf_counter() - start

    def _write_file(self, data) -> None:
        view = memoryview(data)
        while view:
            view = view[self._file.write(view) :]
        self._written += len(data)
        if _WRITEBACK_CHUNK and self._written - self._handed >= _WRITEBACK_CHUNK:
            self._ranges.put((self._handed, self._written))
            self._handed = self._written

    def _write_back(self) -> None:
        """Start writeback of each range handed over; drop the pages of the one two before."""
        fd = self._file.fileno()
        started: list[tuple[int, int]] = []
        while (span := self._ranges.get()) is not None:
            if self.error is not None:
                continue
            start = time.perf_counter()
            try:
                for first, end in [span, *started[:-1]]:
                    os.posix_fadvise(fd, first, end - first, os.POSIX_FADV_DONTNEED)
            except OSError:  # advisory only: close()'s fsync still makes the data durable
                pass
            started = [*started[-1:], span]
            self.busy["writeback"] += time.perf_counter() - start

    def _stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for q in self._queues:
            q.put(None)
        for thread in self._threads:
            thread.join()
        self._ranges.put(None)  # after the write thread, the only one that hands ranges over
        self._writeback.join()

    def finish(self) -> None:
        try:
            self._flush_small()
        finally:
            self._stop()
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        if self.error is None:
            self.error = ShardError("shard writer aborted")
        self._stop()
