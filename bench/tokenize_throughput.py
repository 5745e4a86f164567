"""Tokenization speed in one process against worker processes, on real response records.

Repeats the records of the given responses files (ids made unique) to `--records`, then
times `tokenize_records` with 1 and with `--workers` workers and checks both give the
same samples. Prints a table.

    python bench/tokenize_throughput.py --hf-dir artifacts/model/<key>/hf \
        --responses artifacts/responses/*/*/responses.jsonl --records 3600 --workers 2
"""

from __future__ import annotations

import argparse
import os
import time

from draftsmith.fsutil import atomic
from draftsmith.target import load as target
from draftsmith.tokens.chat import ChatTokenizer, tokenize_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--responses", nargs="+", required=True)
    parser.add_argument("--records", type=int, default=3600)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--eot-id", type=int, default=2, help="the target's end-of-turn id")
    parser.add_argument("--max-length", type=int, default=512)
    args = parser.parse_args()
    base = [r for path in args.responses for r in atomic.read_jsonl(path)]
    records = [{**base[i % len(base)], "id": f"{base[i % len(base)]['id']}-{i}"} for i in range(args.records)]
    chat = ChatTokenizer(target.load_tokenizer(args.hf_dir), [args.eot_id], args.max_length)
    rows, results = [], []
    for workers in (1, args.workers):
        started = time.perf_counter()
        samples, _ = tokenize_records(records, chat, "bench", workers=workers)
        seconds = time.perf_counter() - started
        results.append(samples)
        rows.append((workers, seconds, len(records) / seconds))
    assert results[0] == results[1], "worker processes changed the samples"
    print(f"{len(records)} records, {os.cpu_count()} cores\n")
    print("| workers | seconds | records/s |\n|---|---|---|")
    for workers, seconds, rate in rows:
        print(f"| {workers} | {seconds:.2f} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
