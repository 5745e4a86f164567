# Hidden states: one states store per model and extraction settings (PLAN.states), each
# sample stored once whatever mix holds it. `hidden_assign` (a checkpoint) writes the
# mix's view and assigns only the samples the store lacks to new shards, so the shard
# jobs are known once it ran (a dry run before shows the assign job alone);
# `hidden_estimate` reports tokens to forward, bytes, hours and free disk (results/, not
# keyed: it describes this machine); `hidden_shard` writes one stored shard per job; a
# crash loses at most the shards being written. Logic: src/draftsmith/hidden/.


checkpoint hidden_assign:
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
    params:
        settings=SETTINGS.hidden,
        artifact=PLAN.hidden,
        states=PLAN.states,
        root=PLAN.root,
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
    params:
        settings=SETTINGS.hidden,
        artifact=PLAN.states,
    script:
        "../scripts/hidden_estimate.py"


rule hidden_shard:
    input:
        **by_content(
            model=MODEL_INFO,
            samples=str(PLAN.shard_samples("{shard}")),
        ),
    output:
        **built(
            {
                "bin": str(PLAN.shard("{shard}", "bin")),
                "index": str(PLAN.shard("{shard}")),
            }
        ),
    log:
        f"{LOGS}/hidden_shard/{PLAN.states.key}/{{shard}}.log",
    benchmark:
        f"benchmarks/hidden_shard/{PLAN.states.key}/{{shard}}.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        gpu=hidden_gpus(config),
    params:
        settings=SETTINGS.hidden,
        artifact=PLAN.states,
        shard=lambda w: w.shard,
    script:
        "../scripts/hidden_shard.py"


rule hidden:
    input:
        mix_shards,
        str(PLAN.result("estimate_md")),
