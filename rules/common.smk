# Shared helpers for the rules: artifact paths come from the Plan (src/draftsmith/keys.py).


wildcard_constraints:
    dataset="[A-Za-z0-9_.]+",
    key="[0-9a-f]{16}",
    shard="shard-[0-9]{5}",
    segment="[0-9]{5}",


def planned(kind, wildcards):
    """The planned directory of a per-dataset artifact; refuses a stale key."""
    keys = {"responses": PLAN.response_keys, "tokens": PLAN.token_keys}[kind]
    if keys.get(wildcards.dataset) != wildcards.key:
        raise ValueError(
            f"{kind}/{wildcards.dataset}/{wildcards.key} is not what this config plans "
            f"(expected key {keys.get(wildcards.dataset)})"
        )
    return str(PLAN.root / kind / wildcards.dataset / wildcards.key)


def existing(paths):
    """The paths that exist: a missing source is reported by the job that reads it, and
    the dry run still shows the plan."""
    return [str(p) for p in paths if Path(p).exists()]


def model_info_file():
    return str(PLAN.model_dir / "model.json")


def model_source_input(_wildcards):
    source = config["model"]["source"]
    if source["kind"] == "pypi":
        return []
    path = Path(source["path"])
    return existing([path / "config.json" if source["kind"] == "hf_dir" else path])


def prompt_set_paths(*names):
    """The files of the named evaluate.prompt_sets (all of them when none is named)."""
    sets = config["evaluate"]["prompt_sets"]
    return existing(sets[n]["path"] for n in (names or sets) if n in sets)


def dataset_source(wildcards):
    planned("responses", wildcards)  # refuses a key this config does not plan
    return existing([config["datasets"][wildcards.dataset]["path"]])


def dataset_backend(wildcards):
    return (
        config["datasets"][wildcards.dataset]
        .get("generation", {})
        .get("backend", config["generation"]["backend"])
    )


def planned_responses(wildcards):
    planned("tokens", wildcards)  # refuses a key this config does not plan
    return str(PLAN.responses_dir(wildcards.dataset) / "responses.jsonl")


def previous_checkpoint(wildcards):
    """Checkpoint n-1 for segment n (none for segment 0); refuses an unplanned segment."""
    segment = int(wildcards.segment)
    if segment >= PLAN.num_segments:
        raise ValueError(
            f"segment {wildcards.segment} is not planned: this config trains "
            f"{PLAN.num_segments} segments"
        )
    return [str(PLAN.checkpoint(segment - 1))] if segment else []
