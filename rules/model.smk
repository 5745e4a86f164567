# Target model: fetch the source once, convert GGUF to HF safetensors, record special tokens.


rule model:
    input:
        model_source_input,
    output:
        info=str(PLAN.model_dir / "model.json"),
        manifest=str(PLAN.model_dir / "manifest.json"),
        hf=(
            directory(str(PLAN.model_dir / "hf"))
            if config["model"]["source"]["kind"] != "hf_dir"
            else []
        ),
    log:
        f"{LOGS}/model/{PLAN.model_key}.log",
    benchmark:
        f"benchmarks/model/{PLAN.model_key}.tsv"
    conda:
        "../envs/data.yaml"
    resources:
        mem_mb=4000,
    script:
        "../scripts/model.py"
