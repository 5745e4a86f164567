# Responses: the target answers each dataset's prompts, one output per dataset.
# Resumable: finished records go to journal.jsonl beside the outputs (not declared,
# so Snakemake does not delete it before a rerun).


rule responses:
    input:
        model=model_info_file(),
        source=dataset_source,
    output:
        responses=f"{PLAN.root}/responses/{{dataset}}/{{key}}/responses.jsonl",
        bad_rows=f"{PLAN.root}/responses/{{dataset}}/{{key}}/bad_rows.jsonl",
        manifest=f"{PLAN.root}/responses/{{dataset}}/{{key}}/manifest.json",
    log:
        f"{LOGS}/responses/{{dataset}}/{{key}}.log",
    benchmark:
        f"benchmarks/responses/{{dataset}}/{{key}}.tsv"
    conda:
        "../envs/data.yaml"
    threads: 2
    resources:
        mem_mb=4000,
        gpu=lambda w: (
            config["generation"]["sglang"]["gpus"]
            if dataset_backend(w) == "sglang"
            else 0
        ),
    params:
        dataset=lambda w: w.dataset,
    script:
        "../scripts/responses.py"
