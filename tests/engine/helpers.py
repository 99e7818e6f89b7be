"""Shared helpers for engine tests: cached tiny float64 models and a transformers reference."""

from __future__ import annotations

import functools

import pytest

import torch

from lookahead.models import LoadedModel
from lookahead.testing import tiny_model


@functools.lru_cache(maxsize=None)
def model64(arch: str) -> LoadedModel:
    return tiny_model(arch, dtype=torch.float64, seed=0)


def hf_greedy(loaded: LoadedModel, prompt_ids: list[int], max_new_tokens: int, eos: tuple[int, ...] | None = None) -> list[int]:
    """transformers' own generate(do_sample=False): the reference every strategy must match."""
    ids = torch.tensor([prompt_ids])
    eos_ids = list(loaded.eos_token_ids if eos is None else eos)
    out = loaded.model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
        eos_token_id=eos_ids or None, pad_token_id=0,
    )
    return out[0, ids.shape[1]:].tolist()


def prompts(n: int) -> list[str]:
    """n varied prompts: repetitive ones (where guesses hit), plain text, code, numbers."""
    base = [
        "hello hello hello", "abcabcabcabc", "def f(x):\n    return x\ndef g(x):\n    return",
        "1, 2, 3, 4, 5, 6, 7, 8,", "The quick brown fox jumps over the lazy dog. The quick",
        "{\"a\": 1, \"b\": 2, \"c\":", "one two three one two three one", "zzzzzzzz", "Q: why? A:",
        "lorem ipsum dolor sit amet", "<tag><tag><tag>", "x", "a b a b a b a b", "SELECT * FROM t WHERE",
        "for i in range(10):\n    print(i)\nfor i in range(10):\n", "Once upon a time", "ha" * 12,
        "3.14159 2.71828 3.14159", "Dear Sir, Dear Sir, Dear", "[1, [2, [3, [4,", "END END",
        "mississippi mississippi", "tick tock tick tock",
    ]
    return base[:n]


def spy_key_views(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gains an entry each time a layer recomputes rows over key views (engine/attention.py):
    tests assert it is non-empty to show that trees with branches were really verified."""
    from lookahead.engine import attention

    calls: list[int] = []
    redo = attention._redo_in_views
    monkeypatch.setattr(attention, "_redo_in_views", lambda *a: (calls.append(1), redo(*a)))
    return calls


def spy_branches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gains an entry (the tree's node count) each time a step verifies a tree with a node off
    its first chain, however the pass lays it out (gap-free, key views or aligned offsets): tests assert
    it is non-empty to show that branches were really verified."""
    from lookahead.engine import step

    calls: list[int] = []
    build = step.build_query

    def spy(root, p, tree, *args, **kwargs):  # type: ignore[no-untyped-def]
        if len(tree) > len(tree.first_chain()):
            calls.append(len(tree))
        return build(root, p, tree, *args, **kwargs)

    monkeypatch.setattr(step, "build_query", spy)
    return calls


def kernel_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact bfloat16 passes on the matmul path (as LOOKAHEAD_EXACT_KERNEL=0 gives; load models after it):
    torch's softmax, so branches need key views or aligned offsets there."""
    from lookahead.engine import exact_kernel

    monkeypatch.setattr(exact_kernel, "_built", {"module": None, "why": "off (a test)"})


def spy_aligned_branches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that gains "gap" each time a pass writes keys at aligned offsets with a gap (a tree branch
    off the first chain, engine/query.py align_tree), "in order" when a pass places keys exactly where
    they would go anyway (wasted indexed copies: the runner should write those as a block): tests assert
    "gap" in it to show that such branches were really verified."""
    from lookahead.engine.kvcache import KVCache

    calls: list[str] = []
    place = KVCache.place

    def spy(self: KVCache, offsets: list[torch.Tensor] | None) -> None:
        if offsets is not None:
            gap = any(int(o.max()) + 1 > o.numel() for o in offsets)
            in_order = all(torch.equal(o, torch.arange(o.numel())) for o in offsets)
            calls.append("gap" if gap else "in order" if in_order else "permuted")
        place(self, offsets)

    monkeypatch.setattr(KVCache, "place", spy)
    return calls


class WidthDependent(torch.nn.Module):
    """Adds `scale` to every hidden state when the pass has fewer than `below` rows or more than `above`
    (or always a width-dependent amount when below is None): a planted kernel that is not width-invariant."""

    def __init__(self, below: int | None, scale: float, total: bool = False, above: int | None = None) -> None:
        super().__init__()
        self.below, self.scale, self.total, self.above = below, scale, total, above
        self.widest = 0  # the most rows a pass had

    def hook(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        # rows of one sequence, or (total) of the whole pass, as a matmul kernel choosing by M would see
        rows = output.shape[1] * (output.shape[0] if self.total else 1)
        self.widest = max(self.widest, rows)
        if self.below is None:
            return output + self.scale * rows
        if self.above is not None and rows > self.above:
            return output + self.scale
        return output + self.scale if rows < self.below else output
