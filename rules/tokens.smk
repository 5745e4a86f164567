# Tokens: render each conversation with the target's chat template; ids + assistant loss mask.


rule tokens:
    input:
        model_files(),
        responses=lambda w: str(PLAN.responses_dir(w.dataset) / "responses.jsonl"),
    output:
        tokens=f"{PLAN.root}/tokens/{{dataset}}/{{key}}/tokens.jsonl",
        manifest=f"{PLAN.root}/tokens/{{dataset}}/{{key}}/manifest.json",
    log:
        f"{LOGS}/tokens/{{dataset}}/{{key}}.log",
    benchmark:
        f"benchmarks/tokens/{{dataset}}/{{key}}.tsv"
    conda:
        "../envs/data.yaml"
    resources:
        mem_mb=2000,
    params:
        dataset=lambda w: w.dataset,
        model_dir=str(PLAN.model_dir),
        responses=lambda w: str(PLAN.responses_dir(w.dataset) / "responses.jsonl"),
        out_dir=lambda w: planned("tokens", w),
    script:
        "../scripts/tokens.py"
