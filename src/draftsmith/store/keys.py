"""Stage keys: what each stage's key hashes, and the version that invalidates it on purpose.

A key is `sha256(canonical JSON of {stage, version, params, upstream})[:16]`
(`hashing.derive_key`): the stage's semantic parameters, its format version and
the keys of the artifacts it reads. Never mtimes or source text, so editing a comment
invalidates nothing; bumping a version in `STAGE_VERSIONS` invalidates exactly that
stage and everything downstream.
"""

from __future__ import annotations

import string

from draftsmith.store.hashing import KEY_LENGTH, derive_key

# The stage words, in pipeline order: rule, target, script, package, artifact directory.
STAGES = (
    "model",
    "responses",
    "tokens",
    "merged",
    "hidden",
    "vocab",
    "train",
    "export",
    "evaluate",
    "search",
    "serve_bench",
)

# Bump a stage's version when its output format or semantics change on purpose:
# that stage and everything downstream rebuild, nothing upstream does.
STAGE_VERSIONS = {
    "model": 1,
    "responses": 1,
    "tokens": 2,  # 2: special-token text in a reply is text; special-text counts
    "merged": 1,
    "hidden": 1,
    "vocab": 1,
    "train": 2,
    "export": 1,
    "evaluate": 3,  # 3: each setting's per-prompt AL range
    "search": 1,
    "serve_bench": 1,
}

# The name each stage's key hashes, where it differs from the stage word: these stages
# were once called so, and a rename alone must not change a key (and rebuild days of work).
HASHED_NAMES = {"vocab": "draft_vocab", "train": "draft", "evaluate": "eval"}


def hashed_name(label: str) -> str:
    """A stage word (or `stage/dataset` label) as the key hash spells it."""
    stage, slash, rest = label.partition("/")
    return HASHED_NAMES.get(stage, stage) + slash + rest


# The answer store's own version (`store/answers.py`): bump it to generate every answer again.
ANSWERS_VERSION = 1


def answers_key(model_key: str, generation: dict) -> str:
    """The generation key: what changes an answer besides its prompt, i.e. the target model's
    key and the semantic generation settings (a responses artifact's `generation` params)."""
    return derive_key(
        {"store": "answers", "version": ANSWERS_VERSION, "model": model_key, "generation": generation}
    )


def is_key(name: str) -> bool:
    """Whether a directory name is a key (16 lowercase hex digits)."""
    return len(name) == KEY_LENGTH and all(c in string.hexdigits.lower() for c in name)


def stage_key(stage: str, params: dict, upstream: dict[str, str]) -> str:
    return derive_key(
        {
            "stage": hashed_name(stage),
            "version": STAGE_VERSIONS[stage],
            "params": params,
            "upstream": {hashed_name(label): key for label, key in upstream.items()},
        }
    )
