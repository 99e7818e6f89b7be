"""One decoding step, shared by every strategy:

    build input and mask -> forward -> choose tokens -> verify -> compact KV

Query layout (Q = A_pre + 1 + A_out + T tokens), ordered so that the rows whose logits are needed
form a suffix (`logits_to_keep` then skips the LM head for the rest):

    [aux rows not read back | root | aux out rows | candidate tree nodes]
     positions p+offset       p      p+offset       p+depth

The root is the last accepted token at position p (the cache holds positions 0..p-1).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Any

import torch

from lookahead.engine.draft import Draft, StepOutcome
from lookahead.engine.gate import GateConfig, SpeculationGate
from lookahead.engine.kvcache import KVCache
from lookahead.engine.masks import MaskBuilder
from lookahead.engine.sampling import TokenChooser


@dataclass
class ForwardTimer:
    seconds: float = 0.0
    calls: int = 0


class StepRunner:
    """Owns the model call conventions (mask format, cache kwarg, logits_to_keep) for one model."""

    def __init__(self, model: Any, chooser: TokenChooser, gate: GateConfig = GateConfig()) -> None:
        self.model = model
        self.chooser = chooser
        self.gate = SpeculationGate(gate)
        self.masks = MaskBuilder(model.config, next(model.parameters()).dtype)
        params = inspect.signature(model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.can_keep_logits = "logits_to_keep" in params
        self.timer = ForwardTimer()

    def forward(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor, local: torch.Tensor, keep: int) -> torch.Tensor:
        """tokens/positions: [Q]; local: [Q, Q] bool. Returns logits [keep, V] for the last `keep` rows."""
        prefix = cache.get_seq_length()
        mask = self.masks.build(prefix, positions, local)
        kwargs: dict[str, Any] = {self.cache_kwarg: cache, "use_cache": True}
        if self.can_keep_logits:
            kwargs["logits_to_keep"] = keep
        start = time.perf_counter()
        with torch.no_grad():
            out = self.model(input_ids=tokens[None], position_ids=positions[None], attention_mask=mask, **kwargs)
        self.timer.seconds += time.perf_counter() - start
        self.timer.calls += 1
        return out.logits[0, -keep:]

    def prefill(self, cache: KVCache, prompt: list[int]) -> None:
        """Cache every prompt token but the last (the last is the first step's root)."""
        body = prompt[:-1]
        if not body:
            return
        n = len(body)
        positions = torch.arange(n)
        local = torch.ones(n, n, dtype=torch.bool).tril_()
        self.forward(cache, torch.tensor(body), positions, local, keep=1)

    def step(self, cache: KVCache, root: int, draft: Draft) -> StepOutcome:
        draft = self.gate.admit(draft)  # 0. speculate only where it is expected to pay on this device
        p = cache.get_seq_length()
        tree, aux = draft.tree, draft.aux
        t = len(tree)

        # 1. Build the input: tokens, positions and local visibility, in the layout above.
        n_aux = 0 if aux is None else aux.tokens.shape[0]
        n_out = 0 if aux is None else aux.out_rows.shape[0]
        n_pre = n_aux - n_out
        q = n_aux + 1 + t
        root_row = n_pre
        tokens = torch.empty(q, dtype=torch.long)
        positions = torch.empty(q, dtype=torch.long)
        local = torch.zeros(q, q, dtype=torch.bool)
        local[:, root_row] = True  # everyone sees the root
        tokens[root_row] = root
        positions[root_row] = p
        if aux is not None:
            # aux rows go to [0, n_pre) and (root_row, root_row + n_out], keeping their order otherwise
            is_out = torch.zeros(n_aux, dtype=torch.bool)
            is_out[aux.out_rows] = True
            order = torch.cat([torch.nonzero(~is_out).flatten(), aux.out_rows])  # aux index per aux slot
            rows = torch.cat([torch.arange(n_pre), torch.arange(root_row + 1, root_row + 1 + n_out)])  # [A]
            tokens[rows] = aux.tokens[order]
            positions[rows] = p + aux.offsets[order]
            local[rows[:, None], rows[None, :]] = aux.visible[order][:, order]
        if t:
            tree_rows = torch.arange(root_row + 1 + n_out, q)
            tokens[tree_rows] = torch.tensor(tree.tokens)
            positions[tree_rows] = p + torch.tensor(tree.depths)
            local[tree_rows[:, None], tree_rows[None, :]] = tree.ancestors_matrix()

        # 2. Forward: logits only for the root, the aux out rows and the tree.
        keep = 1 + n_out + t
        spent = self.timer.seconds
        logits = self.forward(cache, tokens, positions, local, keep=keep)  # [keep, V]
        spent = self.timer.seconds - spent

        # 3. Choose: the model's own token at every kept row (greedy or seeded Gumbel-max).
        chosen = self.chooser.choose(logits, (positions[root_row:] + 1).tolist())
        aux_out = chosen[1 : 1 + n_out]
        tree_choice = chosen[1 + n_out :]

        # 4. Verify: walk the trie from the root, following the child whose token equals the model's
        #    choice. Every matched node is a token the model itself would have produced here.
        accepted = [chosen[0]]
        sources: list[str] = []
        kept_rows = [root_row]
        node = tree.children.get((-1, accepted[-1]))
        while node is not None:
            sources.append(tree.sources[node])
            kept_rows.append(root_row + 1 + n_out + node)
            accepted.append(tree_choice[node])
            node = tree.children.get((node, accepted[-1]))
        sources.append("model")

        # 5. Compact the cache: keep the root and the matched nodes' keys/values, drop the rest.
        cache.keep(p, torch.tensor(kept_rows))
        self.gate.observe(accepted, q, spent)
        return StepOutcome(accepted, sources, aux_out, query_tokens=q, candidate_tokens=t)
