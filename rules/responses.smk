# Responses: the target answers each dataset's prompts, one output per dataset.
# Resumable: finished records go to journal.jsonl beside the outputs (not declared,
# so Snakemake does not delete it before a rerun).


def dataset_source(wildcards):
    path = Path(config["datasets"][wildcards.dataset]["path"])
    return [str(path)] if path.exists() else []


def backend_resources(wildcards):
    return (
        config["datasets"][wildcards.dataset]
        .get("generation", {})
        .get("backend", config["generation"]["backend"])
    )


rule responses:
    input:
        model_files(),
        dataset_source,
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
            if backend_resources(w) == "sglang"
            else 0
        ),
    params:
        dataset=lambda w: w.dataset,
        model_dir=str(PLAN.model_dir),
        out_dir=lambda w: planned("responses", w),
        log_dir=lambda w: f"{LOGS}/responses/{w.dataset}",
    script:
        "../scripts/responses.py"
