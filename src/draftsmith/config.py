"""Configuration loading and validation against the schema shipped in the package
(draftsmith/schemas/config.schema.yaml, so that any install, not only an editable one, has it).

Errors name the key path and what was expected, e.g.
`config: generation.openai.concurrency: expected integer, got 'eight'`.
Defaults from the schema are filled in, so the rest of the code reads one
complete dictionary.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from draftsmith.errors import ConfigError

SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"


def _with_defaults(validator_class: type) -> type:
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def dataset_name_pattern() -> str:
    """The schema's pattern for dataset names, unanchored: the workflow's `dataset` wildcard."""
    pattern = load_schema()["properties"]["datasets"]["propertyNames"]["pattern"]
    return pattern.removeprefix("^").removesuffix("$")


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<top level>"


def _type_names(value: str | list[str]) -> str:
    return " or ".join(value) if isinstance(value, list) else value


def _union_kinds(error: jsonschema.ValidationError) -> list:
    """The `kind` constant of each alternative of a oneOf (None where one has none)."""
    return [alt.get("properties", {}).get("kind", {}).get("const") for alt in error.validator_value]


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed))
        where = _key_path(error)
        prefix = "" if where == "<top level>" else where + "."
        return f"unknown key {', '.join(prefix + k for k in unknown)} (allowed: {', '.join(allowed)})"
    if error.validator == "oneOf" and error.context and None not in (kinds := _union_kinds(error)):
        # A tagged union: report against the alternative the user meant (the one whose `kind` matches).
        if not isinstance(error.instance, dict):
            return f"{_key_path(error)}: expected a mapping with kind one of {kinds}, got {error.instance!r}"
        if "kind" not in error.instance:
            return f"{_key_path(error)}: missing field: kind (one of {kinds})"
        kind = error.instance["kind"]
        meant = [e for e in error.context if kinds[e.schema_path[0]] == kind]
        if meant:
            # Every problem with the meant alternative, in a stable order.
            return "; ".join(sorted({_describe(e) for e in meant}))
        return f"{_key_path(error)}.kind: expected one of {kinds}, got {kind!r}"
    if "propertyNames" in error.schema_path:
        return f"{_key_path(error)}: invalid name {error.instance!r} (must match {error.validator_value})"
    expected = {
        "type": lambda: f"expected {_type_names(error.validator_value)}, got {error.instance!r}",
        "enum": lambda: f"expected one of {error.validator_value}, got {error.instance!r}",
        "required": lambda: f"missing field: {error.message.split(chr(39))[1]}",
        "pattern": lambda: f"{error.instance!r} does not match {error.validator_value}",
    }.get(error.validator, lambda: error.message)()
    return f"{_key_path(error)}: {expected}"


def validate(config: dict, source: str = "config") -> dict:
    """Validate in place (filling defaults) and return the config."""
    errors = sorted(_Validator(load_schema()).iter_errors(config), key=lambda e: list(e.path))
    if errors:
        lines = "\n".join(f"  - {_describe(e)}" for e in errors)
        raise ConfigError(f"{source}: invalid configuration:\n{lines}")
    _check_references(config, source)
    return config


def _check_references(config: dict, source: str) -> None:
    if stage_on(config, "evaluate") and not config["evaluate"]["prompt_sets"]:
        raise ConfigError(
            f"{source}: evaluate.prompt_sets: empty while evaluate.enabled is true; name at least one "
            "held-out prompt set, or set evaluate.enabled: false"
        )


def read(path: str | Path) -> dict:
    """A config file's raw mapping, not yet validated (several files merge first)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return raw


def apply_command_line(config: dict, entries: Sequence[str] | None) -> dict:
    """Read `--config key=value` entries as YAML into `config` (in place; returned).

    Snakemake reads a nested value such as `search={enabled: true}` with YAML's base
    loader, which leaves every scalar a string ('true'); a user overriding a setting means
    what a config file would mean, so each entry is read again as a config file reads it
    and merged over what Snakemake merged."""
    for entry in entries or ():
        key, sep, text = entry.partition("=")
        if not sep:
            continue  # Snakemake refuses such an entry itself
        try:
            value = yaml.safe_load(text) if text else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--config {key}: not valid YAML: {exc}") from None
        _merge(config, key, value)
    return config


def _merge(into: dict, key: str, value: Any) -> None:
    if isinstance(value, dict) and isinstance(into.get(key), dict):
        for name, item in value.items():
            _merge(into[key], name, item)
    else:
        into[key] = value


def load(path: str | Path) -> dict:
    return validate(read(path), str(path))


def enabled_datasets(config: dict, merged_only: bool = False) -> list[str]:
    names = [n for n, d in config["datasets"].items() if d.get("enabled", True)]
    if merged_only:
        names = [n for n in names if n not in config["merge"]["exclude"]]
    return sorted(names)


def export_serving_context(config: dict) -> int:
    """The context the draft is exported for: export.serving_context, else the trained
    train.max_position_embeddings (the export may raise it to the target's own)."""
    return config["export"]["serving_context"] or config["train"]["max_position_embeddings"]


# The config sections whose `enabled` a stage needs, for the stages a config can turn off. The
# search decodes with the built-in evaluator, so turning the evaluator off (a target HF cannot
# hold) turns the search off too.
_SWITCHES = {"evaluate": ("evaluate",), "search": ("search", "evaluate"), "serve_bench": ("serve_benchmark",)}


def stage_on(config: dict, stage: str) -> bool:
    """Whether a full run of `config` builds `stage` (a stage word of `store.keys.STAGES`, or
    `report`): the one answer the Snakefile, the rules, the plan and validation use."""
    return all(config[section]["enabled"] for section in _SWITCHES.get(stage, ()))


def search_prompt_set(config: dict) -> str | None:
    """The evaluate.prompt_sets entry the search decodes: search.prompt_set, else the first
    name in sorted order (None when there is no set)."""
    named = config["search"]["prompt_set"]
    return named if named is not None else min(config["evaluate"]["prompt_sets"], default=None)


def served_search_settings(config: dict) -> int:
    """How many of the search's best settings the serving benchmark also serves (0: none)."""
    return config["search"]["confirm_top"] if stage_on(config, "search") else 0


def generation_dtype(config: dict) -> str:
    """The dtype the in-process (hf) backend generates in: generation.hf.dtype, else the model's."""
    return config["generation"]["hf"]["dtype"] or config["model"]["dtype"]


def dataset_settings(config: dict, name: str) -> dict[str, Any]:
    """A dataset's entry with dataset_defaults and generation settings resolved."""
    entry = copy.deepcopy(config["datasets"][name])
    for field, value in config["dataset_defaults"].items():
        entry.setdefault(field, value)
    generation = {k: v for k, v in config["generation"].items() if k not in ("hf", "openai", "sglang")}
    generation.update(entry.get("generation", {}))
    entry["generation"] = generation
    return entry
