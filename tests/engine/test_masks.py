"""MaskBuilder, table by table: which cached and new keys each query token may see.

A mask is written out as one string per query row: "1" the key is visible (additive 0), "." it is
masked (the dtype's minimum). Key columns are the `prefix` cached keys (positions 0..prefix-1), then
the query tokens themselves, in query order.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig
from transformers.masking_utils import (
    causal_mask_function,
    create_sliding_window_causal_mask,
    eager_mask,
    sliding_window_causal_mask_function,
)

from lookahead.engine.masks import MaskBuilder

SMALL = dict(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2)


def rows(mask: torch.Tensor) -> list[str]:
    """[1, 1, Q, K] additive mask -> Q strings; checks every entry is exactly 0 or the dtype's min."""
    assert mask.dim() == 4 and mask.shape[:2] == (1, 1)
    m = mask[0, 0]
    low = torch.finfo(m.dtype).min
    assert bool(((m == 0) | (m == low)).all()), "entries must be 0 or the dtype's minimum"
    return ["".join("1" if v == 0 else "." for v in row.tolist()) for row in m]


def local(*lines: str) -> torch.Tensor:
    """The local visibility matrix among query tokens, written like the expected rows."""
    return torch.tensor([[c == "1" for c in line] for line in lines])


def tril(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def test_full_attention_prefix_plus_causal_block() -> None:
    mb = MaskBuilder(AutoConfig.for_model("llama", **SMALL), torch.float32)
    assert not mb.as_dict
    mask = mb.build(2, torch.tensor([2, 3, 4]), tril(3))
    assert mask.shape == (1, 1, 3, 5) and mask.dtype == torch.float32
    assert rows(mask) == [
        # keys: 0 1 | 2 3 4
        "111..",  # position 2 sees the prefix and itself
        "1111.",
        "11111",
    ]


def test_tree_rows_see_the_prefix_the_root_and_their_own_branch() -> None:
    # The README's verification trie: root (position p=3), a (p+1), then b and c, both children of a
    # at p+2. Siblings b and c must not see each other; every row sees the whole cached prefix.
    mb = MaskBuilder(AutoConfig.for_model("llama", **SMALL), torch.float64)
    vis = local(
        # root a b c
        "1...",  # root
        "11..",  # a
        "111.",  # b: root a b
        "11.1",  # c: root a c (not b)
    )
    mask = mb.build(3, torch.tensor([3, 4, 5, 5]), vis)
    assert rows(mask) == [
        # keys: 0 1 2 | root a b c
        "111" "1...",
        "111" "11..",
        "111" "111.",
        "111" "11.1",
    ]


def test_keys_at_aligned_offsets_leave_masked_gaps() -> None:
    # The same trie laid out at offsets [0, 1, 2, 5] (engine/query.py align_tree): keys 2..4 after the
    # prefix hold b, then two free slots, then c. Free slots are masked for every row; each row sees its
    # own keys in their columns; the width pads to 10 keys.
    mb = MaskBuilder(AutoConfig.for_model("llama", **SMALL), torch.float64)
    vis = local("1...", "11..", "111.", "11.1")
    mask = mb.build(3, torch.tensor([3, 4, 5, 5]), vis, width=10, offsets=torch.tensor([0, 1, 2, 5]))
    assert rows(mask) == [
        # keys: 0 1 2 | root a b _ _ c | pad
        "111" "1....." ".",
        "111" "11...." ".",
        "111" "111..." ".",
        "111" "11...1" ".",
    ]


def test_no_prefix_and_an_empty_local_row() -> None:
    # With nothing cached the mask is the local matrix itself; a row may see nothing at all (the
    # builder does not add the diagonal on its own).
    mb = MaskBuilder(AutoConfig.for_model("llama", **SMALL), torch.float32)
    assert rows(mb.build(0, torch.tensor([0, 1]), local("1.", "..")))  == ["1.", ".."]


def test_sliding_window_counts_positions_not_columns() -> None:
    # Mistral-style: one window (3) for every layer. A key is visible when query_pos - key_pos < 3.
    mb = MaskBuilder(AutoConfig.for_model("mistral", sliding_window=3, **SMALL), torch.float32)
    assert not mb.as_dict and mb.kinds == {"full_attention": 3}
    # prefix 0..3, then root (4) and two sibling guesses x, y at position 5
    vis = local("1..", "11.", "1.1")
    assert rows(mb.build(4, torch.tensor([4, 5, 5]), vis)) == [
        # keys: 0 1 2 3 | root x y
        "..11" "1..",  # 4 sees 2, 3, 4
        "...1" "11.",  # x (5) sees 3, 4, 5: key 2 is 3 positions back, out of the window
        "...1" "1.1",  # y (5) likewise, and not its sibling x
    ]


def test_window_also_applies_between_new_tokens() -> None:
    # Window 2 and a causal block of 4 new tokens after 1 cached key: the new tokens drop out of each
    # other's window too (this is the part a sliding-window KV cache would not do for us).
    mb = MaskBuilder(AutoConfig.for_model("mistral", sliding_window=2, **SMALL), torch.float32)
    assert rows(mb.build(1, torch.tensor([1, 2, 3, 4]), tril(4))) == [
        # keys: 0 | 1 2 3 4
        "1" "1...",
        "." "11..",
        "." ".11.",
        "." "..11",
    ]


def test_mixed_layer_types_get_one_mask_each() -> None:
    # Gemma 3 style: sliding layers (window 2) and full layers; the model takes {layer_type: mask}.
    cfg = AutoConfig.for_model("gemma3_text", sliding_window=2, layer_types=["sliding_attention", "full_attention"],
                               head_dim=4, **SMALL)
    mb = MaskBuilder(cfg, torch.float32)
    masks = mb.build(2, torch.tensor([2, 3]), tril(2))
    assert isinstance(masks, dict) and set(masks) == {"sliding_attention", "full_attention"}
    assert rows(masks["sliding_attention"]) == [
        # keys: 0 1 | 2 3
        ".1" "1.",
        ".." "11",
    ]
    assert rows(masks["full_attention"]) == [
        "11" "1.",
        "11" "11",
    ]


def test_layer_types_all_full_ignore_a_configured_window() -> None:
    # Qwen2 with use_sliding_window=False lists every layer as full attention: no window anywhere.
    cfg = AutoConfig.for_model("qwen2", sliding_window=1, use_sliding_window=False, **SMALL)
    mb = MaskBuilder(cfg, torch.float32)
    assert mb.as_dict and mb.kinds == {"full_attention": None}
    assert rows(mb.build(3, torch.tensor([3]), tril(1))["full_attention"]) == ["1111"]


def test_unknown_layer_type_is_refused() -> None:
    cfg = AutoConfig.for_model("llama", **SMALL)
    cfg.layer_types = ["full_attention", "chunked_attention"]
    with pytest.raises(NotImplementedError, match="chunked_attention"):
        MaskBuilder(cfg, torch.float32)


# -- against transformers' own masks, for the plain causal case -----------------------------------------

@pytest.mark.parametrize("window", [1, 2, 3, 8])
def test_sliding_window_equals_transformers_own_mask(window: int) -> None:
    # The model's own builder (eager attention: an additive float mask) for a plain causal prefill.
    cfg = AutoConfig.for_model("mistral", sliding_window=window, **SMALL)
    cfg._attn_implementation = "eager"
    n = 7
    theirs = create_sliding_window_causal_mask(
        cfg, torch.zeros(1, n, 8, dtype=torch.float64), None, None, position_ids=torch.arange(n)[None]
    )
    ours = MaskBuilder(cfg, torch.float64).build(0, torch.arange(n), tril(n))
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("prefix", [0, 2, 5, 9])
@pytest.mark.parametrize("window", [2, 3])
def test_decoding_after_a_prefix_equals_transformers_masks(prefix: int, window: int) -> None:
    # q new tokens after `prefix` cached ones: transformers' mask functions with the query offset.
    q = 4
    cfg = AutoConfig.for_model("gemma3_text", sliding_window=window, head_dim=4,
                               layer_types=["sliding_attention", "full_attention"], **SMALL)
    ours = MaskBuilder(cfg, torch.float64).build(prefix, torch.arange(prefix, prefix + q), tril(q))
    assert isinstance(ours, dict)
    for kind, fn in (("sliding_attention", sliding_window_causal_mask_function(window)),
                     ("full_attention", causal_mask_function)):
        theirs = eager_mask(1, q, prefix + q, q_offset=prefix, mask_function=fn, dtype=torch.float64)
        assert torch.equal(ours[kind], theirs), kind
