# Export: the trained draft as an SGLang draft directory and a vLLM speculators directory,
# each validated by reloading it (see src/draftsmith/draft/export.py) before it counts.


rule export:
    input:
        model=model_info_file(),
        weights=str(PLAN.draft_dir / "draft.safetensors"),
        config=str(PLAN.draft_dir / "draft_config.json"),
        shard=str(PLAN.hidden_dir / f"{PLAN.shard_names[0]}.json"),
    output:
        sglang_config=str(PLAN.export_dir / "sglang" / "config.json"),
        sglang_weights=str(PLAN.export_dir / "sglang" / "model.safetensors"),
        sglang_manifest=str(PLAN.export_dir / "sglang" / "draftsmith_export.json"),
        vllm_config=str(PLAN.export_dir / "vllm" / "config.json"),
        vllm_weights=str(PLAN.export_dir / "vllm" / "model.safetensors"),
        vllm_manifest=str(PLAN.export_dir / "vllm" / "draftsmith_export.json"),
        manifest=str(PLAN.export_dir / "manifest.json"),
    log:
        f"{LOGS}/export/{PLAN.export_key}.log",
    benchmark:
        f"benchmarks/export/{PLAN.export_key}.tsv"
    conda:
        "../envs/gpu.yaml"
    resources:
        mem_mb=4000,
    script:
        "../scripts/export.py"
