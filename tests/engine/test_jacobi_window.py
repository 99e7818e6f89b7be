"""The Jacobi window's shape (offsets, visibility among its tokens, output rows) and its n-grams,
with the expected answers written out, and the README's step diagram checked against the code.

Rows and columns are the window's tokens in row-major (level, column) order: L0c0 L0c1 ... L1c0 ...
"1" means the row's token sees the column's token, "." that it does not. Every window token also
sees the cached prefix and the root; that part is not in this matrix.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lookahead.candidates.lookahead import JacobiWindow
from lookahead.engine.draft import CandidateTree

README = Path(__file__).resolve().parents[2] / "README.md"


def rows(matrix: torch.Tensor) -> list[str]:
    return ["".join("1" if v else "." for v in row.tolist()) for row in matrix]


def test_one_level_is_a_causal_block() -> None:
    # The first step: only level 0 (W=3). Token i guesses p+1+i and sees level-0 columns 0..i.
    offsets, visible, out_rows = JacobiWindow(3, 4, [7])._shape(1)
    assert offsets.tolist() == [1, 2, 3]
    assert rows(visible) == ["1..", "11.", "111"]
    assert out_rows.tolist() == [0, 1, 2]  # all of level 0 is the newest level


def test_two_levels_w3_as_in_the_readme() -> None:
    offsets, visible, out_rows = JacobiWindow(3, 3, [7])._shape(2)
    assert offsets.tolist() == [1, 2, 3, 2, 3, 4]  # (l, i) guesses p + 1 + l + i
    assert rows(visible) == [
        # L0c0 L0c1 L0c2 L1c0 L1c1 L1c2
        "1.....",  # L0c0
        "11....",  # L0c1
        "111...",  # L0c2
        "1..1..",  # L1c0: level-0 column 0, then column 0 up to level 1
        "11..1.",  # L1c1: level-0 columns 0..1, then itself (column 1 at level 1)
        "111..1",  # L1c2
    ]
    assert out_rows.tolist() == [3, 4, 5]  # level 1's outputs are the next iterate


def test_three_levels_w2_the_default_shape() -> None:
    # W=2, N=4: up to 3 levels. Column 1 at level 2 sees L0c0, L0c1 (level 0 up to its column), then
    # L1c1 and itself: positions p+1, p+2, p+3, p+4, one Jacobi trajectory.
    offsets, visible, out_rows = JacobiWindow(2, 4, [7])._shape(3)
    assert offsets.tolist() == [1, 2, 2, 3, 3, 4]
    assert rows(visible) == [
        # L0c0 L0c1 L1c0 L1c1 L2c0 L2c1
        "1.....",
        "11....",
        "1.1...",
        "11.1..",
        "1.1.1.",
        "11.1.1",
    ]
    assert out_rows.tolist() == [4, 5]


@pytest.mark.parametrize("w", [1, 2, 3, 5])
@pytest.mark.parametrize("levels", [1, 2, 3, 4])
def test_every_row_sees_exactly_one_contiguous_trajectory(w: int, levels: int) -> None:
    # The invariant behind the tables: the tokens a row sees (plus the root at offset 0) are at
    # offsets 0, 1, ..., its own offset, each exactly once; so attention reads a plain sequence.
    offsets, visible, _ = JacobiWindow(w, levels + 1, [7])._shape(levels)
    for r in range(len(offsets)):
        seen = sorted(offsets[visible[r]].tolist())
        assert seen == list(range(1, int(offsets[r]) + 1)), (r, seen)


def test_advance_mints_one_ngram_per_column_when_the_window_is_full() -> None:
    # W=2, N=3: level 0 is seeded (all 7 here); each step's outputs become the newest level.
    win = JacobiWindow(2, 3, [7])
    assert win.levels == [[7, 7]]
    assert win.branch().tokens.tolist() == [7, 7]
    assert win.advance([10, 11]) == []  # 2 levels < N: no n-gram yet
    assert win.branch().tokens.tolist() == [7, 7, 10, 11]  # row-major (level, column)
    # 3 levels = N: column i gives (level0[i], (level1[i], out[i])) and level 0 is dropped
    assert win.advance([20, 21]) == [(7, (10, 20)), (7, (11, 21))]
    assert win.levels == [[10, 11], [20, 21]]
    assert win.advance([30, 31]) == [(10, (20, 30)), (11, (21, 31))]
    assert win.levels == [[20, 21], [30, 31]]


def test_the_branch_is_kept_while_the_window_does_not_run_and_rebuilt_when_it_does() -> None:
    # Offered every step, run in few: steps that skip it leave the levels alone, so the same rows return;
    # a step that runs it moves the levels, and the next branch carries the new ones.
    win = JacobiWindow(2, 3, [7])
    first = win.branch()
    assert win.branch() is first
    win.advance([10, 11])
    second = win.branch()
    assert second is not first and second.tokens.tolist() == [7, 7, 10, 11] and first.tokens.tolist() == [7, 7]
    assert second.out_rows.tolist() == [2, 3]


# -- the README's diagram ----------------------------------------------------------------------------

def readme_diagram() -> tuple[list[str], dict[str, tuple[str, str]]]:
    """The step diagram in README.md: key names, and per query row (position, marks as '1'/'.')."""
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("keys:"))
    keys = lines[start].split("keys:")[1].split()
    table: dict[str, tuple[str, str]] = {}
    for line in lines[start + 2 :]:
        parts = line.split()
        if not parts or parts[0].startswith("`"):
            break
        name, pos, marks = parts[0], parts[1], parts[2 : 2 + len(keys)]
        assert set(marks) <= {"■", "·"}, line
        table[name] = (pos, "".join("1" if m == "■" else "." for m in marks))
    return keys, table


def test_readme_diagram_matches_the_window_and_the_trie() -> None:
    keys, table = readme_diagram()
    assert keys == ["L0c0", "L0c1", "L0c2", "root", "L1c0", "L1c1", "L1c2", "a", "b", "c"]
    col = {k: i for i, k in enumerate(keys)}
    # The lookahead branch (W=3, two levels): the code's matrix, offsets and the root column.
    window = ["L0c0", "L0c1", "L0c2", "L1c0", "L1c1", "L1c2"]
    offsets, visible, _ = JacobiWindow(3, 3, [7])._shape(2)
    assert [table[n][0] for n in window] == [f"p+{o}" for o in offsets.tolist()]
    assert rows(visible) == ["".join(table[n][1][col[k]] for k in window) for n in window]
    assert all(table[n][1][col["root"]] == "1" for n in window)  # every window token sees the root
    # The trie root->a->b, root->a->c: the code's ancestor matrix; each node also sees the root.
    tree = CandidateTree()
    tree.add([1, 2])  # a b
    tree.add([1, 3])  # a c
    trie = ["a", "b", "c"]
    assert [table[n][0] for n in trie] == [f"p+{d}" for d in tree.depths]
    assert rows(tree.ancestors_matrix()) == ["".join(table[n][1][col[k]] for k in trie) for n in trie]
    assert all(table[n][1][col["root"]] == "1" for n in trie)
    # The branches never see each other, and the root sees only itself.
    assert all(table[n][1][col[k]] == "." for n in window for k in trie)
    assert all(table[n][1][col[k]] == "." for n in trie for k in window)
    assert table["root"] == ("p", "".join("1" if k == "root" else "." for k in keys))
