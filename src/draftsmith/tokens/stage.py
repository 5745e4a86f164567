"""Rule `tokens`: one dataset's responses rendered with the chat template, ids + loss mask."""

from __future__ import annotations

import json
import logging
import time

from draftsmith import config as cfg
from draftsmith.errors import TokenizeError
from draftsmith.fsutil import atomic
from draftsmith.store import manifest
from draftsmith.store.plan import plan_for
from draftsmith.target.load import load_tokenizer, model_info
from draftsmith.tokens.chat import ChatTokenizer, tokenize_records

log = logging.getLogger(__name__)


def tokens(
    config: dict, dataset: str, inputs: dict, outputs: dict, log_file: str | None = None, workers: int = 1
) -> dict:
    """`workers` processes tokenize a large dataset (the rule's threads)."""
    started = time.time()
    artifact = plan_for(config).tokens[dataset]
    info = model_info(inputs["model"])
    tokenizer = load_tokenizer(info["hf_dir"], config["model"]["trust_remote_code"])
    chat = ChatTokenizer(
        tokenizer, info["special_tokens"]["end_of_turn"]["ids"], config["tokenize"]["max_length"]
    )
    floor = cfg.dataset_settings(config, dataset)["min_supervised_share"]
    records = atomic.read_jsonl(inputs["responses"])
    samples, stats = tokenize_records(records, chat, dataset, workers, min_supervised_share=floor)
    rate = stats.as_dict()["roundtrip_mismatch_rate"]
    limit = config["tokenize"]["max_roundtrip_mismatch"]
    if rate is not None and rate > limit:
        raise TokenizeError(
            f"encode(decode(ids)) mismatch rate {rate:.3f} > tokenize.max_roundtrip_mismatch {limit}",
            path=inputs["responses"],
        )
    atomic.write_jsonl(outputs["tokens"], samples)
    manifest.write(artifact, outputs["manifest"], [outputs["tokens"]], stats.as_dict(), started)
    log.info("%s: %s", dataset, json.dumps(stats.as_dict()))
    return stats.as_dict()
