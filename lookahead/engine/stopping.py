"""Incremental detokenization and the stop rules (EOS, stop strings, max_new_tokens).

Every strategy pushes its accepted tokens through the same StopState one token at a time, so a stop
inside an accepted run truncates exactly where autoregressive decoding would have stopped.
"""

from __future__ import annotations

from typing import Any, Sequence


class IncrementalText:
    """Decodes a growing token list into text deltas, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        # Hold back a trailing U+FFFD only while it may still become a character (UTF-8 is <= 4 bytes).
        pending = len(self.ids) - self.read_offset
        if len(after) > len(before) and (not after.endswith("\ufffd") or pending >= 4):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return after[len(before) :] if len(after) > len(before) else ""


class StopState:
    """Accumulates generated tokens and text; `push` returns a finish reason once a stop rule fires."""

    def __init__(self, tokenizer: Any, eos_ids: Sequence[int], max_new_tokens: int, stop: Sequence[str]) -> None:
        self.eos = frozenset(eos_ids)
        self.max_new = max_new_tokens
        self.stop = tuple(stop)
        self.hold = max((len(s) for s in self.stop), default=1) - 1  # chars that may start a stop string
        self.detok = IncrementalText(tokenizer)
        self.token_ids: list[int] = []
        self.text = ""
        self.emitted = 0  # chars of `text` already handed out by `take_text`
        self.finish_reason: str | None = None

    def push(self, token: int) -> str | None:
        assert self.finish_reason is None, "push after stop"
        self.token_ids.append(token)
        if token in self.eos:
            self.finish_reason = "stop"
        else:
            start = max(0, len(self.text) - self.hold)
            self.text += self.detok.add(token)
            for s in self.stop:
                at = self.text.find(s, start)
                if at >= 0:
                    self.text = self.text[:at]
                    self.finish_reason = "stop"
                    break
        if self.finish_reason is None and len(self.token_ids) >= self.max_new:
            self.finish_reason = "length"
        if self.finish_reason == "length":
            self.text += self.detok.flush()
        return self.finish_reason

    def take_text(self) -> str:
        """New text safe to show: all of it once finished, else all but a possible stop-string start."""
        end = len(self.text) if self.finish_reason else max(self.emitted, len(self.text) - self.hold)
        chunk = self.text[self.emitted : end]
        self.emitted = end
        return chunk
