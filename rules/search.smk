# Search: which speculative settings make this target fastest. Successive halving over a
# grid of num_steps x topk x num_draft_tokens (config section `search`), each setting
# decoded by the built-in evaluator on one held-out prompt set (greedy, checked lossless)
# and ranked by speed-up over the target alone; the winner as an SGLang launch.
# Logic: src/draftsmith/search/.


rule search:
    input:
        **by_content(
            model=MODEL_INFO,
            export_config=str(PLAN.export.path("sglang_config")),
            export_weights=str(PLAN.export.path("sglang_weights")),
            export_record=str(PLAN.export.path("sglang_record")),
            merged=MERGED,
            responses=MERGED_RESPONSES,
            prompt_set=existing(
                [SETTINGS.search.prompt_set.path] if SETTINGS.search else []
            ),
        ),
    output:
        **built(PLAN.search.outputs),
    log:
        f"{LOGS}/search/{PLAN.search.key}.log",
    benchmark:
        f"benchmarks/search/{PLAN.search.key}.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 2
    resources:
        mem_mb=4000,
        # It decodes where the evaluator does (evaluate.device).
        gpu=evaluate_gpus(config),
    params:
        settings=settings_of("search"),
        artifact=PLAN.search,
        evaluate=SETTINGS.evaluate,  # the search decodes as the evaluator does
        export=PLAN.export,  # the recommended launch names its sglang/ directory
    script:
        "../scripts/search.py"
