"""Key views (engine/attention.py): rows off a tree's first chain, recomputed over their keys gathered
into position order, equal the same tokens' rows laid out as a gap-free chain, bit for bit.

Float64 on random tensors checks the mechanism (which keys, which rows, which sequence, the padding of
views to a common size), to float64 rounding: at these toy sizes the float64 kernels themselves sum
differently for different numbers of rows. Whether a model's rows come out bit-identical is the
device's business, measured per model by the width probe (`tree_exact`) and checked end to end on
bfloat16 models (tests/engine/test_numerics.py, tests/test_real_model_bf16.py)."""

from __future__ import annotations

import pytest
import torch

from lookahead.engine.attention import KeyView, exact_attention, exact_passes

H, HKV, D = 4, 2, 8  # two query heads per key/value head (grouped-query attention)
MIN = torch.finfo(torch.float64).min


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
           views: list[KeyView] = ()) -> torch.Tensor:
    """q [B, H, Q, D], k/v [B, HKV, K, D], visible [B, Q, K] bool -> [B, Q, H, D]. Keys are zero-padded
    to a multiple of 64 (masked), as the engine's cache hands them to the model."""
    pad = -k.shape[2] % 64
    k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (k, v))
    visible = torch.nn.functional.pad(visible, (0, pad))
    mask = torch.zeros(visible.shape, dtype=torch.float64).masked_fill_(~visible, MIN)[:, None]
    with exact_passes(views):
        return exact_attention(None, q, k, v, mask)[0]


def test_a_branch_row_in_its_view_equals_the_row_in_a_chain() -> None:
    gen = torch.Generator().manual_seed(0)
    p = 70  # cached keys 0..69 (past one 64-key block), then the step: root, first chain a b, branch c d
    tree_keys = torch.randn(1, HKV, p + 5, D, generator=gen, dtype=torch.float64)
    tree_vals = torch.randn(1, HKV, p + 5, D, generator=gen, dtype=torch.float64)
    queries = torch.randn(1, H, 5, D, generator=gen, dtype=torch.float64)  # rows: root a b c d
    # visibility in the tree layout (keys: prefix, root, a, b, c, d)
    seen = {0: [], 1: [1], 2: [1, 2], 3: [3], 4: [3, 4]}  # step rows each row sees besides the root
    visible = torch.zeros(1, 5, p + 5, dtype=torch.bool)
    for row, others in seen.items():
        visible[0, row, : p + 1] = True
        visible[0, row, [p + o for o in others]] = True
    views = [KeyView(0, torch.tensor([3, 4]), torch.cat([torch.arange(p + 1), torch.tensor([p + 3, p + 4])]))]
    tree = attend(queries, tree_keys, tree_vals, visible, views)

    # the same tokens decoded as a chain root c d: keys prefix, root, c, d; causal
    order = torch.cat([torch.arange(p + 1), torch.tensor([p + 3, p + 4])])
    chain_visible = torch.ones(1, 3, p + 3, dtype=torch.bool)
    chain_visible[0, 0, p + 1 :] = False
    chain_visible[0, 1, p + 2 :] = False
    chain = attend(queries[:, :, [0, 3, 4]], tree_keys[:, :, order], tree_vals[:, :, order], chain_visible)
    torch.testing.assert_close(tree[0, 3:], chain[0, 1:], rtol=0, atol=1e-12)
    # the views change nothing else: rows root, a, b are what the tree pass gives without views
    plain = attend(queries, tree_keys, tree_vals, visible)
    assert torch.equal(tree[0, :3], plain[0, :3])
    # In float64 the gap costs only rounding, so a pass that ignored the view would pass the first
    # check too. A view that leaves out cached key 0 shows that the view's keys are what rows c, d read.
    partial = [KeyView(0, torch.tensor([3, 4]), torch.cat([torch.arange(1, p + 1), torch.tensor([p + 3, p + 4])]))]
    without_key0 = attend(queries, tree_keys, tree_vals, visible, partial)
    assert (without_key0[0, 3:] - tree[0, 3:]).abs().max() > 1e-6
    assert torch.equal(without_key0[0, :3], plain[0, :3])


def test_views_of_several_sequences_and_sizes_in_one_pass() -> None:
    # Two sequences of a batch (their own prefixes, 10 and 66 keys), three views of different sizes:
    # sequence 1 has two (rows [2] and rows [3, 4]), sequence 0 one (row [1]). Each view row must equal
    # that row in a chain pass of its path over the view's keys as a gap-free run.
    gen = torch.Generator().manual_seed(1)
    q_rows, keys = 5, 80
    q = torch.randn(2, H, q_rows, D, generator=gen, dtype=torch.float64)
    k = torch.randn(2, HKV, keys, D, generator=gen, dtype=torch.float64)
    v = torch.randn(2, HKV, keys, D, generator=gen, dtype=torch.float64)
    lengths = (10, 66)
    layouts = [(0, [1], [0, 1]), (1, [2], [0, 2]), (1, [3, 4], [0, 1, 3, 4])]  # (seq, rows, step keys of the path)
    views, visible = [], torch.zeros(2, q_rows, keys, dtype=torch.bool)
    for seq in (0, 1):
        visible[seq, :, : lengths[seq] + 1] = True  # everyone sees the prefix and the root
    for seq, rows, path in layouts:
        order = torch.cat([torch.arange(lengths[seq]), lengths[seq] + torch.tensor(path)])
        views.append(KeyView(seq, torch.tensor(rows), order))
        for row in rows:  # a row sees its path up to itself
            visible[seq, row, lengths[seq] + torch.tensor(path[: path.index(row) + 1])] = True
    out = attend(q, k, v, visible, views)
    for (seq, rows, path), view in zip(layouts, views):
        # the path's tokens decoded as a chain (root first): keys = the view's, causal
        n = view.keys.numel()
        chain_visible = torch.ones(1, len(path), n, dtype=torch.bool).tril_(lengths[seq])
        chain = attend(q[seq : seq + 1, :, path], k[seq : seq + 1, :, view.keys], v[seq : seq + 1, :, view.keys],
                       chain_visible)
        for row in rows:
            torch.testing.assert_close(out[seq, row], chain[0, path.index(row)], rtol=0, atol=1e-12)


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_a_rows_weighted_sum_does_not_depend_on_keys_past_1024(rows: int) -> None:
    # Measured on SmolLM2 bf16 (9 query heads, 3 key/value heads, 64 dims): one matmul over more than
    # 1024 keys sums them in another order, so a row whose keys end before 1024 differed between a pass
    # of 1024 keys and one of 1088 (2 rows: this test failed before the fix), and a summarization
    # prompt near 1024 tokens decoded differently with prompt lookup. Values are now summed in fixed
    # chunks (this device's `key_chunk`, or the narrowest): the same rows over the same keys, with 64 or
    # 128 more masked (zero) keys after them, come out bit-identical.
    from lookahead.engine.value_sums import KEY_CHUNK, key_chunk

    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 9, rows, 64, generator=gen).to(torch.bfloat16)
    k = torch.randn(1, 3, 1152, 64, generator=gen).to(torch.bfloat16)
    v = torch.randn(1, 3, 1152, 64, generator=gen).to(torch.bfloat16)
    outs = []
    for chunk in sorted({KEY_CHUNK, key_chunk(torch.bfloat16, 3, 3, 64)}):
        outs = []
        for width in (1024, 1088, 1152):
            visible = torch.zeros(1, rows, width, dtype=torch.bool)
            visible[0, :, :1000] = True  # every row sees keys 0..999; the rest is masked padding
            mask = torch.zeros(visible.shape, dtype=torch.bfloat16).masked_fill_(~visible, torch.finfo(torch.bfloat16).min)
            with exact_passes((), chunk):
                outs.append(exact_attention(None, q, k[:, :, :width], v[:, :, :width], mask[:, None])[0])
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), chunk


@pytest.mark.parametrize("heads,dims", [((9, 3), 64), ((4, 1), 256)])
def test_a_rows_weighted_sum_does_not_depend_on_how_many_rows_share_the_matmul(heads: tuple[int, int],
                                                                             dims: int) -> None:
    # Measured on a Xeon with AMX (bfloat16, 2 threads): one matmul of probabilities and values over
    # 512-1088 keys reduced the keys in another order when it had 33-48 rows (query rows x grouped
    # heads) than with 3, so a 16-row lookahead step gave other logits than autoregressive decoding
    # (this test failed there at 1024 keys with 11-16 query rows before the fix). Chunks of KEY_CHUNK
    # keys, one batched matmul, take every row count the same way: each query row of a pass of
    # 1..20 rows comes out as it does alone, bit for bit, at any key count. `key_chunk` measures how
    # wide a chunk this device takes so (1024 on Zen 4; it must pick 256 where wider ones differ): its
    # pick is checked here on other keys, rows and values than it measured.
    from lookahead.engine.value_sums import KEY_CHUNK, key_chunk

    assert KEY_CHUNK <= 384  # longer chunks were not row-invariant there: the default stays narrow
    gen = torch.Generator().manual_seed(3)
    h, kv = heads
    chunk = key_chunk(torch.bfloat16, kv, h // kv, dims)
    q = torch.randn(1, h, 20, dims, generator=gen).to(torch.bfloat16)
    for keys in (512, 1024, 1088):
        k = torch.randn(1, kv, keys, dims, generator=gen).to(torch.bfloat16)
        v = torch.randn(1, kv, keys, dims, generator=gen).to(torch.bfloat16)
        mask = torch.zeros(1, 1, 20, keys)
        with exact_passes((), chunk):
            alone = [exact_attention(None, q[:, :, r : r + 1], k, v, mask[:, :, r : r + 1])[0] for r in range(20)]
            for rows in (2, 5, 11, 13, 16, 17, 20):
                out = exact_attention(None, q[:, :, :rows], k, v, mask[:, :, :rows])[0]  # [1, Q, H, D]
                for r in range(rows):
                    assert torch.equal(out[:, r : r + 1], alone[r]), (keys, rows, r)
