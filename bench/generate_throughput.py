"""In-process (hf backend) generation throughput at the demo target's shapes, random weights.

Builds SmolLM2-135M-Instruct's architecture (30 layers, hidden 576) with random weights,
so no model file is needed, and times `generate_ids` (what the hf backend runs per batch)
on one batch of random prompts per setting: dtype x attention x batch size. Random weights rarely
emit a stop id, so every row runs to `--new-tokens`: an upper bound on a batch's time.
Prints a table: seconds per batch, per decode step, generated tokens/s, peak memory.
`--attention` takes the values of `generation.hf.attention`. `--profile` also prints
torch's profiler table for each setting (the ops costing the most device and host time).

    python bench/generate_throughput.py --device cuda --batch 512 --batch 2048 \\
        --dtype float32 --dtype bfloat16 --attention sdpa --attention grouped_decode
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time

import torch
from train_throughput import SHAPES  # this folder's draft-training bench
from transformers import LlamaConfig, LlamaForCausalLM

from draftsmith.responses.hf import ATTENTION, generate_ids
from draftsmith.responses.settings import Sampling

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB, ROPE_THETA = SHAPES["demo"]
# SmolLM2-135M-Instruct's config.json: the shapes above, 30 layers, tied embeddings.
DEMO_CONFIG = {
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "num_hidden_layers": 30,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "vocab_size": VOCAB,
    "rope_theta": ROPE_THETA,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}


def random_prompts(count: int, shortest: int, longest: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = sorted(rng.randint(shortest, longest) for _ in range(count))  # the backend sorts too
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def time_batch(
    model, prompts: list[list[int]], new_tokens: int, device: torch.device, attention: str
) -> tuple[float, int]:
    greedy = Sampling(max_new_tokens=new_tokens, temperature=0.0, top_p=1.0, seed=0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    out = generate_ids(model, prompts, pad_id=0, stop_ids=[2], sampling=greedy, attention=attention)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    generated = sum(next((i + 1 for i, t in enumerate(row) if t == 2), len(row)) for row in out)
    return seconds, generated


@contextlib.contextmanager
def profiled(enabled: bool, device: torch.device):
    """torch's profiler around the block when `enabled` (else None)."""
    if not enabled:
        yield None
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        yield profile


def print_profile(profile, device: torch.device, rows: int = 20) -> None:
    averages = profile.key_averages()
    sorts = ["cpu_time_total"] + (["device_time_total"] if device.type == "cuda" else [])
    for sort in sorts:
        print(f"\n```\n{averages.table(sort_by=sort, row_limit=rows)}\n```\n", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", action="append", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--batch", action="append", type=int)
    parser.add_argument("--attention", action="append", choices=ATTENTION)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, nargs=2, default=(120, 360), metavar=("MIN", "MAX"))
    parser.add_argument("--profile", action="store_true", help="print the profiler's top ops per setting")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    config = LlamaConfig(**DEMO_CONFIG)
    print("| dtype | attention | batch | prompt tokens | s/batch | ms/step | generated tok/s | peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in args.dtype or ["float32"]:
        model = LlamaForCausalLM(config).to(device, getattr(torch, dtype)).eval()
        for attention in args.attention or ["sdpa"]:
            warm = random_prompts(8, 16, 32, config.vocab_size, seed=1)
            time_batch(model, warm, 8, device, attention)
            for batch in args.batch or [16]:
                prompts = random_prompts(batch, *args.prompt_tokens, config.vocab_size, seed=0)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                with profiled(args.profile, device) as profile:
                    seconds, generated = time_batch(model, prompts, args.new_tokens, device, attention)
                peak = (
                    torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
                )
                tokens = sum(len(p) for p in prompts)
                print(
                    f"| {dtype} | {attention} | {batch} | {tokens:,} | {seconds:.2f} "
                    f"| {1000 * seconds / args.new_tokens:.1f} | {generated / seconds:,.0f} | {peak:.1f} |",
                    flush=True,
                )
                if profile is not None:
                    print_profile(profile, device)
        del model


if __name__ == "__main__":
    main()
