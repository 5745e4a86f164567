"""Rule `tokens`: one dataset's responses rendered with the chat template, ids + loss mask."""

from __future__ import annotations

import json
import logging
import time

from draftsmith.errors import TokenizeError
from draftsmith.fsutil import atomic
from draftsmith.store import manifest
from draftsmith.store.plan import Artifact
from draftsmith.target.load import load_tokenizer, model_info
from draftsmith.tokens.chat import ChatTokenizer, tokenize_records
from draftsmith.tokens.settings import TokensSettings

log = logging.getLogger(__name__)


def tokens(
    settings: TokensSettings,
    artifact: Artifact,
    inputs: dict,
    outputs: dict,
    log_file: str | None = None,
    workers: int = 1,
) -> dict:
    """`workers` processes tokenize a large dataset (the rule's threads)."""
    started = time.time()
    dataset = artifact.dataset
    info = model_info(inputs["model"])
    tokenizer = load_tokenizer(info["hf_dir"], settings.trust_remote_code)
    chat = ChatTokenizer(tokenizer, info["special_tokens"]["end_of_turn"]["ids"], settings.max_length)
    records = atomic.read_jsonl(inputs["responses"])
    samples, stats = tokenize_records(
        records, chat, dataset, workers, min_supervised_share=settings.min_supervised_share
    )
    rate = stats.as_dict()["roundtrip_mismatch_rate"]
    limit = settings.max_roundtrip_mismatch
    if rate is not None and rate > limit:
        raise TokenizeError(
            f"encode(decode(ids)) mismatch rate {rate:.3f} > tokenize.max_roundtrip_mismatch {limit}",
            path=inputs["responses"],
        )
    atomic.write_jsonl(outputs["tokens"], samples)
    manifest.write(artifact, outputs["manifest"], [outputs["tokens"]], stats.as_dict(), started)
    log.info("%s: %s", dataset, json.dumps(stats.as_dict()))
    return stats.as_dict()
