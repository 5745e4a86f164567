"""End-of-turn and other special tokens, as the template renders them and the model emits them.

Never trust a hard-coded id: a vocabulary can hold an ordinary token that looks
like `<|im_end|>` (one real run lost days to id 163533 vs 163586). This module
derives the end-of-turn ids from the chat template itself, compares them with
what `generate` stops on and with what the model really emits, lists every other
vocabulary entry that reads the same, and fails loudly on disagreement.
"""

from __future__ import annotations

import logging
import re

from draftsmith.errors import ModelError

log = logging.getLogger(__name__)

_MARKER = "draftsmith-probe-reply"
_PROBE = [{"role": "user", "content": "Say hello in one short sentence."}]


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list | tuple) else [value])]


def stop_ids(model_info: dict) -> list[int]:
    """The ids in-process decoding stops on (generation and the evaluator): the end-of-turn
    ids plus the generation config's eos ids, from the model stage's record."""
    tokens = model_info["special_tokens"]
    return sorted(set(tokens["end_of_turn"]["ids"]) | set(tokens["generation_config_eos_ids"]))


def special_vocab(tokenizer) -> dict[str, int]:
    """Every special token and its id: the named ones (bos, eos, ...) and every added token
    flagged special. transformers releases differ in which of these `all_special_tokens`
    lists (5.17 omits a GGUF model's `<|im_end|>`), so both are read."""
    found = dict(zip(tokenizer.all_special_tokens, tokenizer.all_special_ids, strict=True))
    for token_id, added in sorted(getattr(tokenizer, "added_tokens_decoder", {}).items()):
        if getattr(added, "special", False):
            found.setdefault(str(added), int(token_id))
    return found


def text_pattern(tokenizer) -> re.Pattern[str]:
    """Matches the text of any special token, the longest first (so a token whose text
    starts with another's is found whole)."""
    specials = sorted(special_vocab(tokenizer), key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(s) for s in specials) + ")")


def encode_as_text(tokenizer, text: str) -> list[int]:
    """`text` tokenized as plain text: a special token's text in it becomes ordinary ids.
    That is how a model writes such text: servers strip special ids from the text they
    return, so special-token text in a reply was never a control token."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def template_end_of_turn(tokenizer) -> dict:
    """The special token(s) the template puts right after an assistant reply."""
    rendered = tokenizer.apply_chat_template(
        _PROBE + [{"role": "assistant", "content": _MARKER}], tokenize=False
    )
    if _MARKER not in rendered:
        raise ModelError("chat template dropped the assistant reply; cannot locate end of turn")
    suffix = rendered.split(_MARKER, 1)[1]
    suffix_ids = tokenizer(suffix, add_special_tokens=False)["input_ids"]
    special = set(special_vocab(tokenizer).values())
    eot = []
    for token_id in suffix_ids:
        if token_id not in special:
            break
        eot.append(token_id)
    if not eot:
        raise ModelError(
            f"chat template ends an assistant turn with {suffix!r}, which starts with no special "
            "token: cannot derive the end-of-turn id"
        )
    prompt = tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
    header_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return {
        "ids": eot,
        "text": tokenizer.decode(eot),
        "suffix": suffix,
        "generation_prompt_tail_ids": header_ids[-4:],
        "generation_prompt_tail": tokenizer.decode(header_ids[-4:]),
    }


def lookalikes(tokenizer, token_ids: list[int]) -> dict[str, list[int]]:
    """Other vocabulary ids whose token string or decoded text equals each id's."""
    vocab = tokenizer.get_vocab()
    found: dict[str, list[int]] = {}
    for token_id in token_ids:
        piece = tokenizer.convert_ids_to_tokens(token_id)
        text = tokenizer.decode([token_id])
        same = sorted(
            i for s, i in vocab.items() if i != token_id and (s == piece or s.strip() == text.strip())
        )
        same += [
            i
            for i in range(len(tokenizer))
            if i != token_id and i not in same and tokenizer.decode([i]).strip() == text.strip()
        ]
        found[str(token_id)] = sorted(set(same))
    return found


def single_id_check(tokenizer) -> dict[str, list[int]]:
    """Each special token must encode to exactly one id; returns the offenders."""
    bad = {}
    for token in special_vocab(tokenizer):
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            bad[token] = ids
    return bad


def probe_emitted(model, tokenizer, eos_ids: list[int], max_new_tokens: int = 64) -> int | None:
    """The id the model really ends its reply with (None if it did not stop)."""
    import torch

    prompt = tokenizer.apply_chat_template(
        _PROBE, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(
            **prompt,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos_ids,
            pad_token_id=eos_ids[0],
        )
    generated = out[0, prompt["input_ids"].shape[1] :].tolist()
    if generated and generated[-1] in eos_ids and len(generated) <= max_new_tokens:
        return generated[-1]
    return None


def inspect(tokenizer, generation_eos, configured: list[int] | None, model=None) -> dict:
    """Record and check the special tokens; raise ModelError on any disagreement."""
    eot = template_end_of_turn(tokenizer)
    stop_ids = _as_list(generation_eos)
    report = {
        "end_of_turn": eot,
        "generation_config_eos_ids": stop_ids,
        "lookalikes": lookalikes(tokenizer, eot["ids"]),
        "special_tokens": special_vocab(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "multi_id_special_tokens": single_id_check(tokenizer),
        "emitted_end_of_turn_id": None,
    }
    if report["multi_id_special_tokens"]:
        raise ModelError(f"special tokens that do not encode to one id: {report['multi_id_special_tokens']}")
    if configured is not None and list(configured) != eot["ids"]:
        raise ModelError(
            f"model.end_of_turn_ids {configured} disagrees with the chat template, which ends a turn "
            f"with {eot['ids']} ({eot['text']!r}); ids reading the same: {report['lookalikes']}"
        )
    if stop_ids and eot["ids"][0] not in stop_ids:
        raise ModelError(
            f"generation stops on {stop_ids} but the template ends a turn with {eot['ids']} "
            f"({eot['text']!r}): generation would run past the end of the reply"
        )
    if model is not None:
        emitted = probe_emitted(model, tokenizer, sorted(set(stop_ids) | set(eot["ids"])))
        report["emitted_end_of_turn_id"] = emitted
        if emitted is None:
            log.warning("probe generation did not stop within 64 tokens; emitted id not recorded")
        elif emitted not in eot["ids"]:
            raise ModelError(
                f"the model ends its reply with id {emitted} ({tokenizer.decode([emitted])!r}) but "
                f"the template renders end of turn as {eot['ids']}"
            )
    for token_id, others in report["lookalikes"].items():
        if others:
            log.warning("end-of-turn id %s has look-alike ids %s (never use those)", token_id, others)
    return report
