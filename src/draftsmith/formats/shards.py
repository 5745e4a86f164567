"""The hidden-state shard format: many samples' target activations in two files.

A shard `name` in a directory is

- `<name>.bin`: the data, a sequence of blobs, each starting at a multiple of 64
  bytes (zero padding between them) so memory-mapped views are aligned for any
  dtype and for vectorised loads;
- `<name>.json`: the index and manifest, written last and atomically. A shard
  without its `.json` is incomplete, whatever else exists.

The writer streams the `.bin` into `.tmp-<name>.bin@<owner>.<random>` in the same
directory (see `atomic.TMP_PREFIX`), hashing it as it goes; `close()` fsyncs it,
removes any stale `<name>.json`, renames the data into place and then writes the
`.json`. A crash at any point therefore leaves no partial file under a final
name, and no index that describes other data.

Per sample the writer stores, in this order (the manifest's `layout.blobs`):

- `input_ids`: int32 little-endian, T values (returned as int64);
- `loss_mask`: uint8, T values (0 or 1);
- `aux`: the three aux-layer hidden states concatenated, (T, 3H);
- `final`: the final hidden state after the target's final norm, (T, H);
- fp8 mode only: `aux_scale` (float32, (T, 3): one scale per token per aux layer)
  and `final_scale` (float32, (T,)).

The hidden states are stored per `mode`:

- `raw` (lossless): the tensor's bytes, little-endian, in the shard dtype
  (float32, bfloat16 or float16). Reading memory-maps the `.bin` and returns
  views of exactly that sample's bytes.
- `zstd` (lossless): the bytes are shuffled into planes (byte 0 of every value,
  then byte 1, ...; for bf16 the low-byte plane then the high-byte plane) and
  compressed as one zstd frame (`zstd_level`, default 1; `zstd_threads`: 0 one
  thread, N workers, -1 all cores; with threads, up to `_ZSTD_JOBS` blobs are
  compressed at once, each with its share of them, which changes no byte: zstd's
  output is the same for every thread count >= 1). Shuffling groups the
  sign/exponent bytes, which carry little entropy, away from the noisy low
  mantissa bytes; that is where the gain comes from. ids and mask stay raw: they
  are ~5 bytes of ~8H per token.
- `fp8` (lossy, opt-in): per-token scaled float8 e4m3, scale = max|x| / 448 over
  each H-wide slice (so each aux layer gets its own scale), zero rows scale 1.
  The reader dequantises to the shard dtype; the writer records the relative
  Frobenius error it introduced (overall and worst sample) in the manifest.

Encoding (checks, byte shuffle, fp8 quantisation and its error sums) is plain
torch, so it runs where the tensors are: `ShardWriter.encode` turns a padded
batch into storage form (on the GPU during extraction, before the copy to the
host) and `ShardWriter.add_encoded` stores one row of it; `add` does both for a
single CPU sample. The bytes are the same either way. The file write, the
sha256 and the starting of writeback (every `_WRITEBACK_CHUNK` bytes) run on
three background threads (all release the GIL; see `_Sink`), so the disk is
busy from the start and `close()`'s fsync has little left to do.

The per-sample index is a list of compact rows `[id, num_tokens, [offset,
length], ...]`, one line per sample, with the blob order given once in
`layout.blobs`, so a 10k-sample index stays small yet readable.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import math
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from draftsmith.errors import DraftsmithError
from draftsmith.store import atomic
from draftsmith.store.hashing import sha256_file
from draftsmith.store.plan import SHARD_SUFFIXES
from draftsmith.target.dtypes import DTYPES

SHARD_FORMAT_VERSION = 1
MODES = ("raw", "zstd", "fp8")
ALIGNMENT = 64
# REFERENCE.md measured byte-shuffled zstd level 1 at ~1.45-1.47x on real bf16
# activations, i.e. stored bytes ~ 0.69 of raw.
ZSTD_EXPECTED_RATIO = 0.69
FP8_MAX = 448.0  # largest finite float8_e4m3fn value

# numpy has no bfloat16: its bits travel as int16 and are re-viewed on the torch side.
_STORAGE_DTYPES = {"float32": np.dtype("<f4"), "bfloat16": np.dtype("<i2"), "float16": np.dtype("<f2")}
_BASE_BLOBS = ("input_ids", "loss_mask", "aux", "final")
_FP8_BLOBS = ("aux_scale", "final_scale")
_PAD = bytes(ALIGNMENT)
# Writes smaller than this are gathered into one buffer before they reach the I/O threads.
_COALESCE = 1 << 20
# Queued buffers per I/O thread (views of host memory, not copies).
_SINK_DEPTH = 32
# Every this many bytes written, writeback of them is started and older pages are
# dropped (see `_Sink`), so dirty data never piles up for the final fsync. 0 leaves
# it all to the kernel.
_WRITEBACK_CHUNK = 128 << 20
# zstd_threads != 0: blobs compressed at once (each with its share of the threads;
# zstd's output is the same for any thread count >= 1) and samples kept in flight.
_ZSTD_JOBS = 4
_ZSTD_PENDING = 16
# Integer view and exponent bits per dtype; an all-ones exponent means NaN or Inf.
_EXPONENT_MASKS = {
    torch.float32: (torch.int32, np.int32(0x7F800000)),
    torch.bfloat16: (torch.int16, np.int16(0x7F80)),
    torch.float16: (torch.int16, np.int16(0x7C00)),
}


class ShardError(DraftsmithError):
    pass


@dataclass
class Sample:
    id: str
    input_ids: torch.Tensor  # int64 (T,)
    loss_mask: torch.Tensor  # uint8 (T,)
    aux: torch.Tensor  # (T, 3H), shard dtype
    final: torch.Tensor  # (T, H), shard dtype


def blob_names(mode: str) -> tuple[str, ...]:
    return _BASE_BLOBS + _FP8_BLOBS if mode == "fp8" else _BASE_BLOBS


def bytes_per_token(hidden_size: int, dtype: str, mode: str) -> float:
    """Estimated stored bytes per token, for plan reports (5 = int32 id + uint8 mask)."""
    _check_choice("dtype", dtype, tuple(DTYPES))
    _check_choice("mode", mode, MODES)
    raw = 4 * hidden_size * DTYPES[dtype].itemsize + 5
    if mode == "fp8":
        return 4 * hidden_size + 4 * 4 + 5  # 1-byte values + 4 float32 scales (3 aux, 1 final)
    if mode == "zstd":
        return raw * ZSTD_EXPECTED_RATIO
    return float(raw)


def _check_choice(what: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ShardError(f"unknown shard {what} {value!r}; expected one of {', '.join(choices)}")


# ---------------------------------------------------------------- encoding


def shuffle_bytes(data: np.ndarray) -> np.ndarray:
    """Byte planes of a contiguous array: all bytes 0, then all bytes 1, ... (uint8, flat)."""
    width = data.dtype.itemsize
    return np.ascontiguousarray(data.reshape(-1).view(np.uint8).reshape(-1, width).T).reshape(-1)


def unshuffle_bytes(planes: np.ndarray, dtype: np.dtype) -> np.ndarray:
    width = dtype.itemsize
    return np.ascontiguousarray(planes.reshape(width, -1).T).reshape(-1).view(dtype)


def fp8_quantize(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-group e4m3 values (T, G*W) and float32 scales (T, G)."""
    tokens = x.shape[0]
    xf = x.float().reshape(tokens, groups, -1)
    scale = xf.abs().amax(dim=-1) / FP8_MAX
    # An all-zero slice would divide by zero; any scale reproduces zeros exactly.
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    # Division can round a hair above 448; e4m3fn has no inf, so clamp rather than risk NaN.
    q = (xf / scale.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(tokens, -1), scale


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    tokens, groups = scale.shape
    x = q.reshape(tokens, groups, -1).float() * scale.unsqueeze(-1)
    return x.reshape(tokens, -1).to(dtype)


def non_finite_count(t: torch.Tensor) -> int:
    """NaN/Inf values, found as an all-ones exponent on the integer view.

    Several times faster than torch.isfinite on bf16 (which converts), and the
    writer checks every value it stores.
    """
    int_dtype, exponent = _EXPONENT_MASKS[t.dtype]
    bits = t.contiguous().view(int_dtype).numpy()
    return int(np.count_nonzero((bits & exponent) == exponent))


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """Contiguous numpy view of a CPU tensor's bytes (bf16 and fp8 reinterpreted as ints)."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    elif t.dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8)
    return t.numpy()


# ------------------------------------------------------------------ writer


@dataclass
class _ErrorSums:
    """Running sums for the fp8 relative Frobenius error of one tensor kind."""

    err_sq: float = 0.0
    ref_sq: float = 0.0
    max_sample: float = 0.0

    def add(self, err_sq: float, ref_sq: float) -> None:
        """Account for one sample: squared norms of (reader's value - x) and of x."""
        self.err_sq += err_sq
        self.ref_sq += ref_sq
        self.max_sample = max(self.max_sample, _relative(err_sq, ref_sq))

    def summary(self) -> dict:
        return {"relative_frobenius": _relative(self.err_sq, self.ref_sq), "max_sample": self.max_sample}


def _relative(err_sq: float, ref_sq: float) -> float:
    if ref_sq == 0:
        return 0.0 if err_sq == 0 else math.inf
    return math.sqrt(err_sq / ref_sq)


@dataclass
class EncodedBatch:
    """A padded batch's hidden states in storage form, made by `ShardWriter.encode`.

    Row r is one sample whose first `lengths[r]` positions are real tokens. The
    tensors stay on the device they were made on; copy them to the host with
    `apply` (e.g. into pinned memory) before `ShardWriter.add_encoded`. Per mode
    `tensors` holds, besides `bad` (int32 (B, W, 2): per-token NaN/Inf counts of
    aux and final):

    - raw: `aux` (B, W, 3H) and `final` (B, W, H) in the shard dtype;
    - zstd: `planes`, flat uint8: per row, the byte planes of its aux values,
      then those of its final values (real tokens only);
    - fp8: `aux_q` (B, W, 3H) and `final_q` (B, W, H) as uint8 bits of e4m3,
      `aux_scale` (B, W, 3) and `final_scale` (B, W) float32, and `err`
      (B, W, 4) float32: per token the squared error the reader's values will
      have and the squared norm, for aux then final.
    """

    lengths: list[int]
    tensors: dict[str, torch.Tensor]

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> EncodedBatch:
        return EncodedBatch(list(self.lengths), {k: fn(v) for k, v in self.tensors.items()})


def _non_finite_per_token(t: torch.Tensor) -> torch.Tensor:
    """NaN/Inf count per token (last dim summed), from the exponent bits (any device)."""
    int_dtype, exponent = _EXPONENT_MASKS[t.dtype]
    if t.device.type == "cpu":  # numpy's integer kernels are several times faster than torch's on CPU
        bits = t.view(int_dtype).numpy()
        return torch.from_numpy(((bits & exponent) == exponent).sum(axis=-1, dtype=np.int32))
    mask = int(exponent)
    return ((t.view(int_dtype) & mask) == mask).sum(dim=-1, dtype=torch.int32)


def _fp8_encode(x: torch.Tensor, groups: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(B, W, G*S) -> uint8 e4m3 bits, float32 scales (B, W, G), per-token err_sq and ref_sq."""
    rows, width = x.shape[:2]
    xf = x.reshape(rows * width, -1).float()  # one float32 copy serves quantisation and error sums
    q, scale = fp8_quantize(xf, groups)
    # Against exactly what the reader returns: dequantised, then rounded to the shard dtype.
    # Per-token float32 sums (tree-reduced by torch), added up per sample in float64.
    x_hat = fp8_dequantize(q, scale, dtype).float()
    err_sq = x_hat.sub_(xf).square_().sum(dim=-1)
    ref_sq = xf.square().sum(dim=-1)
    shape = (rows, width)
    return (
        q.view(torch.uint8).reshape(*shape, -1),
        scale.reshape(*shape, groups),
        err_sq.reshape(shape),
        ref_sq.reshape(shape),
    )


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


class ShardWriter:
    """Streams samples into one shard; see the module docstring for the format."""

    def __init__(
        self,
        directory: Path,
        name: str,
        *,
        mode: str,
        hidden_size: int,
        dtype: str,
        meta: dict,
        zstd_level: int = 1,
        zstd_threads: int = 0,
    ) -> None:
        _check_choice("mode", mode, MODES)
        _check_choice("dtype", dtype, tuple(DTYPES))
        if not name or "/" in name or name.startswith("."):
            raise ShardError(f"bad shard name {name!r}")
        if hidden_size <= 0:
            raise ShardError(f"hidden_size must be positive, got {hidden_size}")
        if sys.byteorder != "little":
            raise ShardError("shards are little-endian; this host is big-endian")
        try:
            json.dumps(meta)  # fail now, not in close() after all the work
        except (TypeError, ValueError) as exc:
            raise ShardError(f"shard {name}: meta is not JSON-serialisable ({exc})") from exc
        self.directory = Path(directory)
        self.name = name
        self.mode, self.dtype, self.hidden_size = mode, dtype, hidden_size
        self.meta = meta
        self.zstd_level, self.zstd_threads = zstd_level, zstd_threads
        self._torch_dtype = DTYPES[dtype]
        # zstd_threads 0 compresses inline on the caller's thread; otherwise a small pool does.
        self._compressor = self._make_compressor(0) if mode == "zstd" and zstd_threads == 0 else None
        self._pool: ThreadPoolExecutor | None = None
        if mode == "zstd" and zstd_threads != 0:
            total = (os.cpu_count() or 1) if zstd_threads < 0 else zstd_threads
            jobs = max(1, min(_ZSTD_JOBS, total))
            self._job_threads = max(1, total // jobs)
            self._pool = ThreadPoolExecutor(jobs, thread_name_prefix="shard-zstd")
            self._local = threading.local()
        # Samples checked but not yet written: (id, ids, mask, hidden blobs or their futures).
        self._pending: collections.deque = collections.deque()
        self._rows: list[list] = []
        self._seen: set[str] = set()
        self._num_tokens = 0
        self._raw_bytes = 0
        self._stored_bytes = 0
        self._errors = {kind: _ErrorSums() for kind in ("aux", "final")}
        self._offset = 0
        self._open_temp()

    def _make_compressor(self, threads: int):
        import zstandard

        return zstandard.ZstdCompressor(level=self.zstd_level, threads=threads)

    def _compress(self, data) -> bytes:
        """One blob on a pool thread, with that thread's own compressor (they are not thread-safe)."""
        compressor = getattr(self._local, "compressor", None)
        if compressor is None:
            compressor = self._local.compressor = self._make_compressor(self._job_threads)
        return compressor.compress(data)

    def _open_temp(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            prefix=atomic.temp_prefix(f"{self.name}{SHARD_SUFFIXES['bin']}"), dir=self.directory
        )
        self._tmp_path = Path(tmp)
        # Unbuffered: the sink hands over large buffers, coalescing the small ones itself.
        self._file = os.fdopen(fd, "wb", buffering=0)
        self._done = False
        self._sink = _Sink(self._file)

    @property
    def bin_path(self) -> Path:
        return self.directory / f"{self.name}{SHARD_SUFFIXES['bin']}"

    @property
    def json_path(self) -> Path:
        return self.directory / f"{self.name}{SHARD_SUFFIXES['index']}"

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- adding samples

    def add(self, sample_id: str, input_ids, loss_mask, aux: torch.Tensor, final: torch.Tensor) -> None:
        """Store one sample: aux (T, 3H) and final (T, H), CPU tensors in the shard dtype."""
        self._check_open()
        ids, mask = self._validate_ids(sample_id, input_ids, loss_mask)
        tokens = len(ids)
        for label, tensor, width in (("aux", aux, 3 * self.hidden_size), ("final", final, self.hidden_size)):
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
                raise self._sample_error(sample_id, f"{label} must be a CPU tensor")
            if tuple(tensor.shape) != (tokens, width):
                raise self._sample_error(
                    sample_id, f"{label} has shape {tuple(tensor.shape)}, expected ({tokens}, {width})"
                )
            if tensor.dtype != self._torch_dtype:
                raise self._sample_error(sample_id, f"{label} is {tensor.dtype}, shard dtype is {self.dtype}")
        batch = self.encode(aux.unsqueeze(0), final.unsqueeze(0), [tokens])
        self._add_checked(sample_id, ids, mask, batch, 0)

    def encode(self, aux: torch.Tensor, final: torch.Tensor, lengths: Sequence[int]) -> EncodedBatch:
        """A padded batch, aux (B, W, 3H) and final (B, W, H), in storage form on its own device.

        Only the first `lengths[r]` positions of row r are stored; nothing is written yet.
        """
        lengths = [int(n) for n in lengths]
        rows = len(lengths)
        width = aux.shape[1] if aux.ndim == 3 else -1
        for label, tensor, size in (("aux", aux, 3 * self.hidden_size), ("final", final, self.hidden_size)):
            if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != (rows, width, size):
                shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                raise ShardError(
                    f"shard {self.name}: batch {label} has shape {shape}, expected (B, W, {size})"
                )
            if tensor.dtype != self._torch_dtype:
                raise ShardError(
                    f"shard {self.name}: batch {label} is {tensor.dtype}, shard dtype is {self.dtype}"
                )
        if any(not 0 < n <= width for n in lengths):
            raise ShardError(f"shard {self.name}: batch lengths {lengths} outside 1..{width}")
        bad = torch.stack([_non_finite_per_token(aux), _non_finite_per_token(final)], dim=-1)
        tensors = {"bad": bad}
        if self.mode == "raw":
            tensors.update(aux=aux.contiguous(), final=final.contiguous())
        elif self.mode == "zstd":
            tensors["planes"] = self._shuffle_rows(aux, final, lengths)
        else:
            aux_q, aux_scale, aux_err, aux_ref = _fp8_encode(aux, 3, self._torch_dtype)
            final_q, final_scale, final_err, final_ref = _fp8_encode(final, 1, self._torch_dtype)
            tensors.update(
                aux_q=aux_q,
                final_q=final_q,
                aux_scale=aux_scale,
                final_scale=final_scale.squeeze(-1),
                err=torch.stack([aux_err, aux_ref, final_err, final_ref], dim=-1),
            )
        return EncodedBatch(lengths, tensors)

    def _shuffle_rows(self, aux: torch.Tensor, final: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """Each row's aux then final byte planes (see `shuffle_bytes`), packed into one flat buffer."""
        width = self._torch_dtype.itemsize
        planes = torch.empty(
            sum(lengths) * 4 * self.hidden_size * width, dtype=torch.uint8, device=aux.device
        )
        offset = 0
        for row, tokens in enumerate(lengths):
            for tensor in (aux[row, :tokens], final[row, :tokens]):
                size = tensor.numel() * width
                values = tensor.reshape(-1).view(torch.uint8).view(-1, width)
                target = planes[offset : offset + size].view(width, -1)
                if target.device.type == "cpu":  # numpy's strided copy is the faster one there
                    target.numpy()[...] = values.numpy().T
                else:
                    target.copy_(values.t())
                offset += size
        return planes

    def add_encoded(self, sample_id: str, input_ids, loss_mask, batch: EncodedBatch, row: int) -> None:
        """Store row `row` of an `encode`d batch (CPU tensors) as one sample."""
        self._check_open()
        ids, mask = self._validate_ids(sample_id, input_ids, loss_mask)
        if not 0 <= row < len(batch.lengths):
            raise self._sample_error(sample_id, f"no row {row} in a batch of {len(batch.lengths)}")
        if len(ids) != batch.lengths[row]:
            raise self._sample_error(sample_id, f"{len(ids)} input_ids, batch row has {batch.lengths[row]}")
        if any(t.device.type != "cpu" for t in batch.tensors.values()):
            raise self._sample_error(sample_id, "encoded batch must be on the CPU")
        self._add_checked(sample_id, ids, mask, batch, row)

    def _add_checked(self, sample_id: str, ids: np.ndarray, mask: np.ndarray, batch, row: int) -> None:
        tokens = len(ids)
        bad = batch.tensors["bad"][row, :tokens].sum(dim=0).tolist()
        for label, count in zip(("aux", "final"), bad, strict=True):
            if count:
                raise self._sample_error(sample_id, f"{label} has {count} non-finite values (NaN/Inf)")
        self._seen.add(sample_id)
        self._pending.append((sample_id, ids, mask, self._hidden_blobs(batch, row, tokens)))
        self._write_pending(keep=_ZSTD_PENDING if self._pool else 0)

    def _write_pending(self, keep: int) -> None:
        """Write finished samples in order, waiting on compression while more than `keep` remain."""
        while self._pending and (len(self._pending) > keep or _all_done(self._pending[0][3])):
            sample_id, ids, mask, hidden = self._pending.popleft()
            blobs = [self._write_blob(ids), self._write_blob(mask)]
            blobs += [self._write_blob(b.result() if isinstance(b, Future) else b) for b in hidden]
            tokens = len(ids)
            self._rows.append([sample_id, tokens, *blobs])
            self._num_tokens += tokens
            hidden_bytes = tokens * 4 * self.hidden_size * self._torch_dtype.itemsize
            self._raw_bytes += ids.nbytes + mask.nbytes + hidden_bytes

    def _check_open(self) -> None:
        if self._done:
            raise ShardError(f"shard {self.name}: add() after close()/abort()")

    def _sample_error(self, sample_id, problem: str) -> ShardError:
        return ShardError(f"shard {self.name}, sample {sample_id!r}: {problem}")

    def _validate_ids(self, sample_id, input_ids, loss_mask) -> tuple[np.ndarray, np.ndarray]:
        def fail(problem: str) -> ShardError:
            return self._sample_error(sample_id, problem)

        if not isinstance(sample_id, str) or not sample_id:
            raise fail("sample id must be a non-empty string")
        if sample_id in self._seen:
            raise fail("duplicate sample id")
        try:
            ids, mask = _as_int_array(input_ids), _as_int_array(loss_mask)
        except (TypeError, ValueError) as exc:
            raise fail(f"input_ids/loss_mask: {exc}") from exc
        if ids.ndim != 1 or ids.size == 0:
            raise fail(f"input_ids must be 1-D and non-empty, got shape {ids.shape}")
        tokens = len(ids)
        if ids.min() < 0 or ids.max() >= 2**31:
            raise fail("input_ids outside the int32 range")
        if mask.shape != ids.shape or not np.isin(mask, (0, 1)).all():
            raise fail(f"loss_mask must be {tokens} values of 0/1, got shape {mask.shape}")
        return ids.astype("<i4"), mask.astype(np.uint8)

    def _hidden_blobs(self, batch: EncodedBatch, row: int, tokens: int) -> list:
        """The row's hidden-state blobs in storage order: arrays, bytes, or futures of bytes."""
        t = batch.tensors
        if self.mode == "raw":
            return [_to_numpy(t[k][row, :tokens]) for k in ("aux", "final")]
        if self.mode == "zstd":
            start = self._plane_offset(batch, row)
            sizes = [tokens * n * self.hidden_size * self._torch_dtype.itemsize for n in (3, 1)]
            planes = t["planes"].numpy()
            parts = (planes[start : start + sizes[0]], planes[start + sizes[0] : start + sizes[0] + sizes[1]])
            if self._pool is None:
                return [self._compressor.compress(p) for p in parts]
            return [self._pool.submit(self._compress, p) for p in parts]
        aux_err, aux_ref, final_err, final_ref = t["err"][row, :tokens].double().sum(dim=0).tolist()
        self._errors["aux"].add(aux_err, aux_ref)
        self._errors["final"].add(final_err, final_ref)
        return [_to_numpy(t[k][row, :tokens]) for k in ("aux_q", "final_q", "aux_scale", "final_scale")]

    def _plane_offset(self, batch: EncodedBatch, row: int) -> int:
        return sum(batch.lengths[:row]) * 4 * self.hidden_size * self._torch_dtype.itemsize

    def _write_blob(self, data) -> list[int]:
        """Append one blob at the next aligned offset; returns [offset, length]."""
        view = memoryview(data).cast("B")
        pad = -self._offset % ALIGNMENT
        if pad:
            self._write(memoryview(_PAD[:pad]))
        offset = self._offset
        self._write(view)
        self._stored_bytes += len(view)
        return [offset, len(view)]

    def _write(self, view: memoryview) -> None:
        self._sink.write(view)
        self._offset += len(view)

    # -- finishing

    def close(self) -> dict:
        """Persist the data under its final name, then the index; returns the manifest."""
        if self._done:
            raise ShardError(f"shard {self.name}: already closed or aborted")
        self._done = True
        try:
            self._write_pending(keep=0)
            self._stop_pool()
            self._sink.finish()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.chmod(self._tmp_path, 0o644)
            # A stale index must never describe the new data, even for a moment.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.json_path)
            os.replace(self._tmp_path, self.bin_path)
            atomic.fsync_dir(self.directory)
            manifest = self._manifest()
            atomic.write_text(self.json_path, manifest_text(manifest))
        except BaseException:
            self._remove_temp()
            raise
        return manifest

    def abort(self) -> None:
        """Drop everything written so far (idempotent)."""
        self._done = True
        self._remove_temp()

    def _stop_pool(self) -> None:
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _remove_temp(self) -> None:
        self._stop_pool()
        self._sink.cancel()
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp_path)

    def _manifest(self) -> dict:
        lossy = self.mode == "fp8"
        return {
            "format_version": SHARD_FORMAT_VERSION,
            "mode": self.mode,
            "dtype": self.dtype,
            "hidden_size": self.hidden_size,
            "num_samples": len(self._rows),
            "num_tokens": self._num_tokens,
            "bin": {
                "name": self.bin_path.name,
                "sha256": self._sink.digest.hexdigest(),
                "size": self._offset,
            },
            "bytes": {
                "raw": self._raw_bytes,  # ids + mask + hidden states at the shard dtype
                "stored": self._stored_bytes,  # blob payloads, without alignment padding
                "ratio": self._stored_bytes / self._raw_bytes if self._raw_bytes else None,
            },
            # Threads change the frame layout (so the bytes), never the decoded data.
            "zstd": {"level": self.zstd_level, "threads": self.zstd_threads} if self.mode == "zstd" else None,
            "fp8_error": {k: v.summary() for k, v in self._errors.items()} if lossy else None,
            "layout": {
                "alignment": ALIGNMENT,
                "byte_order": "little",
                "blobs": list(blob_names(self.mode)),
                "sample_row": ["id", "num_tokens", "[offset, length] per blob"],
            },
            "meta": self.meta,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "samples": self._rows,
        }


def _all_done(blobs: list) -> bool:
    return all(b.done() for b in blobs if isinstance(b, Future))


def _as_int_array(values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.dtype == bool:
        array = array.astype(np.uint8)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"expected integer values, got {array.dtype}")
    return array.astype(np.int64)


def manifest_text(manifest: dict) -> str:
    """Indented JSON with one compact line per sample row (readable and small)."""
    head = {k: v for k, v in manifest.items() if k != "samples"}
    text = json.dumps(head, indent=2, sort_keys=True, ensure_ascii=False)
    lines = [json.dumps(row, separators=(",", ":"), ensure_ascii=False) for row in manifest["samples"]]
    rows = ",\n    ".join(lines)
    samples = f"[\n    {rows}\n  ]" if rows else "[]"
    return f'{text[:-2]},\n  "samples": {samples}\n}}\n'


# ------------------------------------------------------------------ reader


class ShardReader:
    """Random access to a finished shard; opening reads only the `.json` index."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = Path(directory)
        self.name = name
        self.json_path = self.directory / f"{name}{SHARD_SUFFIXES['index']}"
        self.bin_path = self.directory / f"{name}{SHARD_SUFFIXES['bin']}"
        try:
            self.manifest: dict = json.loads(self.json_path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ShardError(f"{self.json_path}: no shard index (missing or incomplete shard)") from exc
        except json.JSONDecodeError as exc:
            raise ShardError(f"{self.json_path}: corrupt shard index ({exc.msg})") from exc
        version = self.manifest.get("format_version")
        if version != SHARD_FORMAT_VERSION:
            raise ShardError(
                f"{self.json_path}: shard format {version}, this reader reads {SHARD_FORMAT_VERSION}"
            )
        self.mode: str = self.manifest["mode"]
        self.dtype: str = self.manifest["dtype"]
        self.hidden_size: int = self.manifest["hidden_size"]
        self._rows: list[list] = self.manifest["samples"]
        self.ids: list[str] = [row[0] for row in self._rows]
        self._positions = {sample_id: i for i, sample_id in enumerate(self.ids)}
        self._data: np.ndarray | None = None
        self._decompressor = None

    def __len__(self) -> int:
        return len(self._rows)

    def __getstate__(self) -> dict:
        # DataLoader workers pickle the reader: send the index, never the mapped data.
        state = self.__dict__.copy()
        state["_data"] = None
        state["_decompressor"] = None
        return state

    def index_of(self, sample_id: str) -> int:
        try:
            return self._positions[sample_id]
        except KeyError:
            raise ShardError(f"shard {self.name}: no sample {sample_id!r}") from None

    def order(self, shuffle_seed: int | None = None) -> list[int]:
        """Sample positions in iteration order: as stored, or a seeded permutation."""
        if shuffle_seed is None:
            return list(range(len(self)))
        return np.random.default_rng(shuffle_seed).permutation(len(self)).tolist()

    def iter(self, shuffle_seed: int | None = None) -> Iterator[Sample]:
        for i in self.order(shuffle_seed):
            yield self[i]

    def __iter__(self) -> Iterator[Sample]:
        return self.iter()

    def __getitem__(self, i: int) -> Sample:
        if not -len(self) <= i < len(self):
            raise IndexError(f"shard {self.name} has {len(self)} samples, asked for {i}")
        sample_id, tokens, *spans = self._rows[i]
        blobs = dict(zip(blob_names(self.mode), spans, strict=True))
        ids = torch.from_numpy(self._view(blobs["input_ids"], np.dtype("<i4"))).to(torch.int64)
        mask = torch.from_numpy(self._view(blobs["loss_mask"], np.dtype(np.uint8)))
        aux, final = self._hidden(blobs, tokens)
        return Sample(sample_id, ids, mask, aux, final)

    def _hidden(self, blobs: dict, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        width = self.hidden_size
        if self.mode == "fp8":
            return self._fp8(blobs, "aux", tokens, 3), self._fp8(blobs, "final", tokens, 1)
        read = self._raw if self.mode == "raw" else self._decompressed
        return read(blobs["aux"]).reshape(tokens, 3 * width), read(blobs["final"]).reshape(tokens, width)

    def _raw(self, span: list[int]) -> torch.Tensor:
        return self._as_dtype(self._view(span, _STORAGE_DTYPES[self.dtype]))

    def _decompressed(self, span: list[int]) -> torch.Tensor:
        storage = _STORAGE_DTYPES[self.dtype]
        if self._decompressor is None:
            import zstandard

            self._decompressor = zstandard.ZstdDecompressor()
        raw = self._decompressor.decompress(self._view(span, np.dtype(np.uint8)))
        return self._as_dtype(unshuffle_bytes(np.frombuffer(raw, dtype=np.uint8), storage))

    def _fp8(self, blobs: dict, kind: str, tokens: int, groups: int) -> torch.Tensor:
        q = torch.from_numpy(self._view(blobs[kind], np.dtype(np.uint8))).view(torch.float8_e4m3fn)
        scale = torch.from_numpy(self._view(blobs[f"{kind}_scale"], np.dtype("<f4")))
        return fp8_dequantize(q, scale.reshape(tokens, groups), DTYPES[self.dtype])

    def _as_dtype(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        return tensor.view(torch.bfloat16) if self.dtype == "bfloat16" else tensor

    def _view(self, span: list[int], dtype: np.dtype) -> np.ndarray:
        """The blob's bytes as a flat array, straight from the memory map (no read of the rest)."""
        offset, length = span
        if self._data is None:
            self._data = self._map()
        end = offset + length
        if end > len(self._data):
            raise ShardError(f"{self.bin_path}: blob [{offset}, {end}) beyond the file end (truncated?)")
        return self._data[offset:end].view(dtype)

    def _map(self) -> np.ndarray:
        if not self.bin_path.exists():
            raise ShardError(f"{self.bin_path}: shard data missing")
        # Copy-on-write: returned tensors are writable without warnings, and a
        # caller that modifies one can never change the file.
        return np.memmap(self.bin_path, dtype=np.uint8, mode="c")

    def verify(self) -> list[str]:
        """Problems with the `.bin` against the manifest; [] when intact."""
        expected = self.manifest["bin"]
        if not self.bin_path.exists():
            return [f"{self.bin_path.name}: missing"]
        size = self.bin_path.stat().st_size
        if size != expected["size"]:
            return [f"{self.bin_path.name}: size {size}, manifest says {expected['size']}"]
        if sha256_file(self.bin_path) != expected["sha256"]:
            return [f"{self.bin_path.name}: sha256 differs from the manifest"]
        return []
