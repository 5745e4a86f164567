"""What the Snakefile (and `draftsmith plan`) does first: validate a config and plan it.

Validation is the schema (`config.validate`) plus the checks a stage owns about its own
settings (the serving benchmark's launch refusals), so a bad setting fails before any
job runs, with the key path at fault.
"""

from __future__ import annotations

from draftsmith import config as cfg
from draftsmith.errors import ConfigError
from draftsmith.serve_bench.command import check_config as check_serve_bench
from draftsmith.store.plan import Plan, plan_for


def configure(config: dict, source: str = "config") -> Plan:
    """Validate `config` in place (defaults filled in) and return its artifact plan."""
    cfg.validate(config, source)
    if config["serve_benchmark"]["enabled"]:
        try:
            check_serve_bench(config)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return plan_for(config)
