"""Speculative decoding's candidate source: a draft model proposes k tokens, one forward each.

The draft keeps its own KV cache. Each proposal first feeds the context tokens the draft has not
seen (the whole prompt the first time, afterwards the one or two tokens the last step decided), then
drafts k tokens autoregressively. Every drafted token is chosen by the same rule as the target's
(greedy argmax, or argmax of the processed logits plus the Gumbel noise of that absolute position),
so under sampling the draft is likely to pick the very token the target will pick: a draft token is
accepted iff it equals the target's own choice, which keeps the output seed-exact.

After the step, the draft's cache is cropped to the accepted length: entries for drafted tokens the
target rejected are dropped; the target's own token is fed at the next proposal.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lookahead.engine.draft import CandidateTree, Draft, StepOutcome
from lookahead.engine.kvcache import KVCache
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.model_runner import ModelRunner


class SpeculativeProposer:
    def __init__(self, draft_model: Any, draft_tokens: int, chooser: TokenChooser) -> None:
        self.k = draft_tokens
        self.runner = ModelRunner(draft_model)  # a draft's rows need no exactness: unpadded
        self.chooser = chooser
        self.vocab = chooser.vocab_size
        self.cache = KVCache()
        self._drafted = 0  # tokens drafted by the last proposal
        self._base = 0  # context length at the last proposal

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        tree = CandidateTree()
        k = min(self.k, budget)
        self._base, self._drafted = len(context), 0
        if k <= 0:
            return Draft(tree=tree)
        pos = self.cache.get_seq_length()
        feed = list(context[pos:])  # at least the root
        drafted: list[int] = []
        for _ in range(k):
            n = len(feed)
            positions = torch.arange(pos, pos + n)
            causal = torch.ones(n, n, dtype=torch.bool).tril_()
            logits = self.runner.forward(self.cache, torch.tensor(feed), positions, causal, keep=torch.tensor([n - 1]))
            pos += n
            token = self.chooser.choose(self._fit(logits), [pos])[0]  # the token at position pos
            drafted.append(token)
            feed = [token]
        tree.add(drafted, "draft")
        self._drafted = k
        return Draft(tree=tree)

    def update(self, context: Sequence[int], outcome: StepOutcome) -> None:
        """Keep the draft's entries for the context before the step plus the drafted tokens the target
        accepted (the last drafted token was never fed, so at most k-1 of them)."""
        matched = len(outcome.accepted) - 1
        keep = self._base + min(matched, max(self._drafted - 1, 0))
        extra = self.cache.get_seq_length() - keep
        if extra > 0:
            self.cache.crop(-extra)

    def draft_cost(self) -> tuple[int, float]:
        """(draft forward passes, seconds inside them) so far."""
        return self.runner.timer.calls, self.runner.timer.seconds

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits cut or padded (-inf) to the target's vocabulary width, so that the
        shared rule sees the same token ids and noise."""
        width = logits.shape[-1]
        if width > self.vocab:
            return logits[:, : self.vocab]
        if width < self.vocab:
            pad = logits.new_full((logits.shape[0], self.vocab - width), float("-inf"))
            return torch.cat([logits, pad], dim=-1)
        return logits
