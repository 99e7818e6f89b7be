"""One decoding step, shared by every strategy:

    build input and mask -> forward -> choose tokens -> verify -> compact KV

The query layout and the verify walk are pure functions (engine/query.py); the model call conventions
and the padding to the device's width floor live in engine/model_runner.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lookahead.engine.draft import CandidateTree, Draft, StepOutcome
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import ForwardTimer, ModelRunner, Rows
from lookahead.engine.attention import GAP_FREE, model_key_layout
from lookahead.engine.numerics import KEY_ALIGN, WidthProbe
from lookahead.engine.query import align_tree, build_query, verify
from lookahead.engine.sources import HISTORY
from lookahead.engine.sampling import TokenChooser, largest


@dataclass(frozen=True)
class StepItem:
    """One sequence's part of a batched step: its root token, its allocated draft, how it picks tokens,
    how many of the model's top predictions per row its sources recycle (0: none), the tokens before
    the root, and whether its sources want the final hidden states of the rows the step keeps."""

    root: int
    draft: Draft
    chooser: TokenChooser
    top_k: int = 0
    history: tuple[int, ...] = ()  # the tokens before the root, oldest first (the last HISTORY are reported)
    states: bool = False


class StepRunner:
    """Runs steps for one sequence. `numerics`: the model's width probe; with a usable floor every pass
    is padded to it and only the tree's best chain is verified, so that every accepted token is
    bit-identical to (padded) autoregressive decoding. None: unpadded, any tree.
    `top_k`: also report the model's top-k next tokens at every computed row (StepOutcome.successors),
    for sources that recycle them; 0: none. With a floor, exact steps verify the tree's first chain
    only, unless asked for whole trees and the probe found the way exact: as they come where the
    attention is gap-free (`aligned` on the C++ kernel: engine/attention.py key_layout), over key views
    (`key_views`, engine/attention.py) or with their keys at aligned offsets (`aligned`, engine/query.py
    align_tree)."""

    def __init__(self, model: Any, chooser: TokenChooser | None, numerics: WidthProbe | None = None,
                 top_k: int = 0, key_views: bool = False, aligned: bool = False) -> None:
        exact = numerics is not None and numerics.floor is not None
        self.layout = model_key_layout(model)  # where aligned trees' keys may sit (engine/attention.py)
        # Exact steps verify whole trees where the probe found it exact: laid out as they come where the
        # attention is gap-free by construction and the probe agrees (`gap_free`, the C++ kernel), else
        # over key views (engine/attention.py) or at aligned offsets; elsewhere only the first chain.
        trees = bool(aligned and exact and numerics.exact_attention and numerics.aligned_exact)  # type: ignore[union-attr]
        self.gap_free = trees and numerics.gap_invariant and self.layout == GAP_FREE  # type: ignore[union-attr]
        self.views = bool(key_views and exact and not self.gap_free and numerics.exact_attention  # type: ignore[union-attr]
                          and numerics.tree_exact)  # type: ignore[union-attr]
        self.aligned = trees and not self.views and not self.gap_free
        self.chain_only = exact and not self.views and not self.aligned and not self.gap_free
        self.model = ModelRunner(model, numerics.floor if exact else None,  # type: ignore[union-attr]
                                 exact_attention=exact and numerics.exact_attention,  # type: ignore[union-attr]
                                 batch_exact=exact and numerics.batch_exact, views=self.views,  # type: ignore[union-attr]
                                 ceiling=numerics.ceiling if exact else None,  # type: ignore[union-attr]
                                 quantum=numerics.quantum if exact else 1)  # type: ignore[union-attr]
        self.chooser = chooser
        self.top_k = top_k
        self.pad_to: Callable[[int], int] | None = None  # the width to run a pass of k rows at (cost curve)

    def verifiable(self, tree: CandidateTree, p: int) -> CandidateTree:
        """The part of `tree` (root at position p) that a step of this runner can verify exactly; the
        allocator sizes the step from it. Where only first chains can be, the allocator picks a path
        itself (Candidates.chain_only), so the tree is returned whole."""
        return self._align(tree, p)[0] if self.aligned and len(tree) else tree

    def _align(self, tree: CandidateTree, p: int) -> tuple[CandidateTree, list[int]]:
        return align_tree(tree, p, self.layout.period, self.layout.block, self.layout.pairs)

    def new_cache(self, slots: int = 1) -> KVCache:
        """A cache of `slots` sequences for this runner: keys aligned (engine/kvcache.py) when passes are
        padded for exactness."""
        return KVCache(KEY_ALIGN if self.model.floor else 1, slots)

    @property
    def timer(self) -> ForwardTimer:
        return self.model.timer

    def prefill(self, cache: KVCache, prompt: list[int], states: bool = False, cached: int = 0) -> torch.Tensor | None:
        """Cache every prompt token but the last (the last is the first step's root). `states`: return
        their final hidden states [len(prompt) - 1 - cached, D] (None where the model does not report
        them). `cached`: the cache's selected slot already holds the first `cached` tokens' keys and values
        (engine/prefix_cache.py), so only the rest is computed."""
        return self.model.prefill(cache, prompt[cached:-1], states, continued=cached > 0)

    def step(self, cache: KVCache, root: int, draft: Draft) -> StepOutcome:
        """One step of one sequence (the cache's selected slot): the batch-of-one `step_batch`."""
        if self.chooser is None:
            raise ValueError("this runner has no token chooser: pass one, or step through step_batch")
        return self.step_batch(cache, [StepItem(root, draft, self.chooser, self.top_k)])[0]

    def step_batch(self, cache: KVCache, items: Sequence[StepItem]) -> list[StepOutcome]:
        """One forward pass for many sequences, item b in the cache's selected slot b, each draft as
        allocated (engine/allocator.py sized them before the call). A sequence's rows see only its own
        slot's keys, so each outcome is what stepping that sequence alone gives."""
        lengths = cache.slot_lengths()  # p per sequence: its cache holds positions 0..p-1
        trees = [it.draft.tree.first_chain() if self.chain_only else it.draft.tree for it in items]
        offsets: list[list[int] | None] = [None] * len(items)
        if self.aligned:  # each node's key where the kernels reduce it as in autoregressive decoding
            for i, p in enumerate(lengths):
                trees[i], offsets[i] = self._align(trees[i], p)

        # 1. Build the input: [root | tree nodes | aux rows] per sequence (engine/query.py).
        queries = [build_query(it.root, p, tree, it.draft.aux, self.views, o)
                   for it, p, tree, o in zip(items, lengths, trees, offsets)]

        # 2. Forward: one pass, every sequence padded to the same width; logits for the kept rows.
        b = len(items)
        q = max(query.width for query in queries)
        width = -(-self.pad_to(b * q) // b) if self.pad_to is not None else 0
        spent = self.model.timer.seconds
        logits = self.model.forward_batch(cache, [Rows(x.tokens, x.positions, x.local, x.keep, x.views, x.offsets)
                                                  for x in queries], width, states=any(it.states for it in items))
        hidden = self.model.states  # [B, Q, D] final hidden states when some item asked; else None
        spent = self.model.timer.seconds - spent
        rows = self.model.pass_width(b, q, width)  # each sequence's width in the pass

        outcomes = []
        for slot, (it, p, tree, query, out) in enumerate(zip(items, lengths, trees, queries, logits)):
            # 3. Choose: the model's own token at the kept rows (greedy or seeded Gumbel-max): at every row,
            #    or, sampling, at the rows the walk below visits (their order is the walk's).
            t = query.n_tree
            top = largest(out, it.top_k) if it.top_k else None  # [K, top_k] values, indices
            values, indices = (top.values.tolist(), top.indices.tolist()) if top is not None else ([], [])
            chosen = _Choices(it.chooser, out, (query.positions[query.keep] + 1).tolist(), it.chooser.cfg.greedy,
                              None if top is None else (values, indices))

            # 4. Verify: the longest path of the tree the model itself would have produced, plus its next token.
            accepted, sources, nodes = verify(tree, chosen[0], chosen.nodes(t))

            # 5. Compact the cache: keep the root's and the matched nodes' keys/values, drop the rest.
            kept = torch.tensor([0, *(1 + n for n in nodes)])
            cache.keep(p, kept if query.offsets is None else query.offsets[kept], slot=cache.selection.lo + slot)

            # 6. Recyclable predictions: the model's top-k next tokens at every row it computed.
            #    With each row, the tokens before its input token on its own path (the history before the
            #    root; a node's ancestors and the root), which key the recycled rows by context; none for aux rows.
            successors: list[tuple[int, tuple[int, ...]]] = []
            before: list[tuple[int, ...]] = []
            scores: list[tuple[float, ...]] = []
            if top is not None:
                successors = list(zip(query.tokens[query.keep].tolist(), map(tuple, indices)))
                scores = list(map(tuple, values))  # the model's confidence in each; sampled
                # steps also order recycled rows by them (candidates/recycling.py, candidates/confidence.py)
                before = [it.history[-HISTORY:]]
                for parent in tree.parents:  # parents come first: node i's tokens before it extend its parent's
                    before.append((*before[parent + 1], it.root if parent < 0 else tree.tokens[parent])[-HISTORY:])
                before += [()] * (len(successors) - len(before))
            # 7. Final hidden states of the rows whose keys stay (the root, the matched nodes), for sources that
            #    compare them (engine/sources.WantsStates; the suffix source with LookaheadConfig.hidden_states).
            states = hidden[slot, kept] if it.states and hidden is not None else None
            outcomes.append(StepOutcome(accepted, sources, chosen.after(1 + t), query_tokens=rows, candidate_tokens=t,
                                        successors=successors, predecessors=before, successor_logits=scores,
                                        forward_s=spent / b, states=states))
        return outcomes


class _Choices:
    """The model's tokens at a step's kept rows (logits [K, V], the positions they predict [K]), chosen
    all at once (`eager`: greedy, a cheap argmax) or as they are asked for. Sampling costs per row
    (top-k/top-p, Gumbel noise for a new position: ~0.3-0.7 ms a row with SmolLM2's 49,152 tokens), and
    the walk visits the root and the accepted nodes, typically 2-3 of a step's 8 rows. The rule is row
    by row, so a row's token is the same chosen alone or among others (engine/sampling.py)."""

    def __init__(self, chooser: TokenChooser, logits: torch.Tensor, positions: list[int], eager: bool,
                 top: tuple[list[list[float]], list[list[int]]] | None = None) -> None:
        self.chooser, self.logits, self.positions = chooser, logits, positions
        self.known: dict[int, int] = dict(enumerate(chooser.choose(logits, positions, top))) if eager else {}

    def __getitem__(self, row: int) -> int:
        if row not in self.known:
            self.known[row] = self.chooser.choose(self.logits[row : row + 1], self.positions[row : row + 1])[0]
        return self.known[row]

    def nodes(self, t: int) -> _NodeChoices:
        """The tokens after the tree's t nodes (rows 1..t), indexed by node."""
        return _NodeChoices(self, t)

    def after(self, start: int) -> list[int]:
        """The tokens at rows start.. (the aux branch's, all needed), chosen together."""
        end = len(self.positions)
        if any(r not in self.known for r in range(start, end)):
            self.known.update(zip(range(start, end), self.chooser.choose(self.logits[start:], self.positions[start:])))
        return [self.known[r] for r in range(start, end)]


class _NodeChoices(Sequence[int]):
    """node_choice for `verify`: node i's token is row 1 + i's."""

    def __init__(self, choices: _Choices, t: int) -> None:
        self.choices, self.t = choices, t

    def __getitem__(self, node: int) -> int:  # type: ignore[override]
        if not 0 <= node < self.t:
            raise IndexError(node)
        return self.choices[1 + node]

    def __len__(self) -> int:
        return self.t
