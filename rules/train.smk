# Draft training: the draft vocabulary, then a fixed number of checkpoint segments (from
# config: ceil(total_steps / checkpoint_every)), so a dry run shows every segment job.
# Segment n resumes exactly from checkpoint n-1; a crash loses at most the running
# segment. `train` writes the final weights, config and training summary.


rule draft_vocab:
    input:
        model=model_info_file(),
        merged=str(PLAN.merged_dir / "train.jsonl"),
    output:
        vocab=str(PLAN.draft_vocab_dir / "vocab.safetensors"),
        info=str(PLAN.draft_vocab_dir / "vocab.json"),
        manifest=str(PLAN.draft_vocab_dir / "manifest.json"),
    log:
        f"{LOGS}/draft_vocab/{PLAN.draft_vocab_key}.log",
    benchmark:
        f"benchmarks/draft_vocab/{PLAN.draft_vocab_key}.tsv"
    conda:
        "../envs/data.yaml"
    resources:
        mem_mb=2000,
    script:
        "../scripts/draft_vocab.py"


rule train_segment:
    input:
        model=model_info_file(),
        vocab=str(PLAN.draft_vocab_dir / "vocab.safetensors"),
        shards=[str(PLAN.hidden_dir / f"{name}.json") for name in PLAN.shard_names],
        bins=[str(PLAN.hidden_dir / f"{name}.bin") for name in PLAN.shard_names],
        previous=previous_checkpoint,
    output:
        checkpoint=f"{PLAN.draft_dir}/ckpt-{{segment}}.pt",
        metrics=f"{PLAN.draft_dir}/metrics-{{segment}}.jsonl",
    log:
        f"{LOGS}/train/{PLAN.draft_key}/segment-{{segment}}.log",
    benchmark:
        f"benchmarks/train/{PLAN.draft_key}/segment-{{segment}}.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        gpu=train_gpus(config),
    params:
        segment=lambda w: int(w.segment),
    script:
        "../scripts/train_segment.py"


rule train:
    input:
        checkpoint=str(PLAN.checkpoint(PLAN.num_segments - 1)),
        metrics=[str(PLAN.metrics(i)) for i in range(PLAN.num_segments)],
        vocab_info=str(PLAN.draft_vocab_dir / "vocab.json"),
        shard=str(PLAN.hidden_dir / f"{PLAN.shard_names[0]}.json"),
    output:
        weights=str(PLAN.draft_dir / "draft.safetensors"),
        config=str(PLAN.draft_dir / "draft_config.json"),
        summary=str(PLAN.draft_dir / "train_summary.json"),
        manifest=str(PLAN.draft_dir / "manifest.json"),
    log:
        f"{LOGS}/train/{PLAN.draft_key}/final.log",
    benchmark:
        f"benchmarks/train/{PLAN.draft_key}/final.tsv"
    conda:
        "../envs/gpu.yaml"
    resources:
        mem_mb=4000,
    script:
        "../scripts/train.py"
