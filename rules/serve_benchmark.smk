# Serving benchmark (production path, GPUs and SGLang only): the converted target served
# alone, then with the exported SGLang draft for each k, one server at a time; the logic
# and its refusals live in src/draftsmith/serving/. Per-server logs go to logs/ beside
# the report.


rule serve_benchmark:
    input:
        model=model_info_file(),
        draft_config=str(PLAN.export_dir / "sglang" / "config.json"),
        draft_weights=str(PLAN.export_dir / "sglang" / "model.safetensors"),
        prompts=prompt_set_paths(config["serve_benchmark"]["prompt_set"]),
        merged=str(PLAN.merged_dir / "train.jsonl"),
        responses=[
            str(PLAN.responses_dir(n) / "responses.jsonl")
            for n in PLAN.merged_datasets
        ],
    output:
        json=str(PLAN.serve_bench_dir / "serve_benchmark.json"),
        md=str(PLAN.serve_bench_dir / "serve_benchmark.md"),
        manifest=str(PLAN.serve_bench_dir / "manifest.json"),
    log:
        f"{LOGS}/serve_benchmark/{PLAN.serve_bench_key}.log",
    benchmark:
        f"benchmarks/serve_benchmark/{PLAN.serve_bench_key}.tsv"
    conda:
        "../envs/sglang.yaml"
    threads: 2
    resources:
        mem_mb=16000,
        gpu=config["serve_benchmark"]["sglang"]["tp_size"],
    script:
        "../scripts/serve_benchmark.py"
