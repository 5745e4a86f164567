"""The shard assignment: which samples of a mix the states store lacks, and the new shards
that will hold them.

A states store (`hidden/<states key>/`, keyed by the model and the extraction settings,
never by a mix) holds every sample's states once, addressed by
`hashing.sample_address(input_ids, loss_mask)`: a finished shard's index rows name
addresses. Each assigned shard's samples (address, input_ids, loss_mask) are written to
`samples/<shard>.jsonl` when it is assigned and kept: the shard job reads them, and
`verify --fix` rebuilds a damaged shard from them. Assigning happens under the store's
assign lock (`hidden.stage.hidden_assign`), so a sample stored or already assigned to a
shard, by any mix, checkout or experiment, is never assigned again. The missing samples
are balanced by tokens over at most `extract.num_shards` new shards (longest first into
the lightest), each named by its addresses (`layout.shard_name`): two checkouts assigning
the same missing samples agree on the names.
"""

from __future__ import annotations

import heapq
from pathlib import Path

import numpy as np

from draftsmith.fsutil import atomic
from draftsmith.store import lock
from draftsmith.store.hashing import sample_address
from draftsmith.store.layout import SHARD_SAMPLES, shard_name, shard_samples_path, stored_samples


def assign(samples: list[tuple[str, int]], num_shards: int) -> list[list[str]]:
    """Balance (address, token count) pairs over `num_shards` shards by tokens."""
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    heap = [(0, index) for index in range(num_shards)]
    for address, tokens in sorted(samples, key=lambda s: (-s[1], s[0])):
        load, index = heapq.heappop(heap)
        shards[index].append(address)
        heapq.heappush(heap, (load + tokens, index))
    return shards


def claimed(store: Path, done: set[str]) -> dict[str, tuple[str, int]]:
    """Address -> (shard, tokens) of the samples assigned to shards not finished yet."""
    found = {}
    for path in sorted((store / SHARD_SAMPLES).glob("shard-*.jsonl")):
        if path.stem in done:
            continue
        for row in atomic.read_jsonl(path):
            found[row["address"]] = (path.stem, len(row["input_ids"]))
    return found


def build_locked(root: Path, store: Path, merged_path: Path, num_shards: int) -> dict:
    """`build` under the store's locks: its directory lock, shared (gc never removes a store
    being assigned into), then its assign lock (one assigner at a time, in any checkout or
    on any host that shares the store's locks: no sample is assigned twice)."""
    with (
        lock.shared(lock.directory_lock(root, store)),
        lock.held(lock.lock_path(root, store / SHARD_SAMPLES)),
    ):
        return build(merged_path, store, num_shards)


def build(merged_path: Path, store: Path, num_shards: int) -> dict:
    """The mix's view (sample id -> address -> shard) and the extraction it still needs;
    writes the samples of each new shard into the store. Call under the assign lock
    (`build_locked`)."""
    stored = stored_samples(store)
    pending = claimed(store, set(stored.values()))
    view, lengths, new = [], {}, {}
    for sample in atomic.read_jsonl(merged_path):
        address = sample_address(sample["input_ids"], sample["loss_mask"])
        view.append([sample["id"], address])
        lengths[address] = len(sample["input_ids"])
        if address not in stored and address not in pending:
            # Compact until written: a production mix's ids as Python lists take ~10x more.
            new[address] = (
                np.asarray(sample["input_ids"], np.int32),
                np.asarray(sample["loss_mask"], np.uint8),
            )
    groups = assign([(a, lengths[a]) for a in new], min(num_shards, len(new))) if new else []
    placed: dict[str, str] = {}
    for group in groups:
        name = shard_name(group)
        path = shard_samples_path(store, name)
        if not path.exists():  # content-named: an existing file holds these very samples
            rows = (
                {"address": a, "input_ids": new[a][0].tolist(), "loss_mask": new[a][1].tolist()}
                for a in sorted(group)
            )
            atomic.write_jsonl(path, rows)
        placed.update(dict.fromkeys(group, name))
    shard_of = {**stored, **{a: s for a, (s, _) in pending.items()}, **placed}
    for row in view:
        row.append(shard_of[row[1]])
    shard_tokens: dict[str, int] = {}  # all of a shard's tokens, this mix's samples or not
    for shard, tokens in [*pending.values(), *((placed[a], lengths[a]) for a in placed)]:
        shard_tokens[shard] = shard_tokens.get(shard, 0) + tokens
    todo: dict[str, dict] = {}
    for address in {row[1] for row in view} - set(stored):
        entry = todo.setdefault(shard_of[address], {"samples": 0, "tokens": 0})
        entry["samples"] += 1
        entry["tokens"] += lengths[address]
    return {
        "samples": view,
        "shards": sorted(set(shard_of[row[1]] for row in view)),
        "num_samples": len(view),
        "num_tokens": sum(lengths[row[1]] for row in view),
        "distinct_samples": len(lengths),
        "stored_samples": len(lengths) - sum(e["samples"] for e in todo.values()),
        "new_shards": sorted(set(placed.values())),
        # The shards this mix waits for: their tokens are what extraction forwards, the
        # mix's samples in them what it needs (a pending shard may hold other mixes' too).
        "to_extract": {name: todo[name] for name in sorted(todo)},
        "extract_tokens": sum(shard_tokens[name] for name in todo),
    }
