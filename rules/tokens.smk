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
    # Worker processes for datasets of more than 1,000 records (Snakemake caps it at --cores).
    threads: 8
    resources:
        mem_mb=2000,
    params:
        dataset=lambda w: w.dataset,
    script:
        "../scripts/tokens.py"
