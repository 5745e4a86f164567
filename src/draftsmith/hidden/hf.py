"""Hidden-state extraction with transformers: hooks on the aux layers only.

The target is loaded once per job. Forward hooks keep just the three aux layers'
outputs (never every layer's states of a deep model); the final hidden state is
the base model's output after its final norm. Batches are length-sorted and
bounded by a padded-token budget. On GPU each batch is put in storage form on
the device (`ShardWriter.encode`: NaN/Inf counts, byte planes for zstd, fp8
values, scales and error sums), so the host only compresses and writes; the
device-to-host copy of batch n runs on a side stream into pinned memory (an
event per batch) while batch n+1's forward runs, and a background thread
writes (and compresses) while the GPU works; the queue between them is bounded
so host memory stays bounded.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from draftsmith.errors import DraftsmithError

log = logging.getLogger(__name__)


class ExtractionError(DraftsmithError):
    pass


@dataclass
class MergedSample:
    id: str
    input_ids: list[int]
    loss_mask: list[int]


def batches(samples: list[MergedSample], batch_tokens: int) -> Iterator[list[MergedSample]]:
    """Longest first; each batch's padded size (rows x longest) stays within the budget."""
    ordered = sorted(samples, key=lambda s: (-len(s.input_ids), s.id))
    batch: list[MergedSample] = []
    for sample in ordered:
        width = len(batch[0].input_ids) if batch else len(sample.input_ids)
        if batch and (len(batch) + 1) * width > batch_tokens:
            yield batch
            batch = []
        batch.append(sample)
    if batch:
        yield batch


class AuxCapture:
    """Forward hooks on the decoder layers whose outputs EAGLE-3 fuses."""

    def __init__(self, model, output_of_layers: list[int]) -> None:
        self.base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.layers = output_of_layers
        self._captured: dict[int, torch.Tensor] = {}
        self._handles = [self.base.layers[i].register_forward_hook(self._hook(i)) for i in output_of_layers]

    def _hook(self, index: int) -> Callable:
        def keep(_module, _inputs, output) -> None:
            self._captured[index] = output[0] if isinstance(output, tuple) else output

        return keep

    @torch.inference_mode()
    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._captured.clear()
        out = self.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        aux = torch.cat([self._captured[i] for i in self.layers], dim=-1)
        self._captured.clear()
        return aux, out.last_hidden_state

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def _pad(batch: list[MergedSample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = len(batch[0].input_ids)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, sample in enumerate(batch):
        ids[row, : len(sample.input_ids)] = torch.tensor(sample.input_ids)
        mask[row, : len(sample.input_ids)] = 1
    return ids, mask


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


class _CopyStream:
    """Device-to-host copies on their own stream, after the work queued so far on the current one."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)

    def __call__(self, encoded):
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            host = encoded.apply(self._copy)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return host, ready

    def _copy(self, tensor: torch.Tensor) -> torch.Tensor:
        # The compute stream frees these once the loop moves on; keep them until the copy is done.
        tensor.record_stream(self.stream)
        return _to_host(tensor)


class _Writer(threading.Thread):
    """Drains finished batches into the shard writer; errors surface in the main thread."""

    def __init__(self, shard_writer, depth: int, on_written: Callable[[int], None]) -> None:
        super().__init__(name="shard-writer", daemon=True)
        self.shard_writer = shard_writer
        self.inbox: queue.Queue = queue.Queue(maxsize=depth)
        self.on_written = on_written
        self.error: BaseException | None = None

    def run(self) -> None:
        while (item := self.inbox.get()) is not None:
            if self.error is None:
                try:
                    self._write(*item)
                except BaseException as exc:  # reported by put()/finish()
                    self.error = exc

    def _write(self, batch, ids, hidden, ready) -> None:
        """`hidden` is (aux, final) host tensors, or an encoded batch on the host."""
        if ready is not None:
            ready.synchronize()
        for row, sample in enumerate(batch):
            length = len(sample.input_ids)
            stored = ids[row, :length].tolist()
            if stored != sample.input_ids:
                raise ExtractionError(
                    f"{sample.id}: stored token ids differ from the merged data (batch row {row})"
                )
            if isinstance(hidden, tuple):
                aux, final = hidden
                self.shard_writer.add(
                    sample.id, stored, sample.loss_mask, aux[row, :length], final[row, :length]
                )
            else:
                self.shard_writer.add_encoded(sample.id, stored, sample.loss_mask, hidden, row)
        self.on_written(sum(len(s.input_ids) for s in batch))

    def put(self, item) -> None:
        if self.error is not None:
            raise self.error
        self.inbox.put(item)

    def finish(self) -> None:
        self.inbox.put(None)
        self.join()
        if self.error is not None:
            raise self.error


def extract(
    capture: AuxCapture,
    samples: list[MergedSample],
    shard_writer,
    *,
    batch_tokens: int,
    device: str,
    pad_id: int,
    writer_queue: int,
    on_written: Callable[[int], None],
) -> None:
    """Run the target over `samples` in batches and store every sample in `shard_writer`.

    On CUDA the batch is encoded on the device (`shard_writer.encode`) and only
    storage-ready bytes cross to the host; elsewhere the writer thread hands
    plain tensors to `shard_writer.add`.
    """
    copy = _CopyStream(device) if device.startswith("cuda") else None
    writer = _Writer(shard_writer, writer_queue, on_written)
    writer.start()
    try:
        for batch in batches(samples, batch_tokens):
            ids, mask = _pad(batch, pad_id)
            aux, final = capture(ids.to(device, non_blocking=True), mask.to(device, non_blocking=True))
            if copy is None:
                writer.put((batch, ids, (aux, final), None))
                continue
            with torch.inference_mode():
                encoded = shard_writer.encode(aux, final, [len(s.input_ids) for s in batch])
            del aux, final  # the encoded batch holds what it needs
            writer.put((batch, ids, *copy(encoded)))
    finally:
        writer.finish()
