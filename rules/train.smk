# Train: a fixed number of checkpoint segments (from config: ceil(total_steps /
# checkpoint_every)), so a dry run shows every segment job. Segment n resumes exactly
# from checkpoint n-1; a crash loses at most the running segment. Rule `train` writes
# the final weights, config and training summary. Logic: src/draftsmith/train/.


rule train_segment:
    input:
        **by_content(
            model=MODEL_INFO,
            vocab=str(PLAN.vocab.path("vocab")),
            assignment=str(PLAN.hidden.path("assignment")),
            shards=mix_shards,
            previous=previous_checkpoint,
        ),
    output:
        **built(
            {
                "checkpoint": str(PLAN.checkpoint("{segment}")),
                "metrics": str(PLAN.metrics("{segment}")),
            }
        ),
    log:
        f"{LOGS}/train/{PLAN.train.key}/segment-{{segment}}.log",
    benchmark:
        f"benchmarks/train/{PLAN.train.key}/segment-{{segment}}.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: TRAIN_THREADS
    resources:
        **train_tasks(config),
        mem_mb=8000,
        gpu=train_gpus(config),
    params:
        settings=SETTINGS.train,
        artifact=PLAN.train,
        states=PLAN.states,
        segment=lambda w: int(w.segment),
        threads=lambda wildcards, threads: threads,
    script:
        "../scripts/train_segment.py"


rule train:
    input:
        **by_content(
            checkpoint=str(PLAN.checkpoint(PLAN.num_segments - 1)),
            metrics=[str(PLAN.metrics(i)) for i in range(PLAN.num_segments)],
            vocab_info=str(PLAN.vocab.path("info")),
            shard=first_shard,
        ),
    output:
        **built(PLAN.train.outputs),
    log:
        f"{LOGS}/train/{PLAN.train.key}/final.log",
    benchmark:
        f"benchmarks/train/{PLAN.train.key}/final.tsv"
    conda:
        "../envs/gpu.yaml"
    resources:
        mem_mb=4000,
    params:
        settings=SETTINGS.train,
        artifact=PLAN.train,
    script:
        "../scripts/train.py"
