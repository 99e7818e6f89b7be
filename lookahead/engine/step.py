"""One decoding step, shared by every strategy:

    build input and mask -> forward -> choose tokens -> verify -> compact KV

The query layout and the verify walk are pure functions (engine/query.py); the model call conventions
and the padding to the device's width floor live in engine/model_runner.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lookahead.engine.draft import Draft, StepOutcome
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import ForwardTimer, ModelRunner
from lookahead.engine.numerics import KEY_ALIGN, WidthProbe
from lookahead.engine.query import build_query, verify
from lookahead.engine.sampling import TokenChooser


class StepRunner:
    """Runs steps for one sequence. `numerics`: the model's width probe; with a usable floor every pass
    is padded to it and only the tree's best chain is verified, so that every accepted token is
    bit-identical to (padded) autoregressive decoding. None: unpadded, any tree.
    `top_k`: also report the model's top-k next tokens at every computed row (StepOutcome.successors),
    for sources that recycle them; 0: none."""

    def __init__(self, model: Any, chooser: TokenChooser, numerics: WidthProbe | None = None, top_k: int = 0) -> None:
        exact = numerics is not None and numerics.floor is not None
        self.model = ModelRunner(model, numerics.floor if exact else None,  # type: ignore[union-attr]
                                 exact_attention=exact and numerics.exact_attention)  # type: ignore[union-attr]
        self.chooser = chooser
        self.top_k = top_k
        self.pad_to: Callable[[int], int] | None = None  # the width to run a pass of k rows at (cost curve)
        # Exact steps verify one chain: a probe of a few gap shapes passing does not prove every tree
        # layout exact (a bf16 tree of recycled guesses broke identity where the probe said gap-invariant).
        self.chain_only = exact

    def new_cache(self) -> KVCache:
        """A cache for this runner: keys aligned (engine/kvcache.py) when passes are padded for exactness."""
        return KVCache(KEY_ALIGN if self.model.floor else 1)

    @property
    def timer(self) -> ForwardTimer:
        return self.model.timer

    def prefill(self, cache: KVCache, prompt: list[int]) -> None:
        """Cache every prompt token but the last (the last is the first step's root)."""
        self.model.prefill(cache, prompt[:-1])

    def step(self, cache: KVCache, root: int, draft: Draft) -> StepOutcome:
        """One step for the draft as allocated (engine/allocator.py sized it before the call)."""
        tree = draft.tree.first_chain() if self.chain_only else draft.tree
        p = cache.get_seq_length()

        # 1. Build the input: [root | tree nodes | aux rows], positions and visibility (engine/query.py).
        query = build_query(root, p, tree, draft.aux)

        # 2. Forward: logits for the root, the tree nodes and the aux out rows only.
        spent = self.model.timer.seconds
        width = self.pad_to(query.width) if self.pad_to is not None else 0
        logits = self.model.forward(cache, query.tokens, query.positions, query.local, query.keep, width)  # [K, V]
        spent = self.model.timer.seconds - spent

        # 3. Choose: the model's own token at every kept row (greedy or seeded Gumbel-max).
        chosen = self.chooser.choose(logits, (query.positions[query.keep] + 1).tolist())
        t = query.n_tree

        # 4. Verify: the longest path of the tree the model itself would have produced, plus its next token.
        accepted, sources, nodes = verify(tree, chosen[0], chosen[1 : 1 + t])

        # 5. Compact the cache: keep the root's and the matched nodes' keys/values, drop the rest.
        cache.keep(p, torch.tensor([0, *(1 + n for n in nodes)]))

        # 6. Recyclable predictions: the model's top-k next tokens at every row it computed.
        successors: list[tuple[int, tuple[int, ...]]] = []
        if self.top_k:
            top = torch.topk(logits, self.top_k, dim=-1).indices.tolist()  # [K, top_k]
            successors = list(zip(query.tokens[query.keep].tolist(), map(tuple, top)))
        return StepOutcome(accepted, sources, chosen[1 + t :], query_tokens=max(query.width, self.model.floor or 1, width),
                           candidate_tokens=t, successors=successors, forward_s=spent)
