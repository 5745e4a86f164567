# verify: re-hash every artifact against its manifest; `--config verify_fix=true` is not
# used (config is validated): run `python scripts/verify.py --fix` to quarantine corrupt ones.


rule verify:
    log:
        f"{LOGS}/verify.log",
    conda:
        "../envs/data.yaml"
    shell:
        "python {workflow.basedir}/scripts/verify.py {PLAN.root} 2>&1 | tee {log}"
