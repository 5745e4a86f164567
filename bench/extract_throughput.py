"""Hidden-state extraction throughput: the full extraction path per storage mode against forward-only.

GPU (default): Llama-3.1-8B shapes (hidden 4096, 32 layers, intermediate 14336,
32/8 heads, vocab 128256) with random bf16 weights made directly on the GPU,
batches of `--batch-size` x `--seq-len` random token ids. For each mode it times,
wall clock, one `draftsmith.hidden.hf.extract` call into a fresh `ShardWriter`
on local disk, from before the writer is made until `close()` (fsync included)
returns, after a warm-up extraction of the same shape. Forward-only (the base
model, no hooks) runs over the same batches before and after the modes; the
fastest forward-only run is the reference. `--repeat N` times every run N
times and reports the fastest (for a shared, noisy host). Mode `raw-null`
(etc.) drops the bytes instead of writing and hashing them: the rest of the
path alone. Each shard is read back (sample 0 against
raw's), the warm-up shards are sha256-verified, and every shard is deleted once
measured.

    PYTHONPATH=src python bench/extract_throughput.py                 # on the GPU machine
    PYTHONPATH=src python bench/extract_throughput.py --probe         # + disk/sha256/zstd alone
    PYTHONPATH=src python bench/extract_throughput.py --cpu-demo      # demo model on the CPU

--cpu-demo: the demo model (SmolLM2-135M, float32) on the CPU, batch_tokens 4096.

The last thing printed is one markdown table; `--json` also writes the numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import threading
import time
from pathlib import Path

import torch

from draftsmith.formats.shards import codec as shard_codec
from draftsmith.formats.shards import sink as shard_sink
from draftsmith.formats.shards import writer as shard_writer
from draftsmith.formats.shards.reader import ShardReader
from draftsmith.formats.shards.writer import ShardWriter
from draftsmith.hidden.hf import AuxCapture, MergedSample, _pad, batches, extract
from draftsmith.target.layers import default_aux_layers

DEMO_MODEL = Path(__file__).resolve().parents[1] / "artifacts/model/4c5aabee756e1114/hf"
LLAMA_8B = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-demo", action="store_true", help="demo model on the CPU (float32)")
    parser.add_argument("--model-dir", type=Path, default=DEMO_MODEL, help="HF dir for --cpu-demo")
    parser.add_argument("--tokens", type=int, help="tokens per timed run (default 1048576 GPU, 16384 CPU)")
    parser.add_argument("--warmup-tokens", type=int, help="tokens per warm-up (default 8 batches GPU, 1 CPU)")
    parser.add_argument("--batch-size", type=int, help="rows per batch (default 8)")
    parser.add_argument("--seq-len", type=int, help="tokens per sample (default 2048 GPU, 512 CPU)")
    parser.add_argument("--modes", default="raw,zstd,fp8", help="also raw-null etc.: bytes dropped")
    parser.add_argument("--zstd-threads", type=int, default=-1)
    parser.add_argument("--zstd-level", type=int, default=1)
    parser.add_argument("--writer-queue", type=int, default=4, help="extract.writer_queue (config default 4)")
    parser.add_argument("--out", type=Path, default=Path("bench/_shards"), help="shard dir (local disk)")
    parser.add_argument("--no-writeback-kick", action="store_true", help="shard_sink._WRITEBACK_CHUNK = 0")
    parser.add_argument("--probe", action="store_true", help="also time disk, sha256 and zstd alone")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="timed runs per mode (and forward-only before/after); the fastest is reported, for noisy hosts",
    )
    parser.add_argument("--label", default="", help="name for this run in the table header")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    gpu = not args.cpu_demo
    args.batch_size = args.batch_size or 8
    args.seq_len = args.seq_len or (2048 if gpu else 512)
    batch = args.batch_size * args.seq_len
    args.tokens = args.tokens or (1 << 20 if gpu else 16384)
    args.warmup_tokens = args.warmup_tokens or (8 * batch if gpu else batch)
    args.modes = [m for m in args.modes.split(",") if m]
    return args


# ------------------------------------------------------------------ environment


def environment(args, out: Path) -> dict:
    env = {
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "cpu": _cpu_model(),
        "sha_ni": "sha_ni" in _read("/proc/cpuinfo"),
        "mem_total_gib": _meminfo("MemTotal") / 2**20,
        "disk_free_gib": shutil.disk_usage(out).free / 2**30,
        "out_fs": _filesystem(out),
        "dirty_ratio": _read("/proc/sys/vm/dirty_ratio").strip(),
        "dirty_background_ratio": _read("/proc/sys/vm/dirty_background_ratio").strip(),
        "writeback_chunk": getattr(shard_sink, "_WRITEBACK_CHUNK", None),
    }
    try:
        import transformers
        import zstandard

        env["transformers"], env["zstandard"] = transformers.__version__, zstandard.__version__
    except ImportError as exc:
        env["import_error"] = str(exc)
    if torch.cuda.is_available() and not args.cpu_demo:
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs"
        env["cuda"] = torch.version.cuda
    return env


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _meminfo(key: str) -> int:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _filesystem(path: Path) -> str:
    best = ("", "?", "?")
    resolved = str(path.resolve())
    for line in _read("/proc/mounts").splitlines():
        device, mount, fstype = line.split()[:3]
        if (resolved == mount or resolved.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best[0]):
            best = (mount, fstype, device)
    return f"{best[1]} on {best[0]} ({best[2]})"


# ------------------------------------------------------------------ models and data


def build_gpu_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**LLAMA_8B, attn_implementation="sdpa")
    start = time.perf_counter()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # parameters are made in bf16, on the GPU, initialised there
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval().requires_grad_(False)
    torch.cuda.synchronize()
    params = sum(p.numel() for p in model.parameters())
    print(
        f"built Llama-3.1-8B shapes on the GPU: {params / 1e9:.2f}B params "
        f"in {time.perf_counter() - start:.1f}s"
    )
    return model, "bfloat16"


def load_demo_model(model_dir: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, "float32"


def random_samples(count: int, seq_len: int, vocab: int, seed: int, prefix: str) -> list[MergedSample]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (count, seq_len), generator=g).tolist()
    return [MergedSample(f"{prefix}/{i:06d}", row, [1] * seq_len) for i, row in enumerate(ids)]


# ------------------------------------------------------------------ timing


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.inference_mode()
def forward_only(base, samples, batch_tokens: int, device: str) -> dict:
    """The base model over extract()'s batches, outputs dropped; ids padded and sent the same way."""
    sync(device)
    start = time.perf_counter()
    tokens = 0
    for batch in batches(samples, batch_tokens):
        ids, mask = _pad(batch, 0)
        out = base(
            input_ids=ids.to(device, non_blocking=True),
            attention_mask=mask.to(device, non_blocking=True),
            use_cache=False,
        )
        del out
        tokens += sum(len(s.input_ids) for s in batch)
    sync(device)
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}


class TimedWriter(ShardWriter):
    """Records how long close() (the flush, fsync and index write) took, and the I/O threads' busy time."""

    close_seconds = 0.0
    busy = None

    def close(self):
        start = time.perf_counter()
        try:
            return super().close()
        finally:
            self.close_seconds = time.perf_counter() - start
            sink = getattr(self, "_sink", None)
            self.busy = dict(sink.busy) if sink is not None and hasattr(sink, "busy") else None


class NullWriter(TimedWriter):
    """Everything but the file write and the sha256: the bytes are counted and dropped."""

    def _write(self, view) -> None:
        self._offset += len(view)


def extract_once(capture, samples, args, mode, name, directory, hidden, dtype, device, batch_tokens):
    writer_cls = NullWriter if mode.endswith("-null") else TimedWriter
    mode = mode.removesuffix("-null")
    writer_kwargs = {"mode": mode, "hidden_size": hidden, "dtype": dtype, "meta": {"bench": name}}
    if mode == "zstd":
        writer_kwargs.update(zstd_level=args.zstd_level, zstd_threads=args.zstd_threads)
    written = []
    sync(device)
    start = time.perf_counter()
    with writer_cls(directory, name, **writer_kwargs) as writer:
        extract(
            capture,
            samples,
            writer,
            batch_tokens=batch_tokens,
            device=device,
            pad_id=0,
            writer_queue=args.writer_queue,
            on_written=lambda n: written.append(time.perf_counter()),
        )
    seconds = time.perf_counter() - start
    manifest = json.loads((directory / f"{name}.json").read_text())
    return seconds, writer, manifest


def remove_shard(directory: Path, name: str) -> None:
    for suffix in (".bin", ".json"):
        (directory / f"{name}{suffix}").unlink(missing_ok=True)


def run_mode(capture, samples, warm, args, mode, hidden, dtype, device, batch_tokens, reference) -> dict:
    directory = args.out / mode
    directory.mkdir(parents=True, exist_ok=True)
    common = (hidden, dtype, device, batch_tokens)
    null = mode.endswith("-null")
    warm_seconds, _, warm_manifest = extract_once(capture, warm, args, mode, "warm", directory, *common)
    verify = "skipped (nothing written)" if null else ShardReader(directory, "warm").verify()
    remove_shard(directory, "warm")
    runs = []  # (seconds, writer, manifest); the fastest of --repeat runs is reported
    sample = None
    for _ in range(args.repeat):
        runs.append(extract_once(capture, samples, args, mode, mode, directory, *common))
        if not null and sample is None:
            reader = ShardReader(directory, mode)
            first = reader[0]
            sample = {"aux": first.aux.clone(), "final": first.final.clone()}
            del reader, first
        remove_shard(directory, mode)
    seconds, writer, manifest = min(runs, key=lambda run: run[0])
    tokens = manifest["num_tokens"]
    stored = manifest["bytes"]["stored"]
    result = {
        "mode": mode,
        "tokens": tokens,
        "seconds": seconds,
        "tok_s": tokens / seconds,
        "all_tok_s": [tokens / run[0] for run in runs],
        "close_seconds": writer.close_seconds,
        "busy_seconds": writer.busy,
        "bin_size": manifest["bin"]["size"],
        "bytes_per_token": stored / tokens,
        "stored_over_raw": manifest["bytes"]["ratio"],
        "warmup_tok_s": warm_manifest["num_tokens"] / warm_seconds,
        "warmup_verify": verify or "ok",
        "fp8_error": manifest["fp8_error"],
        "zstd": manifest["zstd"],
    }
    if reference is not None and sample is not None:
        result["readback_vs_raw"] = compare(reference, sample, mode)
    return result, sample


def compare(reference: dict, sample: dict, mode: str) -> str:
    if mode in ("raw", "zstd"):
        same = all(torch.equal(_bits(reference[k]), _bits(sample[k])) for k in ("aux", "final"))
        return "bit-identical" if same else "DIFFERS"
    errs = []
    for k in ("aux", "final"):
        x, y = reference[k].double(), sample[k].double()
        errs.append(f"{k} {float((x - y).norm() / x.norm()):.4f}")
    return "rel. error " + ", ".join(errs)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.element_size() == 4 else t.view(torch.int16)


# ------------------------------------------------------------------ probes (pieces alone)


def probe(capture, samples, batch_tokens: int, device: str, out: Path, args) -> dict:
    """Disk write+fsync, sha256 and zstd alone, on one real batch of this model's states."""
    results = {}
    chunk = torch.randint(0, 256, (64 << 20,), dtype=torch.uint8).numpy()
    total = 8 << 30
    for kick in (False, True):
        path = out / f"probe-{int(kick)}.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        start = time.perf_counter()
        written = kicked = 0
        while written < total:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            written += len(chunk)
            if kick and written - kicked >= 256 << 20:
                os.posix_fadvise(fd, kicked, written - kicked, os.POSIX_FADV_DONTNEED)
                kicked = written
        wrote = time.perf_counter() - start
        os.fsync(fd)
        os.close(fd)
        seconds = time.perf_counter() - start
        path.unlink()
        label = "disk write+fsync, fadvise kick" if kick else "disk write+fsync, plain"
        results[label] = (
            f"{total / seconds / 1e9:.2f} GB/s (write() calls done at {wrote:.1f}s of {seconds:.1f}s)"
        )
    data = (chunk.tobytes() * 16)[: 1 << 30]
    start = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    results["sha256, one thread"] = f"{len(data) / (time.perf_counter() - start) / 1e9:.2f} GB/s"
    del data

    batch = next(batches(samples, batch_tokens))
    ids, mask = _pad(batch, 0)
    aux, final = capture(ids.to(device), mask.to(device))
    blobs = []
    for row in range(len(batch)):
        for t in (aux[row], final[row]):
            blobs.append(shard_codec.shuffle_bytes(shard_writer._to_numpy(t.cpu())))
    megabytes = sum(b.nbytes for b in blobs) / 1e6
    results["zstd input"] = f"{len(blobs)} blobs, {megabytes:.0f} MB (one batch, shuffled)"
    try:
        import zstandard
    except ImportError:
        return results
    level = args.zstd_level

    def timed(label, fn):
        start = time.perf_counter()
        size = fn()
        seconds = time.perf_counter() - start
        results[label] = f"{megabytes / seconds:.0f} MB/s in, ratio {size / (megabytes * 1e6):.3f}"

    one = zstandard.ZstdCompressor(level=level)
    start = time.perf_counter()
    size = sum(len(one.compress(b)) for b in blobs[:2])  # one aux + one final blob
    mb2 = sum(b.nbytes for b in blobs[:2]) / 1e6
    results["zstd 1 thread"] = (
        f"{mb2 / (time.perf_counter() - start):.0f} MB/s in, ratio {size / mb2 / 1e6:.3f}"
    )
    for threads in (-1, 8):
        mt = zstandard.ZstdCompressor(level=level, threads=threads)
        timed(f"zstd threads={threads}, blob by blob", lambda mt=mt: sum(len(mt.compress(b)) for b in blobs))

    def pooled(workers: int, threads: int):
        local = threading.local()
        sizes = [0] * len(blobs)

        def work(i):
            if not hasattr(local, "c"):
                local.c = zstandard.ZstdCompressor(level=level, threads=threads)
            sizes[i] = len(local.c.compress(blobs[i]))

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(work, range(len(blobs))))
        return sum(sizes)

    cpus = os.cpu_count() or 1
    timed(f"zstd pool {cpus} x 1 thread", lambda: pooled(cpus, 0))
    timed(f"zstd pool 4 x {max(1, cpus // 4)} threads", lambda: pooled(4, max(1, cpus // 4)))
    return results


# ------------------------------------------------------------------ main


def main() -> None:
    args = parse_args()
    if args.no_writeback_kick and hasattr(shard_sink, "_WRITEBACK_CHUNK"):
        shard_sink._WRITEBACK_CHUNK = 0
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment(args, args.out)
    print(json.dumps(env, indent=1), flush=True)
    if args.cpu_demo:
        device, batch_tokens = "cpu", 4096
        model, dtype = load_demo_model(args.model.directory)
        what = f"SmolLM2-135M (demo model), float32, CPU ({env['cpus']} cores)"
    else:
        device = "cuda"
        batch_tokens = args.batch_size * args.seq_len
        model, dtype = build_gpu_model()
        what = f"Llama-3.1-8B shapes, random bf16 weights, {env.get('gpu', 'GPU')}"
    config = model.config
    hidden, layers = config.hidden_size, config.num_hidden_layers
    count = max(1, args.tokens // args.seq_len)
    samples = random_samples(count, args.seq_len, config.vocab_size, seed=0, prefix="bench")
    warm = random_samples(
        max(1, args.warmup_tokens // args.seq_len), args.seq_len, config.vocab_size, 1, "warm"
    )
    base = model.get_decoder()

    forward_only(base, warm, batch_tokens, device)  # warm-up: kernels, allocator, clocks
    forwards = [forward_only(base, samples, batch_tokens, device) for _ in range(args.repeat)]
    print(f"forward-only: {forwards[0]['tok_s']:,.0f} tok/s", flush=True)
    capture = AuxCapture(model, default_aux_layers(layers))
    probes = probe(capture, samples, batch_tokens, device, args.out, args) if args.probe else None
    if probes:
        print(json.dumps(probes, indent=1), flush=True)
    results, reference = [], None
    for mode in args.modes:
        result, sample = run_mode(
            capture, samples, warm, args, mode, hidden, dtype, device, batch_tokens, reference
        )
        if mode == "raw":
            reference = sample
        results.append(result)
        print(json.dumps(result), flush=True)
    capture.close()
    forwards += [forward_only(base, samples, batch_tokens, device) for _ in range(args.repeat)]
    forward = max(f["tok_s"] for f in forwards)
    shutil.rmtree(args.out, ignore_errors=True)

    raw_bpt = next((r["bytes_per_token"] for r in results if r["mode"] == "raw"), None)
    raw_ideal = 4 * hidden * torch.empty((), dtype=getattr(torch, dtype)).element_size() + 5
    label = f" [{args.label}]" if args.label else ""
    print()
    print(
        f"### {what}{label}: batch {args.batch_size}x{args.seq_len} ({batch_tokens} tokens), "
        f"{count * args.seq_len:,} tokens per run, aux layers {default_aux_layers(layers)}"
    )
    print()
    print(
        "| path | tokens/s | % of forward-only | bytes/token | vs raw bytes | close+fsync (s) | read back |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    runs = ", ".join(f"{f['tok_s']:,.0f}" for f in forwards)
    print(f"| forward only (no capture), best of {runs} | {forward:,.0f} | 100.0% | | | | |")
    for r in results:
        name = r["mode"]
        if name.startswith("zstd"):
            name = f"{name} (level {r['zstd']['level']}, threads {r['zstd']['threads']})"
        if name.endswith("-null"):
            name = f"{name.removesuffix('-null')}, bytes dropped (no file write, no sha256)"
        if r.get("busy_seconds") and not r["mode"].endswith("-null"):
            busy = ", ".join(f"{k} {v / r['seconds']:.0%}" for k, v in r["busy_seconds"].items())
            name += f"; threads busy: {busy}"
        versus = r["bytes_per_token"] / (raw_bpt or raw_ideal)
        note = r.get("readback_vs_raw", "")
        if r["fp8_error"]:
            note += f"; manifest fp8 error aux {r['fp8_error']['aux']['relative_frobenius']:.4f}"
        print(
            f"| {name} | {r['tok_s']:,.0f} | {100 * r['tok_s'] / forward:.1f}% | {r['bytes_per_token']:,.0f} "
            f"| {versus:.3f} | {r['close_seconds']:.2f} | {note.lstrip('; ')} |"
        )
    print()
    if args.json:
        payload = {"env": env, "what": what, "args": {k: str(v) for k, v in vars(args).items()}}
        payload.update(forward=forwards, results=results, probes=probes)
        args.json.write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
