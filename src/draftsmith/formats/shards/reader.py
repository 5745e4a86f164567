"""`ShardReader`: random access to a finished shard, and its check against the manifest."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from draftsmith.formats.shards.codec import fp8_dequantize, unshuffle_bytes
from draftsmith.formats.shards.layout import SHARD_FORMAT_VERSION, SHARD_SUFFIXES, ShardError, blob_names
from draftsmith.fsutil.digests import sha256_file
from draftsmith.target.dtypes import DTYPES

# numpy has no bfloat16: its bits travel as int16 and are re-viewed on the torch side.
_STORAGE_DTYPES = {"float32": np.dtype("<f4"), "bfloat16": np.dtype("<i2"), "float16": np.dtype("<f2")}


@dataclass
class Sample:
    id: str
    input_ids: torch.Tensor  # int64 (T,)
    loss_mask: torch.Tensor  # uint8 (T,)
    aux: torch.Tensor  # (T, 3H), shard dtype
    final: torch.Tensor  # (T, H), shard dtype


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
