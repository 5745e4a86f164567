# draftsmith: prompt datasets + a target LLM -> a trained, benchmarked EAGLE-3 draft.
# Every artifact is a declared output under a content-addressed key; see
# docs/architecture.md. Each stage's rule is its target: `snakemake merged`,
# `snakemake hidden_estimate`, `snakemake hidden`, `snakemake train`, `snakemake export`,
# `snakemake evaluate`, `snakemake search`, `snakemake serve_bench`, `snakemake report`,
# `snakemake verify`.

import os

from draftsmith.config import apply_command_line, stage_on
from draftsmith.runtime.resources import (
    evaluate_gpus,
    hidden_gpus,
    responses_gpus,
    serve_bench_gpus,
    TRAIN_THREADS,
    tokens_threads,
    train_gpus,
    train_tasks,
)
from draftsmith.store.layout import output_patterns
from draftsmith.workflow import configure

# `--configfile X` replaces the CPU default instead of being merged into it: a
# production config must not inherit the demo datasets.
if not workflow.overwrite_configfiles:

    configfile: os.path.join(workflow.basedir, "config.yaml")


# Values given with `--config` mean what they would in a config file (nested ones included).
apply_command_line(config, workflow.config_settings.config_args)
SETTINGS = configure(
    config, source=", ".join(map(str, workflow.configfiles)) or "config"
)
PLAN = SETTINGS.plan
LOGS = config["logs_dir"]


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/model.smk"
include: "rules/responses.smk"
include: "rules/tokens.smk"
include: "rules/merged.smk"
include: "rules/hidden.smk"
include: "rules/vocab.smk"
include: "rules/train.smk"
include: "rules/export.smk"
include: "rules/evaluate.smk"
include: "rules/search.smk"
include: "rules/serve_bench.smk"
include: "rules/verify.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        rules.merged.output,
        mix_shards,
        str(PLAN.result("estimate_md")),
        rules.train.output,
        rules.export.output,
        rules.report_html.output,
        rules.search.output if stage_on(config, "search") else [],
        rules.serve_bench.output if stage_on(config, "serve_bench") else [],
        # Every artifact the config builds, so a deleted directory is rebuilt (its
        # dependents stay: their inputs count by content, see rules/common.smk).
        [str(artifact.manifest) for artifact in PLAN.built],
