# Responses: the target answers each dataset's prompts, one output per dataset.
# Answers are stored once in the store's answer store (artifacts/answers/, not declared,
# so Snakemake never deletes it); a job asks only for what it lacks. Logic: src/draftsmith/responses/.


rule responses:
    input:
        **by_content(
            model=MODEL_INFO,
            source=dataset_source,
        ),
    output:
        **built(output_patterns(PLAN.root, "responses")),
    log:
        f"{LOGS}/responses/{{dataset}}/{{key}}.log",
    benchmark:
        f"benchmarks/responses/{{dataset}}/{{key}}.tsv"
    conda:
        "../envs/data.yaml"
    threads: 2
    resources:
        mem_mb=4000,
        gpu=lambda w: responses_gpus(config, dataset_backend(w)),
    params:
        settings=lambda w: SETTINGS.responses[w.dataset],
        artifact=lambda w: planned("responses", w),
        answer_store=lambda w: str(PLAN.answers[w.dataset]),
    script:
        "../scripts/responses.py"
