"""In-process generation with transformers: batched, greedy or sampled, CPU or GPU."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from draftsmith.target import load as target
from draftsmith.target.special_tokens import stop_ids

if TYPE_CHECKING:
    from draftsmith.formats.datasets.rows import Prompt
    from draftsmith.responses.settings import HFGeneration, Sampling
from draftsmith.formats.datasets.conversations import structured_calls
from draftsmith.formats.responses import Usage, response_record

log = logging.getLogger(__name__)


class HFBackend:
    def __init__(
        self,
        dataset: str,
        hf_dir: str,
        model_info: dict,
        sampling: Sampling,
        hf: HFGeneration,
    ) -> None:
        import torch

        self.dataset = dataset
        self.sampling = sampling
        self.batch_size = hf.batch_size
        self.tokenizer = target.load_tokenizer(hf_dir)
        self.tokenizer.padding_side = "left"
        self.model = target.load_model(hf_dir, hf.dtype, hf.device)
        self.attention = hf.attention
        tokens = model_info["special_tokens"]
        self.stop_ids = stop_ids(model_info)
        self.pad_id = tokens["pad_token_id"] if tokens["pad_token_id"] is not None else self.stop_ids[0]
        torch.manual_seed(sampling.seed)

    def _encode(self, prompt: Prompt) -> list[int]:
        return target.prompt_ids(self.tokenizer, prompt.messages, prompt.tools)

    def generate(self, prompts: list[Prompt], emit: Callable[[dict], None], spent: Usage) -> None:
        encoded = [(p, self._encode(p)) for p in prompts]
        # Length-sorted batches waste less compute on padding.
        encoded.sort(key=lambda item: len(item[1]))
        for start in range(0, len(encoded), self.batch_size):
            for record in self._generate_batch(encoded[start : start + self.batch_size]):
                emit(record)

    def _generate_batch(self, batch: list[tuple[Prompt, list[int]]]) -> list[dict]:
        ids = [ids for _, ids in batch]
        generated = generate_ids(self.model, ids, self.pad_id, self.stop_ids, self.sampling, self.attention)
        return [self._record(prompt, ids, out) for (prompt, ids), out in zip(batch, generated, strict=True)]

    def _record(self, prompt: Prompt, prompt_ids: list[int], generated: list[int]) -> dict:
        stop = next((i for i, t in enumerate(generated) if t in self.stop_ids), None)
        if stop is not None:
            generated = generated[: stop + 1]  # keep the end-of-turn id, as servers report it
            text_ids, finish = generated[:-1], "stop"
        else:
            text_ids, finish = generated, "length"
        text, calls = self.tokenizer.decode(text_ids), None
        if prompt.tools:
            text, calls = split_tool_calls(text)
        return response_record(
            prompt_id=prompt.id,
            dataset=self.dataset,
            index=prompt.index,
            messages=prompt.messages,
            tools=prompt.tools,
            response=text,
            tool_calls=calls,
            finish_reason=finish,
            usage=Usage(len(prompt_ids), len(generated)),
            response_token_ids=generated,
            prompt_token_ids=prompt_ids,
        )


# Calls as Hermes-style templates have the model write them (Qwen, Hermes, the tests'
# template): a JSON object {name, arguments} between <tool_call> tags.
_TOOL_CALL = re.compile(r"\s*<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def split_tool_calls(text: str) -> tuple[str, list[dict] | None]:
    """The reply text before its calls, and the calls as structured calls (as an
    OpenAI-compatible server parses them); the text as is when none parse."""
    blocks = _TOOL_CALL.findall(text)
    calls = structured_calls("[" + ",".join(blocks) + "]") if blocks else None
    return (text[: _TOOL_CALL.search(text).start()], calls) if calls else (text, None)


ATTENTION = ("sdpa", "sdpa_no_cudnn", "grouped_decode")


def attention_setting(model, attention: str):
    """A context in which `model` attends as `attention` (one of `ATTENTION`) says:
    torch's own choice of SDPA kernels; all but cuDNN's (a padded batch's attention
    takes a mask, and cuDNN's kernel is planned per shape while every decode step has
    a new key length); or that, with decode steps on grouped matmuls
    (`decode_attention`). bench/generate_throughput.py compares them."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from draftsmith.responses.decode_attention import use_grouped_decode

    stack = contextlib.ExitStack()
    if attention != "sdpa":
        stack.enter_context(
            sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
        )
    if attention == "grouped_decode":
        stack.enter_context(use_grouped_decode(model))
    return stack


def generate_ids(
    model,
    prompts: list[list[int]],
    pad_id: int,
    stop_ids: list[int],
    sampling: Sampling,
    attention: str = "sdpa",
) -> list[list[int]]:
    """One left-padded batch through `model.generate`: each prompt's new ids (padding
    after a stop id included; `_record` cuts there)."""
    import torch

    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        mask[row, width - len(ids) :] = 1
    sampled = sampling.temperature > 0
    with torch.no_grad(), attention_setting(model, attention):
        out = model.generate(
            input_ids=input_ids.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=sampling.max_new_tokens,
            do_sample=sampled,
            temperature=sampling.temperature if sampled else None,
            top_p=sampling.top_p if sampled else None,
            eos_token_id=stop_ids,
            pad_token_id=pad_id,
        )
    return out[:, width:].tolist()
