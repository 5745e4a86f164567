"""The `draftsmith` command: inspect and maintain the artifact store Snakemake builds.

`plan` lists what a config asks for and what of it is built, `verify` re-hashes
artifacts against their manifests and stored answers against their own hashes, `gc`
lists (and deletes) what no config plans or uses, and `migrate` brings an older store
(stage renames, answers before the answer store, per-mix hidden states) into the current
layout. `promptgen` runs one of the offline prompt-set generators (`draftsmith.promptgen`).
Configs are read as Snakemake reads them: `config.yaml` unless `--configfile` is given,
several `--configfile` merged in order (the later wins).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from draftsmith import config as cfg
from draftsmith.errors import ConfigError
from draftsmith.formats.markdown import human_size
from draftsmith.fsutil import atomic
from draftsmith.store import gc, migrate, verify
from draftsmith.store.layout import HASH_CACHE, STAGED
from draftsmith.store.plan import Artifact, Plan, forget_source_hashes
from draftsmith.workflow import configure

DEFAULT_CONFIG = Path("config.yaml")
# `draftsmith promptgen GENERATOR ARGS...`: promptgen's modules (long-context: long_context.py).
GENERATORS = ("docstrings", "styles", "long-context")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"draftsmith: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftsmith", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    configs = argparse.ArgumentParser(add_help=False)
    configs.add_argument(
        "--configfile",
        action="append",
        type=Path,
        metavar="X",
        help=f"config file, repeatable (default: {DEFAULT_CONFIG})",
    )

    plan = _command(commands, "plan", _plan, "list every planned artifact and whether it is built", configs)
    plan.add_argument("--json", action="store_true", help="a JSON list instead of a table")

    rehash = "re-hash artifacts against their manifests and stored answers against their hashes"
    check = _command(commands, "verify", _verify, rehash, configs)
    check.add_argument(
        "root",
        nargs="?",
        type=Path,
        help="store root; without --configfile only what the store holds is checked",
    )
    check.add_argument("--fix", action="store_true", help="quarantine corrupt artifacts; drop bad answers")
    check.add_argument(
        "--rehash-sources",
        action="store_true",
        help="hash every source file again (the hash cache trusts size, mtime and inode)",
    )

    unplanned = (
        "list artifact directories that no given config plans and stored answers none uses "
        "(each config planned on its own)"
    )
    collect = _command(commands, "gc", _gc, unplanned, configs)
    collect.add_argument("--delete", action="store_true", help="delete them")
    collect.add_argument(
        "--grace",
        type=_minutes,
        default=gc.DEFAULT_GRACE_S / 60,
        metavar="MINUTES",
        help="leave directories written less than this long ago (default: %(default)g); "
        "a directory a running job holds is always left",
    )

    move = _command(
        commands,
        "migrate",
        _migrate,
        "bring an older store into the current layout: stage names, the answer store, "
        "the states store (no answer generated, no forward pass)",
        configs,
    )
    move.add_argument("root", nargs="?", type=Path, help="store root (default: the config's artifacts_dir)")
    move.add_argument("--dry-run", action="store_true", help="print the steps without taking them")

    offline = "build prompt files with one of the offline generators (no config, no store)"
    generate = commands.add_parser(
        "promptgen",
        help=offline,
        description=f"{offline}; `draftsmith promptgen GENERATOR --help` gives the generator's own options",
    )
    generate.add_argument("generator", choices=GENERATORS, metavar="GENERATOR", help=", ".join(GENERATORS))
    generate.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the generator's arguments")
    generate.set_defaults(run=_promptgen)
    return parser


def _minutes(text: str) -> float:
    minutes = float(text)
    if not minutes >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of minutes >= 0")
    return minutes


def _command(
    commands: argparse._SubParsersAction,
    name: str,
    run: Callable[[argparse.Namespace], int],
    summary: str,
    parent: argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=summary, description=summary, parents=[parent])
    parser.set_defaults(run=run)
    return parser


# --- configs ------------------------------------------------------------------------
def _merge(base: dict, override: dict) -> dict:
    """`override` over `base`, mappings merged key by key (as Snakemake merges configfiles)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            value = _merge(merged[key], value)
        merged[key] = value
    return merged


def _merged(paths: list[Path]) -> tuple[dict, str]:
    config: dict = {}
    for path in paths:
        config = _merge(config, cfg.read(path))
    return config, ", ".join(map(str, paths))


def _paths(args: argparse.Namespace) -> list[Path]:
    return args.configfile or [DEFAULT_CONFIG]


def _plan_of(paths: list[Path]) -> Plan:
    return configure(*_merged(paths)).plan


def _root(args: argparse.Namespace) -> Path:
    if args.root is not None:
        return args.root
    return Path(cfg.validate(*_merged(_paths(args)))["artifacts_dir"])


# --- plan -----------------------------------------------------------------------------
def _plan(args: argparse.Namespace) -> int:
    plan = _plan_of(_paths(args))
    rows = [_describe(plan, artifact) for artifact in plan.artifacts]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [("stage", "dataset", "key", "built", "directory")]
    table += [
        (r["stage"], r["dataset"] or "-", r["key"], "yes" if r["built"] else "no", r["directory"])
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for *cells, directory in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)), directory)
    return 0


def _describe(plan: Plan, artifact: Artifact) -> dict:
    return {
        "stage": artifact.stage,
        "dataset": artifact.dataset or None,
        "key": artifact.key,
        "directory": str(artifact.directory),
        "built": _built(plan, artifact),
    }


def _built(plan: Plan, artifact: Artifact) -> bool:
    # The states store has no manifest of its own (each shard's index is one): the mix's
    # view is built when it and every shard it reads exist.
    if artifact is plan.states:
        return artifact.directory.is_dir()
    if artifact is plan.hidden:
        indexes = [plan.shard(name) for name in plan.mix_shard_names()]
        return all(p.exists() for p in [artifact.manifest, *indexes])
    return artifact.manifest.exists()


# --- promptgen ---------------------------------------------------------------------------
def _promptgen(args: argparse.Namespace) -> int:
    # Imported here, not at the top: the other commands never load the generators.
    from draftsmith.promptgen import docstrings, long_context, styles

    generator = {"docstrings": docstrings, "styles": styles, "long-context": long_context}[args.generator]
    return generator.main(args.args)


# --- store maintenance -------------------------------------------------------------------
def _verify(args: argparse.Namespace) -> int:
    if args.root is not None and not args.configfile:
        return verify.run(args.root, None, args.fix, [])  # the store alone: no plan to miss
    config, source = _merged(_paths(args))
    if args.root is not None:
        config["artifacts_dir"] = str(args.root)
    if args.rehash_sources:
        forget_source_hashes(Path(config["artifacts_dir"]))
    plan = configure(config, source).plan
    return verify.run(plan.root, plan, args.fix, [str(p) for p in args.configfile or []])


def _gc(args: argparse.Namespace) -> int:
    grace_s = args.grace * 60
    taken, skipped, total = 0, 0, 0
    plans = [_plan_of([path]) for path in _paths(args)]
    for root, directory in gc.unreferenced(plans):
        size = gc.size(directory)
        why = gc.remove(root, directory, grace_s) if args.delete else gc.kept(root, directory, grace_s)
        if why is not None:
            print(f"skipped  {directory}: {why}")
            skipped += 1
            continue
        taken, total = taken + 1, total + size
        print(f"{human_size(size):>9}  {directory}")
    verb = "deleted" if args.delete else "unreferenced (delete with --delete)"
    left = f"; {skipped} skipped (in use or recently written)" if skipped else ""
    print(f"gc: {taken} directories {verb}, {human_size(total)} ({total:,} bytes){left}")
    _gc_answers(plans, args.delete, grace_s)
    _gc_states(plans, args.delete, grace_s)
    for root in sorted({plan.root for plan in plans}):
        leftovers = gc.stale_temps(root)
        for leftover in leftovers:
            print(f"{'removed' if args.delete else 'stale'}  {leftover}")
            if args.delete:
                atomic.remove_temp(leftover)
        if leftovers:
            print(f"gc: {len(leftovers)} temporaries of dead processes in {root}")
    return 0


def _gc_answers(plans: list[Plan], delete: bool, grace_s: float) -> None:
    """Stored answers no config uses, per generation key: listed, or deleted with `delete`
    (nothing printed when every stored answer is in use)."""
    taken, total, reported = 0, 0, False
    for item in gc.unused_answers(plans):
        if not item.unused and item.kept is None:
            continue
        reported = True
        why = gc.remove_answers(item, grace_s) if delete else gc.answers_kept(item, grace_s)
        if why is not None:
            print(f"skipped  {item.directory}: {why}")
            continue
        taken, total = taken + len(item.unused), total + item.size
        whole = ", the whole store" if item.whole else ""
        print(f"{human_size(item.size):>9}  {item.directory}: {len(item.unused)} answers{whole}")
    if reported:
        verb = "deleted" if delete else "unused (delete with --delete)"
        print(f"gc: {taken} stored answers {verb}, {human_size(total)} ({total:,} bytes)")


def _gc_states(plans: list[Plan], delete: bool, grace_s: float) -> None:
    """Stored samples no config's mix uses, per states store: the shards holding only
    those listed, or deleted with `delete` (nothing printed when every sample is in use)."""
    taken, total, left, reported = 0, 0, 0, False
    for item in gc.unused_states(plans):
        if not item.shards and not item.kept_samples and item.kept is None:
            continue
        reported = True
        left += item.kept_samples
        why = gc.remove_states(item, grace_s) if delete else gc.states_kept(item, grace_s)
        if why is not None:
            print(f"skipped  {item.store}: {why}")
            continue
        taken, total = taken + len(item.shards), total + item.size
        print(f"{human_size(item.size):>9}  {item.store}: {len(item.shards)} shards, {item.samples} samples")
    if reported:
        verb = "deleted" if delete else "unused (delete with --delete)"
        kept = f"; {left} unused samples stay in shards that hold used ones" if left else ""
        print(f"gc: {taken} shards of unused samples {verb}, {human_size(total)} ({total:,} bytes){kept}")


def _migrate(args: argparse.Namespace) -> int:
    steps = []
    for step in migrate.migrate(_root(args), dry_run=args.dry_run):
        print(step, flush=True)
        steps.append(step)
    if not steps:
        print("migrate: nothing to do")
    elif args.dry_run:
        print(f"migrate: dry run, {len(steps)} steps not taken")
    else:
        # Snakemake's run records in a checkout that built this store still list the old
        # input paths, and its `input` rerun trigger would rerun those jobs; the keys
        # already say the files are current.
        print(
            "migrate: done; in each workflow directory that ran on this store, drop Snakemake's "
            f"stale run records:\n  snakemake --cleanup-metadata $(find {_root(args)} -type f "
            f"-not -path '*/{STAGED}/*' -not -name '{HASH_CACHE}')"
        )
    # A directory left in place (its new name taken) needs a person to look at it.
    return 1 if any(step.action == "left" for step in steps) else 0
