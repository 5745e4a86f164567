"""Time and peak memory of loading a dataset with one over-long line, as the responses stage does.

Writes 40 short prompt rows and one valid row whose prompt is `--mb` MB of words, then loads
them in a fresh process per size (its peak RSS is its own) with the real tokenizer's count
and, unless `--no-char-bound`, the character bound from its longest token. Without the
bound a line under the line bound is tokenized whole (the old path). Prints a table.

    python bench/long_line.py --hf-dir artifacts/model/<key>/hf --mb 0 10 50
    python bench/long_line.py --hf-dir artifacts/model/<key>/hf --mb 10 --no-char-bound
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftsmith.formats.datasets.load import load_prompts
from draftsmith.target.load import load_tokenizer, longest_token_chars


def write_dataset(path: Path, mb: float) -> None:
    with path.open("w") as f:
        for i in range(40):
            f.write(json.dumps({"prompt": f"Question {i}?"}) + "\n")
            if i == 20 and mb:
                f.write(json.dumps({"prompt": "word " * int(mb * 200_000)}) + "\n")


def measure(hf_dir: str, path: str, char_bound: bool) -> dict:
    tokenizer = load_tokenizer(hf_dir)
    entry = {"path": path, "format": "prompt", "max_bad_fraction": 1.0, "max_prompt_tokens": 4096}

    def count(messages: list[dict]) -> int:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return len(ids)

    started = time.perf_counter()
    bound = longest_token_chars(tokenizer) if char_bound else None
    loaded = load_prompts("d", entry, count, bound)
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    detail = loaded.bad_rows[0].detail if loaded.bad_rows else "-"
    return {"seconds": seconds, "peak_mb": peak_mb, "prompts": len(loaded.prompts), "bad": detail}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--mb", type=float, nargs="+", default=[0, 10, 50])
    parser.add_argument("--no-char-bound", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.hf_dir, args.one, not args.no_char_bound)))
        return
    print("| long line (MB) | char bound | seconds | peak RSS (MB) | prompts | bad row |")
    print("|---|---|---|---|---|---|")
    for mb in args.mb:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "d.jsonl"
            write_dataset(path, mb)
            flags = ["--no-char-bound"] if args.no_char_bound else []
            command = [sys.executable, __file__, "--hf-dir", args.hf_dir, "--one", str(path), *flags]
            row = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        print(
            f"| {mb:g} | {'off' if args.no_char_bound else 'on'} | {row['seconds']:.2f} "
            f"| {row['peak_mb']:.0f} | {row['prompts']} | {row['bad'][:70]} |"
        )


if __name__ == "__main__":
    main()
