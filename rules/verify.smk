# verify: re-hash every artifact against its manifest and name what is corrupt or
# missing. `python -m draftsmith.store.verify <artifacts> --fix` quarantines corrupt ones
# and prints the exact targets that rebuild them.


rule verify:
    log:
        f"{LOGS}/verify.log",
    benchmark:
        "benchmarks/verify.tsv"
    conda:
        "../envs/data.yaml"
    params:
        root=str(PLAN.root),
    shell:
        "python -m draftsmith.store.verify {params.root} 2>&1 | tee {log}"
