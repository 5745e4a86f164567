# draftsmith: prompt datasets + a target LLM -> a trained, benchmarked EAGLE-3 draft.
# Every artifact is a declared output under a content-addressed key; see
# docs/architecture.md. Targets: `data` (merged shuffled JSONL), `plan` (extraction
# plan report), `hidden_states` (every shard), `draft` (the trained draft, exported for
# SGLang and vLLM), `verify`.

import os

from draftsmith import config as draftsmith_config
from draftsmith.stages import evaluate_gpus, extract_gpus, plan_for, tokens_threads, train_gpus

# `--configfile X` replaces the CPU default instead of being merged into it: a
# production config must not inherit the demo datasets.
if not workflow.overwrite_configfiles:

    configfile: os.path.join(workflow.basedir, "config.yaml")


draftsmith_config.validate(
    config, source=", ".join(map(str, workflow.configfiles)) or "config"
)
PLAN = plan_for(config)
LOGS = config["logs_dir"]


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/model.smk"
include: "rules/responses.smk"
include: "rules/tokens.smk"
include: "rules/merge.smk"
include: "rules/extract.smk"
include: "rules/train.smk"
include: "rules/export.smk"
include: "rules/evaluate.smk"
include: "rules/serve_benchmark.smk"
include: "rules/verify.smk"
include: "rules/report.smk"


rule data:
    input:
        PLAN.merged_dir / "train.jsonl",
        PLAN.merged_dir / "data_report.md",


rule hidden_states:
    input:
        [PLAN.hidden_dir / f"{name}.json" for name in PLAN.shard_names],
        PLAN.results_dir / "plan_report.md",


rule draft:
    input:
        rules.train.output,
        rules.export.output,


rule all:
    default_target: True
    input:
        rules.data.input,
        rules.hidden_states.input,
        rules.draft.input,
        rules.report.output,
        rules.serve_benchmark.output if config["serve_benchmark"]["enabled"] else [],
