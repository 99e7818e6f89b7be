"""What the copy sources share: an index over the text (prompt, then every accepted token) that grows
with it, token by token, and starts over when handed a text that does not extend it (another request)."""

from __future__ import annotations

from collections.abc import Sequence


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
        """Index what `context` adds to the indexed text; start over where it does not extend it."""
        n = len(self._tokens)
        if len(context) < n or (n and context[n - 1] != self._tokens[n - 1]):
            self._reset()
            n = 0
        for token in context[n:]:
            self._extend(int(token))
