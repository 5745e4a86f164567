# Vocab: the draft vocabulary, the most frequent supervised target tokens of the
# training split (held-out samples excluded). Logic: src/draftsmith/vocab/.


rule vocab:
    input:
        **by_content(
            model=MODEL_INFO,
            merged=MERGED,
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
    script:
        "../scripts/vocab.py"
