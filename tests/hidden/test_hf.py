"""The hf extraction path on the real demo model: the right layers, unpadded, checked."""

from __future__ import annotations

import pytest
import torch

from draftsmith.formats.shards.reader import ShardReader
from draftsmith.formats.shards.writer import ShardWriter
from draftsmith.hidden.hf import AuxCapture, ExtractionError, MergedSample, extract
from draftsmith.target import load as target
from draftsmith.target.layers import AuxLayers


@pytest.fixture(scope="module")
def model(demo_model_dir):
    return target.load_model(demo_model_dir, "float32")


def samples() -> list[MergedSample]:
    lengths = [7, 19, 3, 12, 19, 5]
    return [
        MergedSample(
            f"s{i}", [(i * 31 + t * 7) % 4000 + 10 for t in range(n)], [int(t > 1) for t in range(n)]
        )
        for i, n in enumerate(lengths)
    ]


def test_stored_states_equal_hf_hidden_states(model, tmp_path):
    aux = AuxLayers.default(model.config.num_hidden_layers)
    with ShardWriter(tmp_path, "s", mode="raw", hidden_size=576, dtype="float32", meta={}) as writer:
        extract(
            AuxCapture(model, list(aux.output_of)),
            samples(),
            writer,
            batch_tokens=40,
            device="cpu",
            pad_id=2,
            writer_queue=2,
            on_written=lambda n: None,
        )
    reader = ShardReader(tmp_path, "s")
    for sample in samples():
        stored = reader[reader.index_of(sample.id)]
        with torch.no_grad():
            out = model(torch.tensor([sample.input_ids]), output_hidden_states=True)
        expected_aux = torch.cat([out.hidden_states[i][0] for i in aux.hf_hidden_states], dim=-1)
        assert stored.input_ids.tolist() == sample.input_ids
        assert stored.loss_mask.tolist() == sample.loss_mask
        # Padding that leaked in would move whole rows; a batched float32 matmul blocks its sums
        # differently from a single row's (by the thread count too), a few 1e-4 at most.
        torch.testing.assert_close(stored.aux, expected_aux, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(stored.final, out.hidden_states[-1][0], atol=1e-3, rtol=1e-3)


def test_misaligned_rows_are_caught(model, tmp_path, monkeypatch):
    """Left padding sliced as if right-padded stores the wrong positions: refused, nothing written."""
    from draftsmith.hidden import hf

    def left_pad(batch, pad_id):
        width = len(batch[0].input_ids)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        for row, sample in enumerate(batch):
            ids[row, width - len(sample.input_ids) :] = torch.tensor(sample.input_ids)
        return ids, (ids != pad_id).long()

    monkeypatch.setattr(hf, "_pad", left_pad)
    batch = [MergedSample("long", [11, 12, 13, 14], [1] * 4), MergedSample("short", [21, 22], [1, 1])]
    writer = ShardWriter(tmp_path, "bad", mode="raw", hidden_size=576, dtype="float32", meta={})
    with pytest.raises(ExtractionError, match="short: stored token ids differ"), writer:
        extract(
            AuxCapture(model, [1, 14, 26]),
            batch,
            writer,
            batch_tokens=64,
            device="cpu",
            pad_id=2,
            writer_queue=1,
            on_written=lambda n: None,
        )
    assert not list(tmp_path.iterdir())
