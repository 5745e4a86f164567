# Evaluate: held-out prompts decoded by the target alone and with the exported SGLang
# draft (chain speculative decoding, greedy, checked lossless against the target).
# Logic: src/draftsmith/evaluate/. A prompt set that overlaps the training prompts fails.


rule evaluate:
    input:
        model=model_info_file(),
        export_config=str(PLAN.export_dir / "sglang" / "config.json"),
        export_weights=str(PLAN.export_dir / "sglang" / "model.safetensors"),
        export_manifest=str(PLAN.export_dir / "sglang" / "draftsmith_export.json"),
        merged=str(PLAN.merged_dir / "train.jsonl"),
        responses=[
            str(PLAN.responses_dir(n) / "responses.jsonl")
            for n in PLAN.merged_datasets
        ],
        prompt_sets=prompt_set_paths(),
    output:
        json=str(PLAN.eval_dir / "benchmark.json"),
        md=str(PLAN.eval_dir / "benchmark.md"),
        per_prompt=str(PLAN.eval_dir / "per_prompt.jsonl"),
        manifest=str(PLAN.eval_dir / "manifest.json"),
    log:
        f"{LOGS}/evaluate/{PLAN.eval_key}.log",
    benchmark:
        f"benchmarks/evaluate/{PLAN.eval_key}.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 2
    resources:
        mem_mb=4000,
        gpu=evaluate_gpus(config),
    script:
        "../scripts/evaluate.py"
