# Tokens: render each conversation with the target's chat template; ids + assistant loss mask.


rule tokens:
    input:
        model=model_info_file(),
        responses=planned_responses,
    output:
        tokens=f"{PLAN.root}/tokens/{{dataset}}/{{key}}/tokens.jsonl",
        manifest=f"{PLAN.root}/tokens/{{dataset}}/{{key}}/manifest.json",
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
        dataset=lambda w: w.dataset,
    script:
        "../scripts/tokens.py"
