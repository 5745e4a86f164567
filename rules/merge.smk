# Merge: the selected datasets, capped and shuffled by seed, plus the data report.


rule merge:
    input:
        tokens=[str(PLAN.tokens_dir(n) / "tokens.jsonl") for n in PLAN.merged_datasets],
        responses=[
            str(PLAN.responses_dir(n) / "responses.jsonl")
            for n in PLAN.merged_datasets
        ],
    output:
        train=str(PLAN.merged_dir / "train.jsonl"),
        report=str(PLAN.merged_dir / "data_report.json"),
        report_md=str(PLAN.merged_dir / "data_report.md"),
        manifest=str(PLAN.merged_dir / "manifest.json"),
    log:
        f"{LOGS}/merge/{PLAN.merged_key}.log",
    benchmark:
        f"benchmarks/merge/{PLAN.merged_key}.tsv"
    conda:
        "../envs/data.yaml"
    resources:
        mem_mb=2000,
    params:
        datasets=PLAN.merged_datasets,
    script:
        "../scripts/merge.py"
