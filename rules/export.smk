# Export: the trained draft as an SGLang draft directory and a vLLM speculators directory,
# each validated by reloading it before it counts. Logic: src/draftsmith/export/.


rule export:
    input:
        **by_content(
            model=MODEL_INFO,
            weights=str(PLAN.train.path("weights")),
            config=str(PLAN.train.path("config")),
            shard=first_shard,
        ),
    output:
        **built(PLAN.export.outputs),
    log:
        f"{LOGS}/export/{PLAN.export.key}.log",
    benchmark:
        f"benchmarks/export/{PLAN.export.key}.tsv"
    conda:
        "../envs/gpu.yaml"
    resources:
        mem_mb=4000,
    params:
        settings=SETTINGS.export,
        artifact=PLAN.export,
    script:
        "../scripts/export.py"
