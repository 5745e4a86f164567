"""Lossless tree speculative decoding (SGLang's num_steps / topk / num_draft_tokens): an HF
target, an EAGLE-3 draft, one sequence at a time.

Tree round: the draft grows a tree from the last accepted token, its frontier nodes batched
per step, each on its own path of temporary keys (`DraftState.branch`); the best nodes by
cumulative draft log-probability are verified in one target forward under a tree mask, the
deepest path agreeing with the target's argmax is accepted plus the bonus, and the target
cache keeps just that path. `reach` counts as for the chain (`spec_decode`'s docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from draftsmith.draft.model import Eagle3Draft
from draftsmith.evaluate.spec_decode import (
    AuxHooks,
    Decoded,
    DraftState,
    cache_kwarg,
    emit_step,
    prefill_and_start,
)
from draftsmith.speculation import Speculation
from draftsmith.target.layers import AuxLayers


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
    kwargs = {cache_kwarg(type(model)): cache, "use_cache": True}
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
    cache, result, started = prefill_and_start(model, hooks, draft, prompt, max_new_tokens, stop_set)
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
        if emit_step(result, emitted, max_new_tokens, stop_set):
            return result
        # The cache keeps the prefix and the accepted path; the draft gets the path's features.
        on_path = torch.tensor(path, device=device)
        keep_positions(cache, torch.cat([torch.arange(prefix, device=device), prefix + on_path]))
        new_aux = hooks.take()[0].index_select(0, on_path)
        new_next = torch.tensor(emitted, device=device)
        token = emitted[-1]
