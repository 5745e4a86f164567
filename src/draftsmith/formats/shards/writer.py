"""`ShardWriter`: checks samples, encodes them and streams them into one shard."""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from draftsmith.formats.shards.codec import _EXPONENT_MASKS, EncodedBatch, fp8_dequantize, fp8_quantize
from draftsmith.formats.shards.layout import (
    ALIGNMENT,
    MODES,
    SHARD_FORMAT_VERSION,
    SHARD_SUFFIXES,
    ShardError,
    _check_choice,
    blob_names,
    manifest_text,
)
from draftsmith.formats.shards.sink import _Sink
from draftsmith.fsutil import atomic
from draftsmith.target.dtypes import DTYPES

_PAD = bytes(ALIGNMENT)
# zstd_threads != 0: blobs compressed at once (each with its share of the threads;
# zstd's output is the same for any thread count >= 1) and samples kept in flight.
_ZSTD_JOBS = 4
_ZSTD_PENDING = 16


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


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """Contiguous numpy view of a CPU tensor's bytes (bf16 and fp8 reinterpreted as ints)."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    elif t.dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8)
    return t.numpy()


class ShardWriter:
    """Streams samples into one shard; see the package docstring for the format."""

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
