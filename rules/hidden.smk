# Hidden states: a fixed number of shards (from config), so a dry run shows every
# extraction job before any data exists. `hidden_assign` spreads the samples over the
# shards, `hidden_estimate` reports bytes, hours and free disk (results/, not keyed: it
# describes this machine), `hidden_shard` writes one shard per job; a crash loses at
# most the shards being written. Logic: src/draftsmith/hidden/.


rule hidden_assign:
    input:
        **by_content(
            model=MODEL_INFO,
            merged=MERGED,
        ),
    output:
        **built(PLAN.hidden.outputs),
    log:
        f"{LOGS}/hidden_assign/{PLAN.hidden.key}.log",
    benchmark:
        f"benchmarks/hidden_assign/{PLAN.hidden.key}.tsv"
    conda:
        "../envs/data.yaml"
    resources:
        mem_mb=2000,
    script:
        "../scripts/hidden_assign.py"


rule hidden_estimate:
    input:
        **by_content(
            model=MODEL_INFO,
            assignment=str(PLAN.hidden.path("assignment")),
        ),
    output:
        json=str(PLAN.result("estimate")),
        md=str(PLAN.result("estimate_md")),
    log:
        f"{LOGS}/hidden_estimate/{PLAN.hidden.key}.log",
    benchmark:
        f"benchmarks/hidden_estimate/{PLAN.hidden.key}.tsv"
    conda:
        "../envs/data.yaml"
    script:
        "../scripts/hidden_estimate.py"


rule hidden_shard:
    input:
        **by_content(
            model=MODEL_INFO,
            merged=MERGED,
            assignment=str(PLAN.hidden.path("assignment")),
        ),
    output:
        **built(
            {
                "bin": str(PLAN.shard("{shard}", "bin")),
                "index": str(PLAN.shard("{shard}")),
            }
        ),
    log:
        f"{LOGS}/hidden_shard/{PLAN.hidden.key}/{{shard}}.log",
    benchmark:
        f"benchmarks/hidden_shard/{PLAN.hidden.key}/{{shard}}.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        gpu=hidden_gpus(config),
    params:
        shard=lambda w: w.shard,
    script:
        "../scripts/hidden_shard.py"


rule hidden:
    input:
        [str(PLAN.shard(name)) for name in PLAN.shard_names],
        str(PLAN.result("estimate_md")),
