# Shared helpers for the rules: artifact paths come from the Plan (src/draftsmith/keys.py).


wildcard_constraints:
    dataset="[A-Za-z0-9_.]+",
    key="[0-9a-f]{16}",


def planned(kind, wildcards):
    """The planned directory of a per-dataset artifact; refuses a stale key."""
    keys = {"responses": PLAN.response_keys, "tokens": PLAN.token_keys}[kind]
    if keys.get(wildcards.dataset) != wildcards.key:
        raise ValueError(
            f"{kind}/{wildcards.dataset}/{wildcards.key} is not what this config plans "
            f"(expected key {keys.get(wildcards.dataset)})"
        )
    return str(PLAN.root / kind / wildcards.dataset / wildcards.key)


def model_files():
    return [str(PLAN.model_dir / "model.json")]
