# Target model: fetch the source once, convert GGUF to HF safetensors, record special tokens.
# Logic: src/draftsmith/model/.


rule model:
    input:
        **by_content(source=model_source_input),
    output:
        **built({"info": MODEL_INFO, "manifest": str(PLAN.model.manifest)}),
        hf=(
            update(directory(str(PLAN.model.path("hf"))))
            if SETTINGS.model.source.kind != "hf_dir"
            else []
        ),
    log:
        f"{LOGS}/model/{PLAN.model.key}.log",
    benchmark:
        f"benchmarks/model/{PLAN.model.key}.tsv"
    conda:
        "../envs/data.yaml"
    resources:
        mem_mb=4000,
    params:
        settings=SETTINGS.model,
        artifact=PLAN.model,
    script:
        "../scripts/model.py"
