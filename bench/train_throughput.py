"""Draft-training throughput and exact resume on synthetic data of a real target's shapes.

Writes a target directory holding only what training reads (config.json and the
embedding / final norm / lm_head tensors, random), random hidden-state shards and a
draft vocabulary, then times `Trainer.train_step` and checks that two segments equal
one run. Prints a table: tokens/s, the step split (waiting for data, preparing the
batch, forward, backward, optimiser; timed with device syncs), the FLOPs one step
executes (counted by torch's FlopCounterMode) over the step time against the bf16
matrix-product rate, and peak GPU memory.

    python bench/train_throughput.py --shape llama-8b --device cuda --dtype bfloat16
    python bench/train_throughput.py --shape demo --device cpu       # SmolLM2-135M shapes
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import save_file

from draftsmith.draft.vocab import build
from draftsmith.formats.shards.writer import ShardWriter
from draftsmith.store.hashing import sample_address
from draftsmith.store.layout import shard_name
from draftsmith.train import loop as train

SHAPES = {
    # hidden, intermediate, heads, kv heads, vocab, rope theta
    "demo": (576, 1536, 9, 3, 49152, 100000.0),
    "llama-8b": (4096, 14336, 32, 8, 128256, 500000.0),
}


def make_target(root: Path, shape: str) -> None:
    hidden, inter, heads, kv, vocab, theta = SHAPES[shape]
    root.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_hidden_layers": 32,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": theta,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    }
    (root / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(0)
    tensors = {
        "model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g, dtype=torch.bfloat16) * 0.02,
        "lm_head.weight": torch.randn(vocab, hidden, generator=g, dtype=torch.bfloat16) * 0.02,
        "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
    }
    save_file(tensors, str(root / "model.safetensors"))


def make_shards(root: Path, shape: str, samples: int, length: int, shards: int, dtype: str) -> Path:
    """A states store of `shards` shards and a mix's view of it (sample i in shard i % shards);
    returns the view's path."""
    hidden, _, _, _, vocab, _ = SHAPES[shape]
    torch_dtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(1)
    view = []
    for s in range(shards):
        rows = []
        for i in range(s, samples, shards):
            n = length - (i * 37) % (length // 4)  # varied lengths
            ids = torch.randint(0, 2000, (n,), generator=g)
            mask = (torch.arange(n) > n // 3).to(torch.uint8)
            rows.append((f"s-{i:06d}", sample_address(ids.numpy(), mask.numpy()), ids, mask))
        name = shard_name([address for _, address, _, _ in rows])
        with ShardWriter(root, name, mode="raw", hidden_size=hidden, dtype=dtype, meta={}) as writer:
            for sample_id, address, ids, mask in rows:
                n = len(ids)
                aux = torch.randn(n, 3 * hidden, generator=g).to(torch_dtype)
                final = torch.randn(n, hidden, generator=g).to(torch_dtype)
                writer.add(address, ids.tolist(), mask.tolist(), aux, final)
                view.append([sample_id, address, name])
    view.sort()
    path = root / "assignment.json"
    path.write_text(json.dumps({"samples": view, "shards": sorted({row[2] for row in view})}))
    return path


def matmul_tflops() -> float:
    """The bf16 rate of a large matrix product on this GPU (mean of 10 after 3 warm-ups)."""
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - started) / 1e12


def synthetic_spec(work: Path, args: argparse.Namespace, autocast: str | None, checkpoint_every: int) -> dict:
    """A training spec over a random target of `args.shape`, random shards (bf16 when
    training autocasts, float32 otherwise) and a draft vocabulary, all under `work`."""
    make_target(work / "target", args.shape)
    shard_dtype = "bfloat16" if autocast else "float32"
    assignment = make_shards(work / "hidden", args.shape, args.samples, args.length, 2, shard_dtype)
    vocab = build(Counter(range(2000)), args.draft_vocab, SHAPES[args.shape][4])
    save_file(vocab, str(work / "vocab.safetensors"))
    settings = {
        "draft_vocab_size": args.draft_vocab,
        "ttt_steps": args.ttt,
        "max_position_embeddings": 8192,
        "lr": 1e-4,
        "betas": [0.9, 0.95],
        "weight_decay": 0.0,
        "warmup_steps": 2,
        "total_steps": args.steps,
        "grad_clip": 0.5,
        "grad_accum": 1,
        "batch_tokens": args.batch_tokens,
        "checkpoint_every": checkpoint_every,
        "val_fraction": 0.05,
        "seed": 0,
        "device": args.device,
        "dtype": autocast,
        "gpus": 1,
    }
    return {
        "key": "bench",
        "hf_dir": str(work / "target"),
        "hidden_dir": str(work / "hidden"),
        "assignment": str(assignment),
        "vocab": str(work / "vocab.safetensors"),
        "train": settings,
    }


def step_flops(trainer: train.Trainer) -> float:
    """FLOPs one training step executes (matrix products and attention), counted by torch;
    the counted step is a real one, so the run continues from it. Torch counts a causal
    attention kernel's whole T x T square; only the half on and below the diagonal is
    computed, so those kernels count half."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        trainer.train_step()
    counts = counter.get_flop_counts()["Global"]
    causal = sum(flops for op, flops in counts.items() if "scaled_dot_product" in str(op))
    return float(counter.get_total_flops() - causal / 2)


def print_costliest_ops(trainer: train.Trainer, count: int, cuda: bool) -> None:
    """One more step under torch's profiler: where the device time goes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        trainer.train_step()
        if cuda:
            torch.cuda.synchronize()
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=count, max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="demo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="autocast dtype (bfloat16) or none")
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--draft-vocab", type=int, default=32000)
    parser.add_argument("--ttt", type=int, default=7)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--kernels", type=int, default=0, help="print the N costliest ops of one step")
    parser.add_argument(
        "--matmul-tflops", type=float, default=None, help="bf16 matmul rate (default: measured)"
    )
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="train-bench-"))
    if args.matmul_tflops is None:
        args.matmul_tflops = matmul_tflops() if args.device == "cuda" else 780.0
    started = time.perf_counter()
    spec = synthetic_spec(work, args, args.dtype, checkpoint_every=args.steps // 2)
    prepared = time.perf_counter() - started
    cuda = args.device == "cuda"
    trainer = train.Trainer(spec)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.profile = True
    times, tokens, straight, phases = [], [], [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        record = trainer.train_step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        tokens.append(record["tokens"])
        straight.append(record["loss"])
        phases.append(record["timings"])
    warm = slice(2, None)  # first steps include allocator growth and (GPU) kernel selection
    rate = sum(tokens[warm]) / sum(times[warm])
    step_time = sum(times[warm]) / len(times[warm])
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    split = {name: sum(p[name] for p in phases[warm]) / len(phases[warm]) for name in phases[0]}
    worst_wait = max(p["data_wait_s"] for p in phases[warm])
    flops = step_flops(trainer)
    if args.kernels:
        print_costliest_ops(trainer, args.kernels, cuda)
    del trainer
    # Exact resume: segment 0, checkpoint, fresh objects, segment 1.
    first = train.run_segment(spec, 0, None, work / "c0.pt", work / "m0.jsonl")
    second = train.run_segment(spec, 1, work / "c0.pt", work / "c1.pt", work / "m1.jsonl")
    resumed = [r["loss"] for r in first["records"] + second["records"] if r["kind"] == "train"]
    worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(resumed, straight, strict=True))
    rows = [
        ("shape", args.shape),
        ("device / autocast", f"{args.device} / {args.dtype}"),
        ("draft vocab / TTT steps", f"{args.draft_vocab} / {args.ttt}"),
        ("batch tokens (padded budget)", args.batch_tokens),
        ("real tokens per step (mean)", f"{sum(tokens) / len(tokens):.0f}"),
        ("step time (s, after 2 warm-up)", f"{step_time:.3f}"),
        *((f"  {name[:-2].replace('_', ' ')} (s)", f"{value:.4f}") for name, value in split.items()),
        ("  worst data wait (s)", f"{worst_wait:.4f}"),
        ("throughput (tok/s)", f"{rate:,.0f}"),
        ("FLOPs per step (executed, TFLOP)", f"{flops / 1e12:.2f}"),
        ("achieved TFLOP/s", f"{flops / step_time / 1e12:.1f}"),
        ("bf16 matmul rate (TFLOP/s)", f"{args.matmul_tflops:.0f}"),
        ("share of the bf16 matmul rate", f"{flops / step_time / 1e12 / args.matmul_tflops:.1%}"),
        ("peak GPU memory (GiB)", f"{peak:.1f}"),
        ("first / last loss", f"{straight[0]:.4f} / {straight[-1]:.4f}"),
        ("resume: worst relative loss diff", f"{worst:.2e}" + (" (bitwise)" if worst == 0 else "")),
        ("synthetic data written (s)", f"{prepared:.1f}"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"| {'what'.ljust(width)} | value |\n|{'-' * (width + 2)}|-------|")
    for key, value in rows:
        print(f"| {key.ljust(width)} | {value} |")


if __name__ == "__main__":
    main()
