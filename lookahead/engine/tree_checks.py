"""The width probe's tree checks (engine/numerics.py): do a candidate tree's rows come out as decoding
each node's path one token at a time gives them, with other branches' keys masked between a row's own
keys (gaps), over key views, or with the keys at aligned offsets (engine/query.py align_tree)? Each
check runs real passes through the engine's model runner and compares logits bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from lookahead.engine.attention import model_key_layout
from lookahead.engine.draft import CandidateTree
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import ModelRunner, Rows
from lookahead.engine.query import align_tree, build_query


def gap_invariant(runner: ModelRunner, cache: KVCache, tokens: torch.Tensor, width: int) -> bool:
    """Do a chain's rows keep their logits when other branches' keys sit (masked) between the root and
    the chain? Compares root + 3-token chain laid out contiguously with the same chain after g rows of
    another branch, every pass `width` rows wide."""
    p = cache.get_seq_length()
    outs = []
    for g in (0, 1, 3, 4, 7, 8):
        if 4 + g > width:
            break
        toks = tokens[:width].clone()
        pos = torch.full((width,), p, dtype=torch.long)
        local = torch.eye(width, dtype=torch.bool)
        local[:, 0] = True
        branch = list(range(1, 1 + g))  # another branch: root -> b1 -> ... -> bg
        chain = list(range(1 + g, 4 + g))  # root -> c1 -> c2 -> c3
        for path in (branch, chain):
            for depth, row in enumerate(path, start=1):
                pos[row] = p + depth
                local[row, path[:depth]] = True
        toks[chain] = tokens[-3:]
        logits = runner.forward(cache, toks, pos, local, torch.tensor([0, *chain]))
        cache.crop(-width)
        outs.append(logits.float())
    return all(torch.equal(o, outs[0]) for o in outs[1:])


def reduces_keys_in_small_blocks(model: Any) -> bool:
    """Does this device's bfloat16 matmul sum keys in blocks too small for aligned trees? On a Xeon with
    AMX (amx_bf16), tests/test_real_model_bf16.py found a node placed 33 keys from its autoregressive
    key (same index mod KEY_PERIOD, same KEY_BLOCK) with other logits, 1 node in ~40; with nodes kept
    in the same 32-key block every node agreed, but hardly any branch could then be placed. The
    probe's own tree checks passed there (the miss is rare), so the verdict is taken from the CPU. The
    tiny test models (lookahead.testing) go by the probe's checks alone: their tests verify aligned
    trees against autoregressive decoding token for token."""
    from lookahead.models.dtypes import cpu_flags

    if getattr(model, "_lookahead_probe_trees_only", False):
        return False
    return next(model.parameters()).dtype == torch.bfloat16 and "amx_bf16" in cpu_flags()


def random_trees_exact(runner: ModelRunner, cache: KVCache, tokens: torch.Tensor, width: int, seed: int,
                        trees: int = 6) -> bool:
    """Do random aligned trees (five guesses of 1-5 tokens over a 5-token vocabulary: shared prefixes,
    branches, keys placed up to dozens of keys away) give every node what decoding its path one token at
    a time gives it? `tree_exact`'s fixed shapes missed a kernel that reduces keys in blocks of 32 (a
    Xeon with AMX, bfloat16): a node placed in another 32-key block than its autoregressive key came
    out different there."""
    rng = torch.Generator().manual_seed(seed)
    p = cache.get_seq_length()
    for _ in range(trees):
        vocab = tokens[torch.randperm(tokens.numel(), generator=rng)[:5]].tolist()
        tree = CandidateTree()
        for _ in range(5):
            depth = int(torch.randint(1, 6, (1,), generator=rng))
            tree.add([vocab[int(i)] for i in torch.randint(0, 5, (depth,), generator=rng)])
        tree, offsets = _align(runner, tree, p)
        query = build_query(vocab[0], p, tree, None, offsets=offsets)
        if query.width > width:  # rows past `width` could meet a ceiling: not this check's business
            continue
        out = runner.forward_batch(cache, [Rows(query.tokens, query.positions, query.local, query.keep, (),
                                                query.offsets)], width)[0]
        cache.crop(p - cache.get_seq_length())
        for node in range(len(tree)):
            path = [node]
            while tree.parents[path[-1]] >= 0:
                path.append(tree.parents[path[-1]])
            chain = [vocab[0]] + [tree.tokens[n] for n in reversed(path)]
            ref = None
            for j, token in enumerate(chain):  # one token a pass, as autoregressive decoding runs (same width)
                ref = runner.forward(cache, torch.tensor([token]), torch.tensor([p + j]),
                                     torch.ones(1, 1, dtype=torch.bool), torch.tensor([0]), width=width)
            cache.crop(-len(chain))
            if not torch.equal(ref[0], out[1 + node]):  # type: ignore[index]
                return False
    return True


def _align(runner: ModelRunner, tree: CandidateTree, p: int) -> tuple[CandidateTree, list[int]]:
    """`tree` laid out at aligned offsets by the rules of `runner`'s model (engine/attention.py KeyLayout)."""
    layout = model_key_layout(runner.model)
    return align_tree(tree, p, layout.period, layout.block, layout.pairs)


def tree_exact(runner: ModelRunner, cache: KVCache, tokens: torch.Tensor, width: int, aligned: bool = False) -> bool:
    """Do a branch's rows, computed in key views (`aligned`: with their keys at aligned offsets), come
    out as the same tokens do as the tree's first chain? A 3-token chain c after the root, first; then
    as a branch off the root behind a first chain of g tokens; then nested, off a second branch that
    shares its first token. Every pass `width` rows. Aligned offsets are checked with the root at an
    even and at an odd position (a branch may start only at an even one, engine/query.py align_tree),
    and with the chain off the root and off a first node."""
    root, chain, other = int(tokens[0]), tokens[-3:].tolist(), tokens[1:10].tolist()

    def rows_of(tree: CandidateTree, path: list[int]) -> torch.Tensor:
        p = cache.get_seq_length()
        offsets = None
        if aligned:
            tree, offsets = _align(runner, tree, p)
        query = build_query(root, p, tree, None, views=not aligned, offsets=offsets)
        logits = runner.forward_batch(cache, [Rows(query.tokens, query.positions, query.local, query.keep,
                                                   query.views, query.offsets)], width)[0]
        cache.crop(p - cache.get_seq_length())
        node, nodes = -1, []
        for token in path:
            node = tree.children.get((node, token), -1)
            if node < 0:
                return logits[:0].float()  # left out by the aligned layout: nothing to compare
            nodes.append(1 + node)
        return logits[nodes].float()

    def tree_of(*continuations: list[int]) -> CandidateTree:
        tree = CandidateTree()
        for c in continuations:
            tree.add(c)
        return tree

    def exact_here() -> tuple[bool, int]:
        compared, ok = 0, True
        for lead in ([], [other[0]]) if aligned else ([],):
            path = lead + chain
            ref = rows_of(tree_of(path), path)
            shapes = [tree_of(lead + other[1 : 1 + g], path) for g in (1, 3, 4, 7, 8) if 4 + len(lead) + g <= width]
            if width >= 8:  # c shares its first node with a branch
                shapes.append(tree_of(lead + other[1:4], lead + [chain[0], *other[4:6]], path))
            for tree in shapes:
                out = rows_of(tree, path)
                compared += out.numel() > 0
                ok = ok and (not out.numel() or torch.equal(out, ref))
        return ok, compared

    ok, compared = exact_here()
    if aligned:  # and with the root one position on
        runner.prefill(cache, [root])
        ok2, compared2 = exact_here()
        cache.crop(-1)
        ok, compared = ok and ok2, compared + compared2
    return ok and compared > 0
