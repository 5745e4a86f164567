"""Every key the shipped configs plan, pinned: a refactor changes none (a store built before
it is still found whole), and a deliberate change (a `store.keys.STAGE_VERSIONS` bump, a new
semantic parameter) shows here as a diff to review and commit with it."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from conftest import REPO

from draftsmith import config as cfg
from draftsmith.workflow import configure

PINNED = Path(__file__).with_name("planned_keys.json")
# The medium run's sources are files a developer generates into data/ (git-ignored): its
# keys differ between a checkout that has them and a fresh clone, so it is not pinned.
LOCAL_SOURCES = {"configs/smollm2-medium-h200.yaml"}
CONFIGS = [
    "config.yaml",
    *sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "configs").glob("*.yaml")
        if str(p.relative_to(REPO)) not in LOCAL_SOURCES
    ),
]


def planned_keys(tmp_path: Path) -> dict[str, dict[str, str]]:
    """config file -> "stage[/dataset]" -> key; relative sources read from the repository,
    as a run there reads them; a source a fresh clone lacks (a production dataset) gives
    its placeholder key. The store, which is in no key, goes under tmp_path."""
    keys = {}
    for name in CONFIGS:
        raw = copy.deepcopy(cfg.read(REPO / name))
        raw["artifacts_dir"] = str(tmp_path / "store")
        plan = configure(raw, name).plan
        keys[name] = {"/".join(filter(None, (a.stage, a.dataset))): a.key for a in plan.artifacts}
    return keys


def test_no_planned_key_changes(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    keys = planned_keys(tmp_path)
    if os.environ.get("DRAFTSMITH_PIN_KEYS"):
        PINNED.write_text(json.dumps(keys, indent=1, sort_keys=True) + "\n")
    pinned = json.loads(PINNED.read_text())
    changed = {
        f"{name}: {artifact}": (pinned.get(name, {}).get(artifact), key)
        for name, plan in keys.items()
        for artifact, key in plan.items()
        if pinned.get(name, {}).get(artifact) != key
    }
    assert changed == {} and set(keys) == set(pinned), (
        "planned keys changed (pinned, now): a deliberate change is pinned again with "
        "DRAFTSMITH_PIN_KEYS=1 pytest tests/workflow/test_planned_keys.py"
    )
