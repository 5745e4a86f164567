# Shared helpers for the rules: every artifact path comes from the artifact plan
# (PLAN, src/draftsmith/store/plan.py); this file only adds what input functions need.

import json

from draftsmith.config import dataset_name_pattern


wildcard_constraints:
    dataset=dataset_name_pattern(),
    key="[0-9a-f]{16}",
    shard="shard-[0-9a-f]{16}",
    segment="[0-9]{5}",


def planned(stage, wildcards):
    """The planned artifact of a per-dataset stage; refuses a key this config does not plan."""
    artifact = getattr(PLAN, stage).get(wildcards.dataset)
    if artifact is None or artifact.key != wildcards.key:
        raise ValueError(
            f"{stage}/{wildcards.dataset}/{wildcards.key} is not what this config plans "
            f"(expected key {artifact.key if artifact else None})"
        )
    return artifact


def settings_of(stage):
    """A param giving a job its stage's settings. A config that turns the stage off
    resolves none (nor checks them), so asking for its rule then is refused here, while
    Snakemake builds the DAG, before a job starts."""

    def settings(_wildcards):
        resolved = getattr(SETTINGS, stage)
        if resolved is None:
            raise ValueError(
                f"stage {stage} is off in this config (see its section's `enabled`; the "
                "search needs the evaluator): turn it on to run its rule"
            )
        return resolved

    return settings


def by_content(**inputs):
    """Inputs compared by content, never by modification time: a keyed job's key holds
    its inputs' content (and a report's store paths hold the keys), so neither a fresh
    clone's datasets, nor a copied file, nor an artifact rebuilt to the same bytes makes
    a job stale (`snakemake verify` checks the bytes). Files under results/ are not
    keyed and keep Snakemake's time rule."""

    def flagged(value):
        if callable(value):
            return lambda wildcards: ancient(value(wildcards))
        return ancient(value)

    return {name: flagged(value) for name, value in inputs.items()}


def built(outputs):
    """A keyed job's outputs by role. Snakemake must not delete them before the job runs:
    another process on the store may have just finished them, and the job (holding
    its store lock) then keeps them instead of building them twice."""
    return {role: update(path) for role, path in outputs.items()}


def existing(paths):
    """The paths that exist: a missing source is reported by the job that reads it, and
    the dry run still shows the plan."""
    return [str(p) for p in paths if Path(p).exists()]


MODEL_INFO = str(PLAN.model.path("info"))
MERGED = str(PLAN.merged.path("train"))
MERGED_RESPONSES = [
    str(PLAN.responses[n].path("responses")) for n in PLAN.merged_datasets
]


_VIEWS = {}


def mix_shard_names():
    """The stored shards holding the mix's samples, known once `hidden_assign` ran. The
    view is parsed once per version of the file: several rules ask, and a production
    view lists every sample."""
    view = Path(checkpoints.hidden_assign.get().output.assignment)
    stat = view.stat()
    version = (str(view), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if version not in _VIEWS:
        _VIEWS[version] = json.loads(view.read_text())["shards"]
    return _VIEWS[version]


def mix_shards(_wildcards):
    """Index and data files of every stored shard the mix reads."""
    names = mix_shard_names()
    return [str(PLAN.shard(n, part)) for n in names for part in ("index", "bin")]


def first_shard(_wildcards):
    """One shard index of the mix: its meta records the aux layers."""
    return str(PLAN.shard(mix_shard_names()[0]))


def model_source_input(_wildcards):
    source = SETTINGS.model.source
    if source.kind == "pypi":
        return []
    path = Path(source.path)
    return existing([path / "config.json" if source.kind == "hf_dir" else path])


def prompt_set_paths(*names):
    """The files of the named evaluate.prompt_sets (all of them when none is named)."""
    sets = config["evaluate"]["prompt_sets"]
    return existing(sets[n]["path"] for n in (names or sets) if n in sets)


def dataset_source(wildcards):
    planned("responses", wildcards)
    return existing([SETTINGS.responses[wildcards.dataset].source.path])


def dataset_backend(wildcards):
    return SETTINGS.responses[wildcards.dataset].backend


def planned_responses(wildcards):
    planned("tokens", wildcards)
    return str(PLAN.responses[wildcards.dataset].path("responses"))


def previous_checkpoint(wildcards):
    """Checkpoint n-1 for segment n (none for segment 0); refuses an unplanned segment."""
    segment = int(wildcards.segment)
    if segment >= PLAN.num_segments:
        raise ValueError(
            f"segment {wildcards.segment} is not planned: this config trains "
            f"{PLAN.num_segments} segments"
        )
    return [str(PLAN.checkpoint(segment - 1))] if segment else []
