"""Greedy decoding and lossless chain and tree speculative decoding: an HF target, an EAGLE-3 draft.

Both loops run one sequence at a time on any torch device, with the target's KV cache.

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

Tree round (`tree_speculative`, SGLang's num_steps / topk / num_draft_tokens): the draft
grows a tree from the last accepted token, its frontier nodes batched per step, each on
its own path of temporary keys; the best nodes by cumulative draft log-probability are
verified in one target forward under a tree mask, the deepest path agreeing with the
target's argmax is accepted plus the bonus, and the target cache keeps just that path.

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
from draftsmith.speculation import Speculation
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
def _cache_kwarg(model_class: type) -> str:
    # transformers renamed `past_key_values` to `cache` (5.2x); an older version would
    # swallow `cache` in **kwargs and silently decode without one.
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def _logits(model, input_ids: torch.Tensor, cache: DynamicCache, last_only: bool) -> torch.Tensor:
    """The target's logits for `input_ids` appended to `cache` (of the last position only, or all)."""
    kwargs = {_cache_kwarg(type(model)): cache, "use_cache": True, "logits_to_keep": 1 if last_only else 0}
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


def _start(
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


def _emit(result: Decoded, emitted: list[int], max_new_tokens: int, stop_set: set[int]) -> bool:
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
    cache, result, started = _start(model, hooks, draft, prompt, max_new_tokens, stop_set, slack=k)
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
        if _emit(result, emitted, max_new_tokens, stop_set):
            return result
        cache.crop(-(k - accepted))  # keep the accepted positions' keys and values
        new_aux = hooks.take()[0, : accepted + 1]
        new_next = torch.tensor(emitted, device=device)
        token = emitted[-1]


@dataclass
class DraftTree:
    """Tree nodes: target token, parent (an earlier node; -1 is the root, the last accepted
    token) and cumulative draft log-probability. Parents come before their children."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]

    def depths(self) -> list[int]:
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 + (depths[parent] if parent >= 0 else 0))
        return depths


# The tree verified and the target's argmax at the root and each node -> the accepted path
# (flat positions, see `accepted_path`).
TreeAcceptFn = Callable[[DraftTree, list[int]], list[int]]


def _top(state: DraftState, hidden: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of `hidden` (rows, H): the draft's topk log-probabilities and their target ids."""
    logits = state.draft.logits(hidden).float()
    # topk of the logits themselves: the same order as the chain's argmax.
    best, ids = logits.topk(topk, dim=-1)
    return best - logits.logsumexp(-1, keepdim=True), state.to_target[ids]


def grow_tree(state: DraftState, hidden: torch.Tensor, num_steps: int, topk: int) -> DraftTree:
    """Every node the draft generates after the root (EAGLE-2 / SGLang expansion).

    `hidden` (1, 1, H) is step 0's output at the last accepted position. Step 1 takes the
    topk tokens after it; each further step runs the topk frontier nodes as one batch, and
    of their topk*topk children (all of them nodes) keeps the topk best by cumulative
    log-probability as the next frontier, their paths' temporary keys reordered by parent
    as in beam search.
    """
    logp, tokens = _top(state, hidden[0], topk)
    scores, tokens = logp[0], tokens[0]
    frontier = torch.arange(topk, device=hidden.device)
    found = [(tokens, torch.full_like(frontier, -1), scores)]
    hidden, paths = hidden.expand(1, topk, -1), state.no_paths(topk)
    for step in range(1, num_steps):
        hidden, paths = state.branch(hidden, tokens, paths, step)
        logp, children = _top(state, hidden[0], topk)  # (topk, topk): per frontier node
        cumulative, children = (scores[:, None] + logp).flatten(), children.flatten()
        first = topk + (step - 1) * topk * topk  # node index of children[0]
        found.append((children, frontier.repeat_interleave(topk), cumulative))
        scores, best = cumulative.topk(topk)
        rows = best // topk
        frontier, tokens, hidden = first + best, children[best], hidden[:, rows]
        paths = (paths[0][rows], paths[1][rows])
    # Token ids and indices are exact in float64: one device sync for all three.
    columns = torch.stack([torch.cat(column).double() for column in zip(*found, strict=True)]).tolist()
    return DraftTree([int(t) for t in columns[0]], [int(p) for p in columns[1]], columns[2])


def _select(tree: DraftTree, count: int) -> DraftTree:
    """The `count` best nodes by cumulative log-probability, parents still first.

    Ancestor-closed: a child never scores above its parent (it adds a log-probability
    <= 0), and on a tie the stable sort keeps the parent, generated earlier, ahead."""
    kept = sorted(sorted(range(len(tree.scores)), key=lambda i: -tree.scores[i])[:count])
    at = {-1: -1} | {node: i for i, node in enumerate(kept)}
    return DraftTree(
        [tree.tokens[i] for i in kept], [at[tree.parents[i]] for i in kept], [tree.scores[i] for i in kept]
    )


def tree_mask(tree: DraftTree, prefix: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The additive 4-D mask (1, 1, 1+n, prefix+1+n) for the root and the tree's n nodes:
    each sees the cached prefix, its ancestors and itself (0), nothing else (dtype min).
    Additive rather than boolean: both the sdpa and the eager attention take it as it is."""
    n = 1 + len(tree.tokens)
    visible = torch.eye(n, dtype=torch.bool)
    for i, parent in enumerate(tree.parents, start=1):
        visible[i] |= visible[parent + 1]
    allowed = torch.cat([torch.ones(n, prefix, dtype=torch.bool), visible], dim=1).to(device)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )
    return mask[None, None]


def verify_tree(model, cache: DynamicCache, root: int, tree: DraftTree) -> torch.Tensor:
    """The target's logits (1+n, V) at the root and the tree's nodes, all appended to `cache`."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in ("sdpa", "eager"):
        # Others (flash attention) may drop a custom 4-D mask without a word.
        raise ValueError(f"tree verification needs sdpa or eager attention, the target uses {implementation}")
    prefix, device = cache.get_seq_length(), model.device
    ids = torch.tensor([[root, *tree.tokens]], device=device)
    positions = torch.tensor([[0, *tree.depths()]], device=device) + prefix
    mask = tree_mask(tree, prefix, model.dtype, device)
    kwargs = {_cache_kwarg(type(model)): cache, "use_cache": True}
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, **kwargs).logits[0]


def accepted_path(tree: DraftTree, best: list[int]) -> list[int]:
    """Flat positions (0: the root, i: node i-1) of the root and the accepted nodes: from the
    root, the child holding the target's argmax at its parent, as deep as that goes."""
    child = {
        (parent + 1, token): i + 1
        for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True))
    }
    path = [0]
    while (path[-1], best[path[-1]]) in child:
        path.append(child[path[-1], best[path[-1]]])
    return path


def keep_positions(cache: DynamicCache, keep: torch.Tensor) -> None:
    """Keep only the sequence positions `keep` of every layer's keys and values."""
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(-2, keep)
        layer.values = layer.values.index_select(-2, keep)


@torch.inference_mode()
def tree_speculative(
    model,
    draft: Eagle3Draft,
    aux: AuxLayers,
    prompt_ids: Sequence[int],
    num_steps: int,
    topk: int,
    num_draft_tokens: int,
    max_new_tokens: int,
    stops: Sequence[int],
    accept: TreeAcceptFn = accepted_path,
) -> Decoded:
    """Tree speculative decoding (EAGLE-2 / SGLang settings; greedy, lossless).

    Each round the draft grows a tree `num_steps` deep, `topk` wide (`grow_tree`), the
    target verifies the root and the `num_draft_tokens - 1` best nodes in one forward
    under a tree mask, and the deepest path agreeing with the target's argmax is accepted
    plus the target's next token. `reach` holds the accepted depth per verify step, as
    for `speculative`; topk=1 with num_draft_tokens = num_steps + 1 is its chain of k =
    num_steps. `accept` replaces the path rule (tests break verification with it).
    """
    Speculation(num_steps, topk, num_draft_tokens).check()
    if topk > draft.config.draft_vocab_size:
        raise ValueError(f"topk={topk} exceeds the draft vocabulary ({draft.config.draft_vocab_size} tokens)")
    shape = (num_steps, topk, num_draft_tokens)
    with AuxHooks(model, aux) as hooks:
        prompt = list(prompt_ids)
        return _tree_speculative(model, hooks, draft, prompt, shape, max_new_tokens, set(stops), accept)


def _tree_speculative(
    model,
    hooks: AuxHooks,
    draft: Eagle3Draft,
    prompt: list[int],
    shape: tuple[int, int, int],
    max_new_tokens: int,
    stop_set: set[int],
    accept: TreeAcceptFn,
) -> Decoded:
    num_steps, topk, num_draft_tokens = shape
    device = model.device
    cache, result, started = _start(model, hooks, draft, prompt, max_new_tokens, stop_set)
    if started is None:
        return result
    state, new_aux, new_next = started
    token = result.tokens[-1]
    while True:
        hidden = state.extend(new_aux, new_next)
        tree = _select(grow_tree(state, hidden, num_steps, topk), num_draft_tokens - 1)
        prefix = cache.get_seq_length()
        best = verify_tree(model, cache, token, tree).argmax(-1).tolist()
        path = accept(tree, best)
        emitted = [tree.tokens[i - 1] for i in path[1:]] + [best[path[-1]]]
        if _emit(result, emitted, max_new_tokens, stop_set):
            return result
        # The cache keeps the prefix and the accepted path; the draft gets the path's features.
        on_path = torch.tensor(path, device=device)
        keep_positions(cache, torch.cat([torch.arange(prefix, device=device), prefix + on_path]))
        new_aux = hooks.take()[0].index_select(0, on_path)
        new_next = torch.tensor(emitted, device=device)
        token = emitted[-1]


@torch.inference_mode()
def top2_margin(model, ids: Sequence[int]) -> float:
    """The target's top-1 minus top-2 logit after `ids` (one uncached forward)."""
    inputs = torch.tensor([list(ids)], device=model.device)
    top = model(input_ids=inputs, logits_to_keep=1).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])
