"""The answer store: each answer the target generated, stored once, shared by the whole store.

`<artifacts>/answers/<generation key>/answers.jsonl` (`layout.answer_store`): the generation
key hashes what changes an answer besides its prompt (`keys.answers_key`: the model key
and the semantic generation settings), and inside it an answer's address is the sha256 of
its prompt's messages (`address`). Every dataset, responses key, experiment and checkout
on one store asks the same store, so a prompt is requested once per generation key:
appending rows, fixing a row or raising `max_samples` generates only the new prompts.

The file is an append-only journal (`store.journal`: fsync per answer, a torn tail from
kill -9 dropped), written only by the holder of its lock (`opened`; the lock is the
directory lock that gc takes before it removes anything). Each answer carries the sha256
of its own canonical JSON, so `verify` finds a damaged one and `--fix` drops only it
(`drop`), and the next run generates only it again. A job refuses a store holding damaged
answers rather than copy them into an artifact.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.fsutil import atomic
from draftsmith.fsutil.digests import canonical_json, sha256_bytes
from draftsmith.store import lock
from draftsmith.store.journal import Journal
from draftsmith.store.keys import is_key
from draftsmith.store.layout import ANSWERS, ANSWERS_FILE

# Fields of a response record that belong to the prompt's place in a dataset, not to the answer.
PER_PROMPT = ("id", "dataset", "index")
# Fields the store adds to an answer.
ADDRESS, SHA256 = "address", "sha256"


class AnswerStoreDamaged(DraftsmithError):
    pass


def address(messages: list[dict], tools: list[dict] | None = None) -> str:
    """An answer's address within its generation key: the sha256 of the prompt's messages
    and tool schemas (when any) as canonical JSON (key order and whitespace of the source
    do not matter; a prompt without tools keeps the address it had before tools)."""
    prompt = {"messages": messages, "tools": tools} if tools else {"messages": messages}
    return sha256_bytes(canonical_json(prompt).encode())


def _digest(answer: dict) -> str:
    return sha256_bytes(canonical_json({k: v for k, v in answer.items() if k != SHA256}).encode())


def stored(record: dict, at: str) -> dict:
    """A response record as the store keeps it: without its dataset place, with its address
    and its own hash."""
    answer = {k: v for k, v in record.items() if k not in PER_PROMPT}
    answer[ADDRESS] = at
    answer[SHA256] = _digest(answer)
    return answer


def as_record(answer: dict, prompt_id: str, dataset: str, index: int) -> dict:
    """A stored answer as the response record of one dataset's prompt (`formats.responses`)."""
    rest = {k: v for k, v in answer.items() if k not in (ADDRESS, SHA256)}
    return {"id": prompt_id, "dataset": dataset, "index": index, **rest}


def problem(answer: dict) -> str | None:
    """Why a stored answer cannot be trusted, or None."""
    try:
        if answer.get(SHA256) != _digest(answer):
            return "sha256 mismatch"
        if answer[ADDRESS] != address(answer["messages"], answer.get("tools")):
            return "address is not its prompt's hash"
    except (KeyError, TypeError, AttributeError):
        return "not an answer record"
    return None


@dataclass
class Contents:
    """What an answer file holds: trusted answers, damaged lines and a torn tail."""

    answers: list[dict] = field(default_factory=list)
    damaged: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    torn: bool = False
    sizes: dict[str, int] = field(default_factory=dict)  # bytes of each answer's line


def read(path: Path) -> Contents:
    """Every line of an answer file checked; a last line without its newline (a write cut
    short) is torn, not damaged."""
    contents = Contents()
    raw = path.read_bytes() if path.exists() else b""
    for number, line in enumerate(raw.splitlines(keepends=True), 1):
        if not line.endswith(b"\n"):
            contents.torn = True
            break
        try:
            answer = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            contents.damaged.append((number, "not JSON"))
            continue
        why = problem(answer) if isinstance(answer, dict) else "not an answer record"
        if why is not None:
            contents.damaged.append((number, why))
            continue
        contents.answers.append(answer)
        contents.sizes[answer[ADDRESS]] = len(line)
    return contents


def stores(root: Path) -> list[Path]:
    """Every answer store directory (one per generation key) under the store `root`."""
    parent = Path(root) / ANSWERS
    return sorted(p for p in parent.iterdir() if p.is_dir() and is_key(p.name)) if parent.is_dir() else []


def file_of(directory: Path) -> Path:
    return Path(directory) / ANSWERS_FILE


class AnswerStore:
    """One generation key's answers, open for appending (hold its lock: `opened`)."""

    def __init__(self, directory: Path) -> None:
        self.path = file_of(directory)
        damaged = read(self.path).damaged
        if damaged:
            raise AnswerStoreDamaged(
                f"{self.path}: {len(damaged)} damaged answer(s) (line {damaged[0][0]}: {damaged[0][1]}); "
                "`draftsmith verify --fix` drops them, and the next run generates only them again"
            )
        self._journal = Journal(self.path, id_field=ADDRESS)
        self.torn_lines = self._journal.torn_lines

    def __contains__(self, at: str) -> bool:
        return at in self._journal

    def __len__(self) -> int:
        return len(self._journal.records)

    def get(self, at: str) -> dict:
        return self._journal.records[at]

    def put(self, record: dict, at: str) -> bool:
        """Store a response record under the address `at` (of the prompt read); False when
        an answer is stored there already (nothing written)."""
        return self._journal.append(stored(record, at))

    def close(self) -> None:
        self._journal.close()


def lock_of(directory: Path) -> Path:
    """A store's lock: its directory lock in the artifacts dir (`answers/<key>` under it)."""
    return lock.directory_lock(Path(directory).parents[1], Path(directory))


@contextlib.contextmanager
def opened(directory: Path) -> Iterator[AnswerStore]:
    """A generation key's store under its exclusive lock: one job at a time looks up and
    generates its answers, so no prompt is requested twice, whichever dataset, key,
    experiment or checkout asks."""
    with lock.held(lock_of(directory)):
        store = AnswerStore(directory)
        try:
            yield store
        finally:
            store.close()


def rewrite(directory: Path, keep: Callable[[dict], bool]) -> int:
    """Rewrite a store's file (atomically) with its trusted answers that `keep` accepts;
    returns how many lines went (damaged, torn or refused). The caller holds its lock."""
    path = file_of(directory)
    contents = read(path)
    kept = [a for a in contents.answers if keep(a)]
    gone = len(contents.answers) - len(kept) + len(contents.damaged) + contents.torn
    if gone:
        atomic.write_jsonl(path, kept)
    return gone


def drop_damaged(directory: Path) -> int:
    """Drop a store's damaged answers under its lock (`verify --fix`); returns how many."""
    with lock.held(lock_of(directory)):
        return rewrite(directory, lambda answer: True)
