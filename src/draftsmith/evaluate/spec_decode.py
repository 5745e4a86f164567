"""Greedy decoding and lossless chain speculative decoding: an HF target, an EAGLE-3 draft;
and the decoding parts the tree (`tree_decode`) shares: the result, the aux hooks, the
draft's KV cache, the target's cache calls.

The loops run one sequence at a time on any torch device, with the target's KV cache.

Speculative round (chain of k): the draft proposes k tokens, the target verifies the
last accepted token plus the k proposals in one forward, the longest prefix where a
proposal equals the target's argmax is accepted plus the target's own next token (the
bonus), and the target cache is cropped to what was accepted.

The draft's KV cache follows the training-time math of `draft/model.py`: the draft at
position t reads the fused target feature of t and the embedding of token t+1, and
predicts token t+2; TTT step j sits at rotary position t+j and attends to the step-0
keys of positions <= t plus its own keys of steps 1..j. So every accepted position gets
permanent step-0 keys (computed from the target's features), and the k-1 further steps
of a round append temporary keys behind them that the next round overwrites.

Counting: the first generated token comes from the prefill, the rest from verify
steps. `reach` holds, per verify step, how many proposals the kept output accepted
(the tokens a step adds are reach + 1), so acceptance length = sum(reach + 1) / steps
= 1 + sum_i p_i exactly. (SGLang's completion_tokens / spec_verify_ct also counts the
prefill token, so it reads slightly higher on short outputs.)
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from draftsmith.draft.model import Eagle3Draft
from draftsmith.draft.vocab import draft_to_target
from draftsmith.target.layers import AuxLayers

# Proposals and the target's argmax at each verified position -> proposals accepted.
AcceptFn = Callable[[list[int], list[int]], int]


@dataclass
class Decoded:
    tokens: list[int]
    seconds: float = 0.0
    reach: list[int] = field(default_factory=list)  # per verify step: proposals kept

    @property
    def verify_steps(self) -> int:
        return len(self.reach)

    @property
    def acceptance_length(self) -> float | None:
        """Tokens per verify step, the prefill's first token left out; None without a step."""
        return (len(self.tokens) - 1) / self.verify_steps if self.verify_steps else None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, decode: Callable[[], Decoded]) -> Decoded:
    """Run `decode` with the device drained before and after, recording its wall time."""
    synchronize(device)
    started = time.perf_counter()
    result = decode()
    synchronize(device)
    result.seconds = time.perf_counter() - started
    return result


def longest_agreeing_prefix(proposals: list[int], target_best: list[int]) -> int:
    accepted = 0
    while accepted < len(proposals) and proposals[accepted] == target_best[accepted]:
        accepted += 1
    return accepted


def _keep(tokens: list[int], room: int, stops: set[int]) -> tuple[list[int], bool]:
    """The part of `tokens` the output keeps (up to `room`, through a stop id); and done?"""
    kept = tokens[:room]
    stop_at = next((i for i, t in enumerate(kept) if t in stops), None)
    if stop_at is not None:
        return kept[: stop_at + 1], True
    return kept, len(kept) == room


class AuxHooks:
    """Forward hooks keeping the outputs of the target's aux decoder layers (output-of ids)."""

    def __init__(self, model, aux: AuxLayers) -> None:
        layers = model.get_decoder().layers
        self.ids = list(aux.output_of)
        self._captured: dict[int, torch.Tensor] = {}
        self._handles = [layers[i].register_forward_hook(self._keeper(i)) for i in self.ids]

    def _keeper(self, index: int) -> Callable:
        def keep(_module, _inputs, output) -> None:
            self._captured[index] = output[0] if isinstance(output, tuple) else output

        return keep

    def take(self) -> torch.Tensor:
        """The last forward's aux states, concatenated low..high: (1, T, 3H)."""
        aux = torch.cat([self._captured[i] for i in self.ids], dim=-1)
        self._captured.clear()
        return aux

    def __enter__(self) -> AuxHooks:
        return self

    def __exit__(self, *_exc) -> None:
        for handle in self._handles:
            handle.remove()


class DraftState:
    """One sequence's draft KV cache, preallocated; `length` entries are permanent."""

    def __init__(self, draft: Eagle3Draft, capacity: int) -> None:
        c = draft.config
        weight = draft.fc.weight
        shape = (1, c.num_key_value_heads, capacity, c.head_dim)
        self.draft = draft
        self.keys = weight.new_zeros(shape)
        self.values = weight.new_zeros(shape)
        self.length = 0
        self.to_target = draft_to_target(draft.d2t)

    def _layer(self, embeds, hidden, positions, allowed: torch.Tensor | None, at: int) -> torch.Tensor:
        """The draft layer on (1, n, H) inputs; keys/values written at slots [at, at+n).

        The query attends to every slot before at+n that `allowed` ((n, at+n) bool) lets
        it; None lets it attend to all of them.
        """
        q, k, v = self._project(embeds, hidden, positions)
        end = at + k.shape[2]
        self.keys[:, :, at:end] = k
        self.values[:, :, at:end] = v
        return self._attend(hidden, q, self.keys[:, :, :end], self.values[:, :, :end], allowed)

    def _project(self, embeds, hidden, positions) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layer = self.draft.midlayer
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
        return layer.self_attn.project(x, positions)

    def _attend(self, hidden, q, keys, values, allowed: torch.Tensor | None) -> torch.Tensor:
        layer = self.draft.midlayer
        heads = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, enable_gqa=True)
        h = hidden + layer.self_attn.o_proj(heads.transpose(1, 2).reshape(*hidden.shape[:2], -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def extend(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Step 0 at n new positions: target features (n, 3H), each position's next token
        (n,). Their keys become permanent; returns the last position's hidden (1, 1, H)."""
        n, start = aux.shape[0], self.length
        device = aux.device
        hidden = self.draft.fc(aux.to(self.draft.fc.weight.dtype))[None]
        embeds = self.draft.embed_tokens(next_tokens)[None].to(hidden.dtype)
        positions = torch.arange(start, start + n, device=device)[None]
        causal = torch.ones(n, start + n, dtype=torch.bool, device=device).tril(start)
        out = self._layer(embeds, hidden, positions, causal, start)
        self.length = start + n
        return out[:, -1:]

    def speculate(self, hidden: torch.Tensor, token: torch.Tensor, step: int) -> torch.Tensor:
        """TTT step `step` (>= 1) at the last permanent position, fed the previous step's
        hidden and the token it proposed; its keys are temporary."""
        last = self.length - 1
        embeds = self.draft.embed_tokens(token.view(1, 1)).to(hidden.dtype)
        positions = torch.full((1, 1), last + step, device=hidden.device)
        # One query: every stored key is a permanent one or this round's own.
        return self._layer(embeds, hidden, positions, None, self.length + step - 1)

    def no_paths(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Temporary keys and values of `rows` tree paths before step 1: (rows, kv heads, 0, d)."""
        empty = self.keys.new_zeros(rows, self.keys.shape[1], 0, self.keys.shape[3])
        return empty, empty

    def branch(
        self, hidden: torch.Tensor, tokens: torch.Tensor, paths: tuple[torch.Tensor, torch.Tensor], step: int
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """TTT step `step` (>= 1) for b tree nodes at once, what `speculate` computes for each
        node's own path: `hidden` (1, b, H) is each node's previous step, `tokens` (b,) the
        target ids the nodes hold, `paths` each node's temporary keys and values of steps
        1..step-1 ((b, kv heads, step-1, d)). Returns the new hidden (1, b, H) and the paths
        with this step's keys appended.

        The b queries share one batch row: each attends to the permanent keys (not copied
        per node) and, through the mask, to its own path's temporary keys only.
        """
        b, n, device = tokens.numel(), self.length, hidden.device
        embeds = self.draft.embed_tokens(tokens.view(1, b)).to(hidden.dtype)
        positions = torch.full((1, b), n - 1 + step, device=device)
        q, k, v = self._project(embeds, hidden, positions)
        # (1, kv heads, b, d) -> (b, kv heads, 1, d): one new key per path.
        keys = torch.cat([paths[0], k.transpose(0, 2)], dim=2)
        values = torch.cat([paths[1], v.transpose(0, 2)], dim=2)
        own = torch.eye(b, dtype=torch.bool, device=device).repeat_interleave(step, dim=1)
        allowed = torch.cat([own.new_ones(b, n), own], dim=1)
        out = self._attend(
            hidden,
            q,
            torch.cat([self.keys[:, :, :n], _side_by_side(keys)], dim=2),
            torch.cat([self.values[:, :, :n], _side_by_side(values)], dim=2),
            allowed,
        )
        return out, (keys, values)

    def target_ids(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.to_target[self.draft.logits(hidden).reshape(-1).argmax()]

    def propose(self, aux: torch.Tensor, next_tokens: torch.Tensor, k: int) -> torch.Tensor:
        """Add the accepted positions, then chain k proposals (target ids, (k,))."""
        hidden = self.extend(aux, next_tokens)
        proposals = [self.target_ids(hidden)]
        for step in range(1, k):
            hidden = self.speculate(hidden, proposals[-1], step)
            proposals.append(self.target_ids(hidden))
        return torch.stack(proposals)


def _side_by_side(paths: torch.Tensor) -> torch.Tensor:
    """(b, kv heads, s, d) per-path keys as one sequence (1, kv heads, b*s, d), path by path."""
    return paths.transpose(0, 1).reshape(1, paths.shape[1], -1, paths.shape[3])


def _new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


@functools.cache
def cache_kwarg(model_class: type) -> str:
    # transformers renamed `past_key_values` to `cache` (5.2x); an older version would
    # swallow `cache` in **kwargs and silently decode without one.
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def _logits(model, input_ids: torch.Tensor, cache: DynamicCache, last_only: bool) -> torch.Tensor:
    """The target's logits for `input_ids` appended to `cache` (of the last position only, or all)."""
    kwargs = {cache_kwarg(type(model)): cache, "use_cache": True, "logits_to_keep": 1 if last_only else 0}
    return model(input_ids=input_ids, **kwargs).logits


def _prefill(model, prompt: list[int], cache: DynamicCache) -> int:
    """The prompt into `cache`; returns the first generated token."""
    inputs = torch.tensor([prompt], device=model.device)
    return int(_logits(model, inputs, cache, last_only=True)[0, -1].argmax())


@torch.inference_mode()
def greedy(model, prompt_ids: Sequence[int], max_new_tokens: int, stops: Sequence[int]) -> Decoded:
    """The target alone: one token per forward, until a stop id or `max_new_tokens`."""
    device = model.device
    cache = _new_cache(model)
    inputs = torch.tensor([list(prompt_ids)], device=device)
    out: list[int] = []
    stop_set = set(stops)
    while True:
        token = int(_logits(model, inputs, cache, last_only=True)[0, -1].argmax())
        out.append(token)
        if token in stop_set or len(out) == max_new_tokens:
            return Decoded(out)
        inputs = torch.tensor([[token]], device=device)


@torch.inference_mode()
def speculative(
    model,
    draft: Eagle3Draft,
    aux: AuxLayers,
    prompt_ids: Sequence[int],
    k: int,
    max_new_tokens: int,
    stops: Sequence[int],
    accept: AcceptFn = longest_agreeing_prefix,
) -> Decoded:
    """Chain speculative decoding with k proposals per verify step (greedy, lossless)."""
    with AuxHooks(model, aux) as hooks:
        return _speculative(model, hooks, draft, list(prompt_ids), k, max_new_tokens, set(stops), accept)


def prefill_and_start(
    model,
    hooks: AuxHooks,
    draft: Eagle3Draft,
    prompt: list[int],
    max_new_tokens: int,
    stop_set: set[int],
    slack: int = 0,
) -> tuple[DynamicCache, Decoded, tuple[DraftState, torch.Tensor, torch.Tensor] | None]:
    """The target's prefill: its cache, the first token as the result so far, and (unless that
    token ends the decode) the draft's state with the features and next tokens it starts from;
    `slack` positions beyond the last token leave room for a chain's proposals."""
    cache = _new_cache(model)
    token = _prefill(model, prompt, cache)
    result = Decoded([token])
    if token in stop_set or max_new_tokens == 1:
        return cache, result, None
    state = DraftState(draft, len(prompt) + max_new_tokens + slack)
    return cache, result, (state, hooks.take()[0], torch.tensor(prompt[1:] + [token], device=model.device))


def emit_step(result: Decoded, emitted: list[int], max_new_tokens: int, stop_set: set[int]) -> bool:
    """Add one verify step's tokens to `result`; True when the decode is done."""
    kept, done = _keep(emitted, max_new_tokens - len(result.tokens), stop_set)
    result.tokens += kept
    result.reach.append(len(kept) - 1)
    return done


def _speculative(
    model,
    hooks: AuxHooks,
    draft: Eagle3Draft,
    prompt: list[int],
    k: int,
    max_new_tokens: int,
    stop_set: set[int],
    accept: AcceptFn,
) -> Decoded:
    device = model.device
    cache, result, started = prefill_and_start(model, hooks, draft, prompt, max_new_tokens, stop_set, slack=k)
    if started is None:
        return result
    state, new_aux, new_next = started
    token = result.tokens[-1]
    while True:
        proposals = state.propose(new_aux, new_next, k)
        verify = torch.cat([torch.tensor([token], device=device), proposals])[None]
        logits = _logits(model, verify, cache, last_only=False)
        both = torch.cat([proposals, logits[0].argmax(-1)]).tolist()  # one device sync
        drafted, best = both[:k], both[k:]
        accepted = accept(drafted, best)
        emitted = drafted[:accepted] + [best[accepted]]
        if emit_step(result, emitted, max_new_tokens, stop_set):
            return result
        cache.crop(-(k - accepted))  # keep the accepted positions' keys and values
        new_aux = hooks.take()[0, : accepted + 1]
        new_next = torch.tensor(emitted, device=device)
        token = emitted[-1]


@torch.inference_mode()
def top2_margin(model, ids: Sequence[int]) -> float:
    """The target's top-1 minus top-2 logit after `ids` (one uncached forward)."""
    inputs = torch.tensor([list(ids)], device=model.device)
    top = model(input_ids=inputs, logits_to_keep=1).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])
