"""The draft's RoPE is the target's: cos/sin equal transformers' LlamaRotaryEmbedding for the
target's settings, read from either config form, carried through the draft config."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch
from transformers import AutoConfig, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from draftsmith.draft.model import Attention, DraftConfig, Eagle3Draft, ttt_sums
from draftsmith.draft.rope import ORIGINAL, RopeError, rope_settings, rotary

HEADS, HEAD_DIM = 4, 16
# Inside and far beyond every original context below (4096, 8192, 32768).
POSITIONS = [0, 1, 7, 100, 2047, 2048, 4095, 4096, 8191, 8192, 8193, 20000, 32768, 65535, 131071]
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
# DeepSeek-style: attention factor from mscale / mscale_all_dim, other correction range.
YARN_MSCALE = {
    "rope_type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 16,
    "beta_slow": 2,
    "mscale": 1.0,
    "mscale_all_dim": 0.5,
}
LINEAR = {"rope_type": "linear", "factor": 4.0}
# Phi-3 style: no factor (transformers takes max / original context), short and long factors.
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.01 * i for i in range(HEAD_DIM // 2)],
    "long_factor": [1.0 + 0.5 * i for i in range(HEAD_DIM // 2)],
    "original_max_position_embeddings": 4096,
}
# name: (rope scaling or None, rope_theta, the target's max_position_embeddings)
CASES = {
    "plain": (None, 100000.0, 8192),
    "linear": (LINEAR, 10000.0, 8192),
    "llama3": (LLAMA3, 500000.0, 131072),
    "yarn": (YARN, 1000000.0, 131072),
    "yarn_mscale": (YARN_MSCALE, 10000.0, 163840),
    "longrope": (LONGROPE, 10000.0, 131072),
}


def target_config(scaling: dict | None, theta: float, max_positions: int) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=HEADS * HEAD_DIM,
        intermediate_size=32,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        head_dim=HEAD_DIM,
        vocab_size=64,
        max_position_embeddings=max_positions,
        rope_parameters={**(scaling or {"rope_type": "default"}), "rope_theta": theta},
    )


def draft_config(target: LlamaConfig) -> DraftConfig:
    return DraftConfig.from_target(target, draft_vocab_size=16, max_position_embeddings=2048)


def transformers_cos_sin(target: LlamaConfig, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return LlamaRotaryEmbedding(target)(torch.zeros(1), positions)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("span", ["long", "short"])
def test_cos_sin_equal_transformers(case, span):
    target = target_config(*CASES[case])
    c = draft_config(target)
    # longrope picks its factors by the largest position of the call: both sides of 4096.
    positions = torch.tensor([POSITIONS if span == "long" else POSITIONS[:7]])
    cos, sin = rotary(positions, c.head_dim, c.rope_theta, c.rope_scaling)
    want_cos, want_sin = transformers_cos_sin(target, positions)
    assert cos.dtype == torch.float32 and cos.shape == (1, positions.shape[1], HEAD_DIM)
    torch.testing.assert_close(cos, want_cos)
    torch.testing.assert_close(sin, want_sin)


@pytest.mark.parametrize("case", sorted(set(CASES) - {"plain"}))
def test_scaling_changes_the_draft_beyond_the_original_context(case):
    c = draft_config(target_config(*CASES[case]))
    positions = torch.tensor([POSITIONS])
    scaled = rotary(positions, c.head_dim, c.rope_theta, c.rope_scaling)[0]
    plain = rotary(positions, c.head_dim, c.rope_theta)[0]
    assert not torch.allclose(scaled[0, -1], plain[0, -1], atol=1e-3)


def test_attention_rotates_q_and_k_as_transformers_does():
    target = target_config(*CASES["llama3"])
    attn = Attention(draft_config(target))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, len(POSITIONS), 2 * HEADS * HEAD_DIM, generator=gen)
    positions = torch.tensor([POSITIONS, [p + 3 for p in POSITIONS]])
    with torch.no_grad():
        q, k, _ = attn.project(x, positions)
        raw_q, raw_k = (
            proj(x).unflatten(-1, (-1, HEAD_DIM)).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj)
        )
    want_q, want_k = apply_rotary_pos_emb(raw_q, raw_k, *transformers_cos_sin(target, positions))
    torch.testing.assert_close(q, want_q)
    torch.testing.assert_close(k, want_k)


# --- where the settings come from ---------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_settings_read_alike_from_either_config_form(case, tmp_path):
    """A config.json in the older form (`rope_scaling` with `type`, `rope_theta` beside) as
    export reads it, and as the transformers config training reads it, give one draft RoPE."""
    scaling, theta, max_positions = CASES[case]
    old_form = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HEADS * HEAD_DIM,
        "num_attention_heads": HEADS,
        "num_key_value_heads": 2,
        "head_dim": HEAD_DIM,
        "intermediate_size": 32,
        "vocab_size": 64,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": max_positions,
        "rope_theta": theta,
        "rope_scaling": None if scaling is None else {_old_name(k): v for k, v in scaling.items()},
    }
    (tmp_path / "config.json").write_text(json.dumps(old_form))
    c = draft_config(AutoConfig.from_pretrained(tmp_path))
    assert rope_settings(old_form) == (c.rope_theta, c.rope_scaling)
    assert rope_settings(target_config(*CASES[case]).to_dict()) == (c.rope_theta, c.rope_scaling)
    assert c.rope_theta == theta
    if scaling is None:
        assert c.rope_scaling is None
    else:
        assert c.rope_scaling["rope_type"] == scaling["rope_type"] and "type" not in c.rope_scaling


def _old_name(key: str) -> str:
    return "type" if key == "rope_type" else key


def test_derived_settings_are_made_explicit():
    # Phi-3 longrope: the factor transformers computes as max / original context.
    assert rope_settings(target_config(*CASES["longrope"]).to_dict())[1]["factor"] == 32.0
    # Original context absent: transformers takes max_position_embeddings.
    no_original = {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}, "max_position_embeddings": 4096}
    _, yarn = rope_settings(no_original)
    assert yarn[ORIGINAL] == 4096
    # Phi-3 keeps the original context beside rope_scaling, and transformers prefers it.
    beside = {"max_position_embeddings": 131072, ORIGINAL: 4096}
    _, scaling = rope_settings({**beside, "rope_scaling": {**LONGROPE, ORIGINAL: 8}})
    assert scaling[ORIGINAL] == 4096


def test_plain_variants_and_per_layer_rope():
    assert rope_settings({}) == (10000.0, None)
    assert rope_settings({"rope_theta": 5e5, "rope_scaling": None}) == (5e5, None)
    mrope = {"rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}, "rope_theta": 1e6}
    assert rope_settings(mrope) == (1e6, None)
    # Gemma 3: the draft's single full-attention layer takes the full-attention layers' RoPE.
    per_layer = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }
    assert rope_settings({"rope_parameters": per_layer}) == (1e6, {"rope_type": "linear", "factor": 8.0})
    with pytest.raises(RopeError, match="no full_attention"):
        rope_settings({"rope_parameters": {"sliding_attention": per_layer["sliding_attention"]}})


def test_rope_the_draft_cannot_match_is_refused():
    dynamic = target_config({"rope_type": "dynamic", "factor": 2.0}, 10000.0, 4096)
    with pytest.raises(RopeError, match=r"'dynamic' is refused: transformers rescales it"):
        draft_config(dynamic)
    fields = asdict(draft_config(target_config(None, 10000.0, 4096)))
    with pytest.raises(RopeError, match=r"'su' is not one transformers computes"):
        DraftConfig(**{**fields, "rope_scaling": {"rope_type": "su"}})
    with pytest.raises(RopeError, match=r"lacks \['factor'\]"):
        DraftConfig(**{**fields, "rope_scaling": {"rope_type": "yarn", ORIGINAL: 8}})
    with pytest.raises(RopeError, match="must be a mapping with a rope_type"):
        DraftConfig(**{**fields, "rope_scaling": {"factor": 2.0}})


# --- the draft config carries them -------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_draft_config_round_trips_the_settings(case):
    c = draft_config(target_config(*CASES[case]))
    stored = json.loads(json.dumps(c.as_dict()))  # draft_config.json, the checkpoint's copy
    assert DraftConfig(**stored) == c


def test_plain_draft_config_is_written_as_before():
    """No rope_scaling key for plain RoPE: the demo target's draft_config.json keeps its bytes,
    and one written before the field existed loads as plain RoPE."""
    c = draft_config(target_config(None, 100000.0, 8192))
    before = [
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "draft_vocab_size",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_theta",
        "target_hidden_size",
    ]
    assert list(c.as_dict()) == before
    assert DraftConfig(**c.as_dict()).rope_scaling is None


def test_ttt_training_with_longrope_runs_sparse_as_dense():
    """The training loss on a longrope draft past the original context: the sparse steps (rows)
    rotate as the dense ones, and gradients are finite."""
    scaling = {**LONGROPE, "original_max_position_embeddings": 4, "factor": 8.0}
    c = DraftConfig(64, 32, HEADS, 2, HEAD_DIM, 64, 16, 64, rope_theta=10000.0, rope_scaling=scaling)
    torch.manual_seed(0)
    draft = Eagle3Draft(c, torch.randn(64, 64))
    draft.set_vocab(torch.arange(16) * 3, torch.arange(64) % 4 == 0)  # draft id i is target id 4i
    gen = torch.Generator().manual_seed(1)
    b, t = 2, 9
    ids = torch.randint(0, 64, (b, t), generator=gen)
    mask = torch.ones(b, t, dtype=torch.long)
    aux, final = torch.randn(b, t, 3 * 64, generator=gen), torch.randn(b, t, 64, generator=gen)
    head = torch.randn(64, 64, generator=gen)
    sums = [ttt_sums(draft, head, ids, mask, mask, aux, final, 3, sparse=s) for s in (True, False)]
    for sparse_step, dense_step in zip(*sums, strict=True):
        torch.testing.assert_close(sparse_step["loss_sum"], dense_step["loss_sum"])
    sum(s["loss_sum"] for s in sums[0]).backward()
    assert all(torch.isfinite(p.grad).all() for p in draft.parameters() if p.grad is not None)
