# Tokens: render each conversation with the target's chat template; ids + assistant loss
# mask. Logic: src/draftsmith/tokens/.


rule tokens:
    input:
        **by_content(
            model=MODEL_INFO,
            responses=planned_responses,
        ),
    output:
        **built(output_patterns(PLAN.root, "tokens")),
    log:
        f"{LOGS}/tokens/{{dataset}}/{{key}}.log",
    benchmark:
        f"benchmarks/tokens/{{dataset}}/{{key}}.tsv"
    conda:
        "../envs/data.yaml"
    # Worker processes for a large dataset (Snakemake caps them at --cores), else one core.
    threads: lambda wildcards, input: tokens_threads(input.responses)
    resources:
        mem_mb=2000,
    params:
        settings=lambda w: SETTINGS.tokens[w.dataset],
        artifact=lambda w: planned("tokens", w),
        workers=lambda wildcards, threads: threads,
    script:
        "../scripts/tokens.py"
