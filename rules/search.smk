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
            prompt_set=prompt_set_paths(search_prompt_set(config)),
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
    script:
        "../scripts/search.py"
