# Evaluate: held-out prompts decoded by the target alone and with the exported SGLang
# draft (chain and tree speculative decoding, greedy, checked lossless against the
# target), and the fastest setting recommended as SGLang launch flags.
# A prompt set that overlaps the training prompts fails. Logic: src/draftsmith/evaluate/.


rule evaluate:
    input:
        **by_content(
            model=MODEL_INFO,
            export_config=str(PLAN.export.path("sglang_config")),
            export_weights=str(PLAN.export.path("sglang_weights")),
            export_record=str(PLAN.export.path("sglang_record")),
            merged=MERGED,
            responses=MERGED_RESPONSES,
            prompt_sets=prompt_set_paths(),
        ),
    output:
        **built(PLAN.evaluate.outputs),
    log:
        f"{LOGS}/evaluate/{PLAN.evaluate.key}.log",
    benchmark:
        f"benchmarks/evaluate/{PLAN.evaluate.key}.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 2
    resources:
        mem_mb=4000,
        gpu=evaluate_gpus(config),
    params:
        settings=settings_of("evaluate"),
        artifact=PLAN.evaluate,
        export=PLAN.export,  # the recommended launch names its sglang/ directory
    script:
        "../scripts/evaluate.py"
