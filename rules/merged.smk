# Merged: the selected datasets, capped and shuffled by seed, plus the data report.
# Logic: src/draftsmith/merged/.


rule merged:
    input:
        **by_content(
            tokens=[str(PLAN.tokens[n].path("tokens")) for n in PLAN.merged_datasets],
            responses=MERGED_RESPONSES,
        ),
    output:
        **built(PLAN.merged.outputs),
    log:
        f"{LOGS}/merged/{PLAN.merged.key}.log",
    benchmark:
        f"benchmarks/merged/{PLAN.merged.key}.tsv"
    conda:
        "../envs/data.yaml"
    resources:
        mem_mb=2000,
    params:
        settings=SETTINGS.merged,
        artifact=PLAN.merged,
    script:
        "../scripts/merged.py"
