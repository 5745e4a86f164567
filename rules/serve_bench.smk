# Serve bench (production path, GPUs and SGLang only): the converted target served
# alone, then with the exported SGLang draft for each k and for the settings search's best
# settings (when it runs), one server at a time; per-server logs beside the report. Logic
# and refusals: src/draftsmith/serve_bench/.


rule serve_bench:
    input:
        **by_content(
            model=MODEL_INFO,
            draft_config=str(PLAN.export.path("sglang_config")),
            draft_weights=str(PLAN.export.path("sglang_weights")),
            prompts=existing(
                [SETTINGS.serve_bench.prompt_set.path] if SETTINGS.serve_bench else []
            ),
            merged=MERGED,
            responses=MERGED_RESPONSES,
            search=(
                [str(PLAN.search.path("json"))]
                if SETTINGS.serve_bench and SETTINGS.serve_bench.search_settings
                else []
            ),
        ),
    output:
        **built(PLAN.serve_bench.outputs),
    log:
        f"{LOGS}/serve_bench/{PLAN.serve_bench.key}.log",
    benchmark:
        f"benchmarks/serve_bench/{PLAN.serve_bench.key}.tsv"
    conda:
        "../envs/sglang.yaml"
    threads: 2
    resources:
        mem_mb=16000,
        gpu=serve_bench_gpus(config),
    params:
        settings=settings_of("serve_bench"),
        artifact=PLAN.serve_bench,
    script:
        "../scripts/serve_bench.py"
