# Vocab: the draft vocabulary, the most frequent supervised target tokens of the
# training split (held-out samples excluded). Logic: src/draftsmith/vocab/.


rule vocab:
    input:
        **by_content(
            model=MODEL_INFO,
            merged=MERGED,
            # Read by nothing: it orders vocab after the checkpoint `hidden_assign`. A job
            # finishing while Snakemake (9.27) updates the DAG after a checkpoint can make
            # it drop every job still to run and exit 0 (train never built); vocab was the
            # only job that could run beside the checkpoint.
            after_assign=str(PLAN.hidden.path("assignment")),
        ),
    output:
        **built(PLAN.vocab.outputs),
    log:
        f"{LOGS}/vocab/{PLAN.vocab.key}.log",
    benchmark:
        f"benchmarks/vocab/{PLAN.vocab.key}.tsv"
    conda:
        "../envs/data.yaml"
    resources:
        mem_mb=2000,
    params:
        settings=SETTINGS.vocab,
        artifact=PLAN.vocab,
    script:
        "../scripts/vocab.py"
