"""The hf backend's batch generation on the real demo target: kernel choices agree, padding is inert."""

from __future__ import annotations

import pytest

from draftsmith import target
from draftsmith.generate.hf import ATTENTION, generate_ids

GENERATION = {"max_new_tokens": 12, "temperature": 0.0, "top_p": 1.0}


@pytest.fixture(scope="module")
def model_and_prompts(demo_model_dir):
    tokenizer = target.load_tokenizer(demo_model_dir)
    model = target.load_model(demo_model_dir, "float32", "cpu")
    questions = ["Name a colour.", "Explain in two sentences what a Python list comprehension does."]
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in questions
    ]
    assert len(prompts[0]) < len(prompts[1])  # so the first row is left-padded
    return model, prompts


def test_every_attention_choice_gives_the_same_greedy_ids(model_and_prompts):
    model, prompts = model_and_prompts
    outputs = {}
    for attention in ATTENTION:
        outputs[attention] = generate_ids(model, prompts, 2, [2], GENERATION, attention)
    assert all(len(row) == GENERATION["max_new_tokens"] or 2 in row for row in outputs["sdpa"])
    assert outputs["sdpa"] == outputs["sdpa_no_cudnn"]
    # Padding does not change a row: the short prompt alone gives the same ids.
    alone = generate_ids(model, prompts[:1], 2, [2], GENERATION)[0]
    assert alone == outputs["sdpa"][0][: len(alone)]
