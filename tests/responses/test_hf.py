"""The hf backend's batch generation on the real demo target: kernel choices agree, padding is inert."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftsmith.responses import decode_attention
from draftsmith.responses.hf import ATTENTION, attention_setting, generate_ids
from draftsmith.responses.settings import Sampling
from draftsmith.target import load as target

GENERATION = Sampling(max_new_tokens=12, temperature=0.0, top_p=1.0, seed=0)


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
    assert all(len(row) == GENERATION.max_new_tokens or 2 in row for row in outputs["sdpa"])
    assert outputs["sdpa"] == outputs["sdpa_no_cudnn"] == outputs["grouped_decode"]
    # Padding does not change a row: the short prompt alone gives the same ids.
    alone = generate_ids(model, prompts[:1], 2, [2], GENERATION)[0]
    assert alone == outputs["sdpa"][0][: len(alone)]


def test_grouped_decode_is_switched_on_for_the_block_only(model_and_prompts):
    model, _ = model_and_prompts
    before = model.config._attn_implementation
    with attention_setting(model, "grouped_decode"):
        assert model.config._attn_implementation == decode_attention.NAME
    assert model.config._attn_implementation == before


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_grouped_decode_step_equals_sdpa_with_repeated_keys(dtype, tol):
    """One query per row, 9 query heads over 3 key-value heads, left padding."""
    gen = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, length, dim = 4, 9, 3, 37, 64
    query = torch.randn(batch, heads, 1, dim, generator=gen).to(dtype)
    key = torch.randn(batch, kv_heads, length, dim, generator=gen).to(dtype)
    value = torch.randn(batch, kv_heads, length, dim, generator=gen).to(dtype)
    starts = torch.tensor([0, 5, 20, 36])  # row r's first real position
    mask = (torch.arange(length)[None] >= starts[:, None])[:, None, None]  # (B, 1, 1, T)
    out, _ = decode_attention.grouped_decode_attention(torch.nn.Module(), query, key, value, mask)
    group = heads // kv_heads
    expected = F.scaled_dot_product_attention(
        query.float(),
        key.float().repeat_interleave(group, dim=1),
        value.float().repeat_interleave(group, dim=1),
        attn_mask=mask,
    ).transpose(1, 2)
    assert out.shape == (batch, 1, heads, dim) and out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


def test_grouped_decode_leaves_soft_capped_scores_to_sdpa():
    """A decode step with logit soft-capping is not computed as plain attention: transformers'
    SDPA function, which it goes to, refuses soft-capping."""
    query, key, value = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="softcap"):
        decode_attention.grouped_decode_attention(torch.nn.Module(), query, key, value, None, softcap=30.0)
