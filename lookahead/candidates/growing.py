"""What the copy sources share: an index over the text (prompt, then every accepted token) that grows
with it, token by token, and starts over when handed a text that does not extend it (another request)."""

from __future__ import annotations

from collections.abc import Sequence

CHECKED = 8  # trailing tokens compared to tell the indexed text's continuation from another text


class GrowingText:
    """A base for sources that index the text as it grows. `_tokens` is what is indexed so far; a subclass
    defines `_reset` (an empty index; it must set `_tokens` to []) and `_extend` (index one more token,
    appending it to `_tokens`)."""

    _tokens: list[int]

    def _reset(self) -> None:
        raise NotImplementedError

    def _extend(self, token: int) -> None:
        raise NotImplementedError

    def _sync(self, context: Sequence[int]) -> None:
        """Index what `context` adds to the indexed text; start over where it does not extend it.

        Whether it does is judged from the first token and the last CHECKED indexed ones, in O(1) a step
        rather than by comparing the whole text: another text with the same tokens there but not
        elsewhere would keep the old index, which costs guesses only (every guess is verified)."""
        n = len(self._tokens)
        if len(context) < n or (n and not self._extends(context, n)):
            self._reset()
            n = 0
        for token in context[n:]:
            self._extend(int(token))

    def _extends(self, context: Sequence[int], n: int) -> bool:
        """`context`'s first token and its tokens at the last CHECKED indexed positions are the index's."""
        start = max(n - CHECKED, 0)
        return context[0] == self._tokens[0] and list(context[start:n]) == self._tokens[start:n]
