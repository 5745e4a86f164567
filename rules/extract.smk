# Hidden states: a fixed number of shards (from config), so a dry run shows every
# extraction job before any data exists. Each shard is its own job and output; a
# crash loses at most the shard being written (temp name until complete).


rule shard_plan:
    input:
        model=model_info_file(),
        merged=str(PLAN.merged_dir / "train.jsonl"),
    output:
        plan=str(PLAN.hidden_dir / "plan.json"),
    log:
        f"{LOGS}/shard_plan/{PLAN.hidden_key}.log",
    benchmark:
        f"benchmarks/shard_plan/{PLAN.hidden_key}.tsv"
    conda:
        "../envs/data.yaml"
    resources:
        mem_mb=2000,
    script:
        "../scripts/shard_plan.py"


rule plan:
    input:
        model=model_info_file(),
        plan=str(PLAN.hidden_dir / "plan.json"),
    output:
        json=str(PLAN.results_dir / "plan_report.json"),
        md=str(PLAN.results_dir / "plan_report.md"),
    log:
        f"{LOGS}/plan/{PLAN.hidden_key}.log",
    benchmark:
        f"benchmarks/plan/{PLAN.hidden_key}.tsv"
    conda:
        "../envs/data.yaml"
    script:
        "../scripts/plan.py"


rule extract:
    input:
        model=model_info_file(),
        merged=str(PLAN.merged_dir / "train.jsonl"),
        plan=str(PLAN.hidden_dir / "plan.json"),
        report=str(PLAN.results_dir / "plan_report.json"),
    output:
        bin=f"{PLAN.hidden_dir}/{{shard}}.bin",
        index=f"{PLAN.hidden_dir}/{{shard}}.json",
    log:
        f"{LOGS}/extract/{PLAN.hidden_key}/{{shard}}.log",
    benchmark:
        f"benchmarks/extract/{PLAN.hidden_key}/{{shard}}.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        gpu=extract_gpus(config),
    params:
        shard=lambda w: w.shard,
    script:
        "../scripts/extract.py"
