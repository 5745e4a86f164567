"""The hidden-state shard format: round trips, random access, atomicity, verification, ratio."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest
import torch

from draftsmith.formats.shards.codec import ZSTD_EXPECTED_RATIO, bytes_per_token
from draftsmith.formats.shards.layout import MODES, SHARD_FORMAT_VERSION, ShardError
from draftsmith.formats.shards.reader import ShardReader
from draftsmith.formats.shards.writer import ShardWriter
from draftsmith.fsutil import atomic

H = 32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def activations(tokens: int, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """randn * 3 plus a few large outliers, like real residual-stream activations."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, width, generator=g) * 3
    rows = torch.randint(0, tokens, (4,), generator=g)
    cols = torch.randint(0, width, (4,), generator=g)
    x[rows, cols] = torch.tensor([150.0, -220.0, 90.0, 300.0])
    return x.to(dtype)


def make_samples(count: int, dtype: torch.dtype, hidden: int = H) -> list[dict]:
    samples = []
    for i in range(count):
        tokens = 5 + 7 * i
        samples.append(
            {
                "sample_id": f"ds/{i:04d}",
                "input_ids": list(range(1000 + i, 1000 + i + tokens)),
                "loss_mask": [j % 3 != 0 for j in range(tokens)],
                "aux": activations(tokens, 3 * hidden, dtype, seed=2 * i),
                "final": activations(tokens, hidden, dtype, seed=2 * i + 1),
            }
        )
    return samples


def write_shard(directory: Path, name: str, samples: list[dict], mode: str, dtype: str, **kwargs) -> dict:
    with ShardWriter(
        directory, name, mode=mode, hidden_size=H, dtype=dtype, meta={"layers": [1, 14, 26]}, **kwargs
    ) as writer:
        for sample in samples:
            writer.add(**sample)
    return json.loads((directory / f"{name}.json").read_text())


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.element_size() == 4 else t.view(torch.int16)


def relative_error(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    return float((x.double() - x_hat.double()).norm() / x.double().norm())


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode", MODES)
def test_round_trip(tmp_path, mode, dtype):
    samples = make_samples(6, DTYPES[dtype])
    manifest = write_shard(tmp_path, "s0", samples, mode, dtype)
    reader = ShardReader(tmp_path, "s0")
    assert len(reader) == 6 and reader.ids == [s["sample_id"] for s in samples]
    assert manifest["num_tokens"] == sum(len(s["input_ids"]) for s in samples)
    assert manifest["mode"] == mode and manifest["dtype"] == dtype and manifest["hidden_size"] == H
    assert manifest["meta"] == {"layers": [1, 14, 26]}
    errors = {"aux": [], "final": []}
    for i, expected in enumerate(samples):
        got = reader[i]
        assert got.id == expected["sample_id"]
        assert got.input_ids.dtype == torch.int64 and got.input_ids.tolist() == expected["input_ids"]
        assert got.loss_mask.tolist() == [int(m) for m in expected["loss_mask"]]
        for kind in ("aux", "final"):
            tensor = getattr(got, kind)
            assert tensor.dtype == DTYPES[dtype] and tensor.shape == expected[kind].shape
            if mode == "fp8":
                errors[kind].append(relative_error(expected[kind], tensor))
            else:
                assert torch.equal(as_bits(tensor), as_bits(expected[kind]))
    if mode == "fp8":
        for kind, errs in errors.items():
            recorded = manifest["fp8_error"][kind]
            assert max(errs) < 0.07
            assert recorded["max_sample"] == pytest.approx(max(errs), rel=1e-3)
            assert 0 < recorded["relative_frobenius"] <= recorded["max_sample"]
    else:
        assert manifest["fp8_error"] is None


def test_manifest_fields(tmp_path):
    samples = make_samples(3, torch.bfloat16)
    manifest = write_shard(tmp_path, "m", samples, "zstd", "bfloat16", zstd_level=3, zstd_threads=2)
    assert manifest["format_version"] == SHARD_FORMAT_VERSION
    assert manifest["zstd"] == {"level": 3, "threads": 2}
    assert manifest["bin"]["size"] == (tmp_path / "m.bin").stat().st_size
    assert manifest["bytes"]["stored"] < manifest["bytes"]["raw"]
    assert manifest["bytes"]["ratio"] == pytest.approx(manifest["bytes"]["stored"] / manifest["bytes"]["raw"])
    assert manifest["created"].endswith("Z")
    row = manifest["samples"][1]
    assert row[0] == "ds/0001" and row[1] == 12
    assert len(row) == 2 + len(manifest["layout"]["blobs"])
    assert all(offset % 64 == 0 for offset, _ in row[2:])
    # One line per sample keeps a 10k-sample index compact.
    text = (tmp_path / "m.json").read_text()
    assert '["ds/0001",12,[' in text


@pytest.mark.parametrize("mode", MODES)
def test_random_access_reads_only_that_sample(tmp_path, mode):
    samples = make_samples(5, torch.bfloat16)
    manifest = write_shard(tmp_path, "r", samples, mode, "bfloat16")
    # Wreck every byte of sample 2; the others must still read back intact.
    data = bytearray((tmp_path / "r.bin").read_bytes())
    for offset, length in manifest["samples"][2][2:]:
        data[offset : offset + length] = b"\xff" * length
    (tmp_path / "r.bin").write_bytes(bytes(data))
    reader = ShardReader(tmp_path, "r")
    for i in (4, 0, 3, 1):
        got = reader[i]
        assert got.id == samples[i]["sample_id"]
        assert got.input_ids.tolist() == samples[i]["input_ids"]
        if mode != "fp8":
            assert torch.equal(as_bits(got.aux), as_bits(samples[i]["aux"]))
            assert torch.equal(as_bits(got.final), as_bits(samples[i]["final"]))
        else:
            assert relative_error(samples[i]["aux"], got.aux) < 0.07
    assert reader[-1].id == samples[4]["sample_id"]
    assert reader.index_of("ds/0003") == 3
    with pytest.raises(ShardError, match="no sample"):
        reader.index_of("nope")
    with pytest.raises(IndexError):
        reader[5]
    assert reader.verify()


def test_seeded_shuffle_is_a_deterministic_permutation(tmp_path):
    samples = make_samples(12, torch.float32)
    write_shard(tmp_path, "p", samples, "raw", "float32")
    reader = ShardReader(tmp_path, "p")
    first = [s.id for s in reader.iter(shuffle_seed=7)]
    again = [s.id for s in ShardReader(tmp_path, "p").iter(shuffle_seed=7)]
    other = [s.id for s in reader.iter(shuffle_seed=8)]
    assert first == again
    assert sorted(first) == sorted(reader.ids) and first != reader.ids
    assert other != first
    assert [s.id for s in reader.iter()] == reader.ids


def test_reader_pickles_without_the_mapped_data(tmp_path):
    samples = make_samples(3, torch.bfloat16)
    write_shard(tmp_path, "k", samples, "raw", "bfloat16")
    reader = ShardReader(tmp_path, "k")
    reader[0]  # maps the file
    clone = pickle.loads(pickle.dumps(reader))
    assert len(pickle.dumps(reader)) < 4096
    assert torch.equal(as_bits(clone[2].aux), as_bits(samples[2]["aux"]))


@pytest.mark.parametrize(("kind", "value"), [("aux", float("nan")), ("final", float("inf"))])
def test_non_finite_values_name_sample_and_tensor(tmp_path, kind, value):
    sample = make_samples(2, torch.bfloat16)[1]
    sample[kind][3, 5] = value
    writer = ShardWriter(tmp_path, "n", mode="raw", hidden_size=H, dtype="bfloat16", meta={})
    with pytest.raises(ShardError, match=rf"'ds/0001'.*{kind} has 1 non-finite"):
        writer.add(**sample)
    writer.abort()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(aux=s["aux"][:, :-1]), "aux has shape"),
        (lambda s: s.update(final=s["final"][:-1]), "final has shape"),
        (lambda s: s.update(final=s["final"].float()), "shard dtype is bfloat16"),
        (lambda s: s.update(loss_mask=s["loss_mask"][:-1]), "loss_mask must be"),
        (lambda s: s.update(input_ids=[]), "non-empty"),
    ],
)
def test_invalid_samples_are_refused(tmp_path, change, message):
    sample = make_samples(1, torch.bfloat16)[0]
    change(sample)
    with (
        ShardWriter(tmp_path, "v", mode="raw", hidden_size=H, dtype="bfloat16", meta={}) as writer,
        pytest.raises(ShardError, match=message),
    ):
        writer.add(**sample)


def test_duplicate_ids_and_noncontiguous_tensors(tmp_path):
    sample = make_samples(1, torch.float32)[0]
    with ShardWriter(tmp_path, "d", mode="zstd", hidden_size=H, dtype="float32", meta={}) as writer:
        # A transposed copy is non-contiguous but has the right shape and values.
        strided = sample["aux"].T.contiguous().T
        assert not strided.is_contiguous()
        writer.add("t", sample["input_ids"], sample["loss_mask"], strided, sample["final"])
        with pytest.raises(ShardError, match="duplicate"):
            writer.add("t", sample["input_ids"], sample["loss_mask"], sample["aux"], sample["final"])
    assert torch.equal(ShardReader(tmp_path, "d")[0].aux, sample["aux"])


def test_failed_writer_leaves_no_files(tmp_path):
    samples = make_samples(3, torch.bfloat16)
    with (
        pytest.raises(RuntimeError, match="extraction died"),
        ShardWriter(tmp_path, "f", mode="zstd", hidden_size=H, dtype="bfloat16", meta={}) as writer,
    ):
        writer.add(**samples[0])
        writer.add(**samples[1])
        raise RuntimeError("extraction died")
    assert list(tmp_path.iterdir()) == []


def test_unfinished_shard_has_no_final_name(tmp_path):
    samples = make_samples(2, torch.bfloat16)
    writer = ShardWriter(tmp_path, "u", mode="raw", hidden_size=H, dtype="bfloat16", meta={})
    writer.add(**samples[0])
    names = [p.name for p in tmp_path.iterdir()]
    assert len(names) == 1 and names[0].startswith(atomic.temp_prefix("u.bin"))
    with pytest.raises(ShardError, match="no shard index"):
        ShardReader(tmp_path, "u")
    manifest = writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u.bin", "u.json"]
    assert manifest["num_samples"] == 1
    with pytest.raises(ShardError, match="after close"):
        writer.add(**samples[1])


def test_rewriting_a_shard_replaces_it(tmp_path):
    write_shard(tmp_path, "w", make_samples(4, torch.bfloat16), "raw", "bfloat16")
    write_shard(tmp_path, "w", make_samples(2, torch.bfloat16), "fp8", "bfloat16")
    reader = ShardReader(tmp_path, "w")
    assert len(reader) == 2 and reader.manifest["mode"] == "fp8" and reader.verify() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.bin", "w.json"]


def test_verify_flags_flipped_byte_and_truncation(tmp_path):
    write_shard(tmp_path, "c", make_samples(3, torch.bfloat16), "zstd", "bfloat16")
    reader = ShardReader(tmp_path, "c")
    assert reader.verify() == []
    path = tmp_path / "c.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert any("sha256" in p for p in reader.verify())
    path.write_bytes(bytes(data[:-10]))
    assert any("size" in p for p in reader.verify())
    path.unlink()
    assert any("missing" in p for p in reader.verify())


def test_bytes_per_token():
    assert bytes_per_token(4096, "bfloat16", "raw") == 4 * 4096 * 2 + 5
    assert bytes_per_token(7168, "float32", "raw") == 4 * 7168 * 4 + 5
    assert bytes_per_token(4096, "bfloat16", "fp8") == 4 * 4096 + 16 + 5
    expected_zstd = (4 * 4096 * 2 + 5) * ZSTD_EXPECTED_RATIO
    assert bytes_per_token(4096, "bfloat16", "zstd") == pytest.approx(expected_zstd)
    with pytest.raises(ShardError, match="mode"):
        bytes_per_token(4096, "bfloat16", "lz4")


def real_activations(model_dir: Path, tokens_per_sample: int = 256, count: int = 2) -> list[dict]:
    """Aux (outputs of decoder layers 1, 14, 26) and final states of the demo model on real text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    repo = Path(__file__).resolve().parents[2]
    lines = []
    for path in sorted((repo / "resources" / "datasets").glob("*.jsonl")):
        for record in map(json.loads, path.read_text().splitlines()):
            lines.append(record.get("prompt") or record.get("messages", [{}])[-1].get("content", ""))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer("\n".join(lines), return_tensors="pt").input_ids[:, : tokens_per_sample * count]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    layers = model.config.num_hidden_layers
    aux_layers = [1, layers // 2 - 1, layers - 4]
    samples = []
    with torch.no_grad():
        for i, chunk in enumerate(ids.split(tokens_per_sample, dim=1)):
            out = model.model(input_ids=chunk, output_hidden_states=True)
            # hidden_states[i + 1] is the output of decoder layer i.
            aux = torch.cat([out.hidden_states[k + 1][0] for k in aux_layers], dim=-1)
            final = out.last_hidden_state[0]
            samples.append(
                {
                    "sample_id": f"real/{i}",
                    "input_ids": chunk[0],
                    "loss_mask": torch.ones_like(chunk[0]),
                    "aux": aux.to(torch.bfloat16),
                    "final": final.to(torch.bfloat16),
                }
            )
    return samples


def test_zstd_ratio_on_real_activations(tmp_path, demo_model_dir):
    samples = real_activations(demo_model_dir)
    hidden = samples[0]["final"].shape[1]
    sizes = {}
    for mode in ("raw", "zstd"):
        with ShardWriter(tmp_path, mode, mode=mode, hidden_size=hidden, dtype="bfloat16", meta={}) as writer:
            for sample in samples:
                writer.add(**sample)
        sizes[mode] = (tmp_path / f"{mode}.bin").stat().st_size
    reader = ShardReader(tmp_path, "zstd")
    for i, sample in enumerate(samples):
        assert torch.equal(as_bits(reader[i].aux), as_bits(sample["aux"]))
    ratio = sizes["zstd"] / sizes["raw"]
    tokens = reader.manifest["num_tokens"]
    print(
        f"\nzstd level 1 on real bf16 activations (SmolLM2-135M, {tokens} tokens, H={hidden}): "
        f"{sizes['zstd']:,} / {sizes['raw']:,} bytes = {ratio:.3f} ({1 / ratio:.2f}x)"
    )
    assert ratio < 0.9


def test_write_throughput_printout(tmp_path):
    """~50 MB of bf16 per mode; printed, not asserted (this is a 2-core CI box)."""
    hidden, tokens, count = 576, 1024, 11  # 11 x 1024 x 4 x 576 x 2 bytes ~ 52 MB
    aux = [activations(tokens, 3 * hidden, torch.bfloat16, seed=i) for i in range(count)]
    final = [activations(tokens, hidden, torch.bfloat16, seed=100 + i) for i in range(count)]
    ids, mask = list(range(tokens)), [1] * tokens
    megabytes = sum(a.nbytes + f.nbytes for a, f in zip(aux, final, strict=True)) / 1e6
    print(f"\nwrite throughput, {megabytes:.0f} MB of bf16 (random activation-like data), fsync included:")
    for mode, threads in (("raw", 0), ("zstd", 0), ("zstd", 2), ("fp8", 0)):
        start = time.perf_counter()
        with ShardWriter(
            tmp_path, f"{mode}{threads}", mode=mode, hidden_size=hidden, dtype="bfloat16", meta={},
            zstd_threads=threads,
        ) as writer:  # fmt: skip
            for i in range(count):
                writer.add(f"b{i}", ids, mask, aux[i], final[i])
        seconds = time.perf_counter() - start
        ratio = json.loads((tmp_path / f"{mode}{threads}.json").read_text())["bytes"]["ratio"]
        label = f"{mode} (threads {threads})" if mode == "zstd" else mode
        print(f"  {label:18s} {megabytes / seconds:7.0f} MB/s   stored/raw {ratio:.3f}")
