"""Linear layers with their weights packed once for the CPU matmul library.

A decode pass is a few rows against every weight of the model. PyTorch's CPU linear for bfloat16 hands
oneDNN the weight in its plain layout, and oneDNN reorders it into its blocked layout on every call: a
full extra pass over the weights. Measured on SmolLM2-135M (bfloat16, 2 Zen 4 cores, 210 linear
layers, weights cold): 29-47 ms for 1-16 rows plain, 17-26 ms with the weights reordered once
(`torch.ops.mkldnn._reorder_linear_weight`, the op PyTorch's own compiler uses when it freezes a model),
and flatter in the row count, so the rows a step verifies cost less beside the one it must compute.

Packing must not cost exactness: lookahead's guarantee is bit-identity with the model's own decoding,
and that rests on a row's result not depending on how many rows share the pass (engine/numerics.py).
So each distinct layer shape is packed only where, for a spread of row counts, either
- the packed kernel gives exactly the plain kernel's bits from 2 rows on (bfloat16 here: yes at every
  count tried; a single row is computed as the first of two, `_run_packed`, so it gets those bits
  too, where oneDNN's one-row path gave one layer other bits and the model a width floor of 2), or
- the plain kernel's rows change with the row count and the packed kernel's do not, from 2 rows on
  (float32 here: MKL's plain linear is width-dependent, oneDNN's packed one is not). Packing then
  changes the model's last bits against the plain kernel, and makes every pass of >= 2 rows compute
  each row the same: the float32 model gets a width floor, so lookahead in float32 becomes exact
  rather than equal up to rounding, and its passes are faster (SmolLM2 float32 here: one row 58 -> 43
  ms, eight rows 84 -> 49 ms). `load(pack=False)` keeps the plain kernel's bits.
A packed kernel that is neither is never used. The width probe then runs over the packed model like
over any other.

In bfloat16, where lookahead's C++ extension builds with AVX-512 BF16 (engine/exact_kernel.py `tiles`),
the weights are instead laid out for its own linear kernel (engine/linear_kernel.cpp, `TiledWeight`): each
output is one fixed sequence of float operations, so a row's bits never depend on the row count (one
row included), and each call reads the weights once at close to the memory bandwidth. It gives other
last bits than oneDNN, as the exact attention kernel does: the model computes other (equally rounded)
numbers, the same ones for every strategy, which is what lossless means here (README, "Lossless,
exactly"). It is used only where its rows are width-invariant at every row count checked. Measured on
SmolLM2-135M's linears (bfloat16, 2 Zen 4 cores under another tenant's memory traffic, interleaved;
docs/results/tiled-linears/): 1-8 rows 0.65-0.77 of oneDNN's time, 16 rows 0.78, 64 rows 0.96, a
600-row prompt 1.05. LOOKAHEAD_LINEAR_KERNEL=0 keeps oneDNN.

Sibling projections that read the same input (an attention's q, k and v; an MLP's gate and up) then run
as one matmul over their weights stacked, split back into each layer's output (`PackedProjection`):
two calls a decoder layer instead of five, and the narrow k and v matrices no longer run alone (oneDNN
costs ~15 us a call even for a 64x64 matrix). Only where the stacked product gives each member exactly
its own packed bits, at every row count checked, so the model computes the same numbers either way.
Measured on SmolLM2-135M (bfloat16, 2 Zen 4 cores under another tenant's memory traffic, passes over
600 cached keys, interleaved): 1-16 rows 5-8% faster a pass, a 600-token prompt 3.5%, the logits
bit-identical (docs/results/stacked-projections/).

The packed copy is extra memory (about the size of the linear weights); `load(pack=False)` skips it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from lookahead.engine import exact_kernel

CHECK_ROWS = (1, 2, 3, 4, 5, 8, 16, 17, 33, 64)  # row counts compared (ascending; the last is the widest)
NO_PACK_HELP = ("run PyTorch's own linear kernels instead of weights packed once for oneDNN or, in bfloat16, "
                "lookahead's own kernel (default: packed where that costs no exactness; float32 and the bfloat16 "
                "kernel then give other last bits than the plain kernel)")
# 2: float32 packs where that makes its rows width-invariant; 3: one row runs as the first of two;
# 4: sibling projections run as one matmul (timings cached before are re-taken: models/loader.py timing_key);
# 5: bfloat16 on lookahead's tiled linear kernel (other bits: cached width probes are redone too)
PACKING_VERSION = 5
# Sibling layers that a decoder layer applies to one input, by attribute name (Llama, Mistral, Qwen, Gemma)
STACKED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
VIEW_WIDTH = 64  # a stacked member's output is handed on as a view where its width is a multiple of this
PACK_FOR_ROWS = 8  # the row count oneDNN tunes the packed layout for (decode steps: a few to a few dozen)


def _ops_available() -> bool:
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise"))


class TiledWeight:
    """A weight [out, in] in lookahead's linear kernel's layout, `blocks` [out/16, in/2, 16, 2] (engine/
    linear_kernel.cpp `tile_weight`). Not a tensor: oneDNN's packed weights and these take other kernels."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.blocks = exact_kernel.kernel().tile_weight(weight.detach())
        self.dtype = weight.dtype


Packed = torch.Tensor | TiledWeight  # a weight as `_packed_matmul` takes it


def _tileable(weight: torch.Tensor) -> bool:
    """Can this weight [out, in] run on the tiled kernel (its dtype, whole 16-column blocks, input pairs)?"""
    return weight.device.type == "cpu" and weight.shape[0] % 16 == 0 and weight.shape[1] % 2 == 0 and \
        exact_kernel.tiles(weight.dtype)


def _pack(weight: torch.Tensor) -> Packed:
    """`weight` [out, in] packed once: for the tiled kernel where it can run it, else for oneDNN (raises
    RuntimeError for a dtype or layout oneDNN does not take)."""
    if _tileable(weight):
        return TiledWeight(weight)
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_FOR_ROWS)


def _packed_matmul(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] @ weight.T + bias through the packed weight: [..., out]. oneDNN flattens the leading
    dimensions itself, giving the bits of x.reshape(-1, in) without a reshape and a view around each of a
    step's 211 linears (SmolLM2; forward passes of 4-8 rows ~0.5% faster, paired); so does the tiled kernel."""
    if isinstance(packed, TiledWeight):
        return exact_kernel.kernel().tiled_linear(x, packed.blocks, bias)
    return torch.ops.mkldnn._linear_pointwise.default(x, packed, bias, "none", [], "")


def _run_packed(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None) -> torch.Tensor:
    """The packed kernel as PackedLinear runs it: x [..., in] -> [..., out], a single row computed as the
    first of two. oneDNN takes another path for one row: SmolLM2's down_proj (1536 -> 576, bfloat16,
    Zen 4) gave other bits for 17 of 200 random rows alone than as the first of 2, 3 or 8 rows, while
    every count from 2 on agreed. That one layer gave the bfloat16 model a width floor of 2, so every
    exact pass carried a dummy row; computed as the first of two (which costs the same: 50.6 against
    50.8 us), one row gives the bits of any wider pass and the model's floor is 1. The tiled kernel
    computes every row alike, one row included."""
    if x.numel() == x.shape[-1] and not isinstance(packed, TiledWeight):  # one row
        return _packed_matmul(x.reshape(1, -1).expand(2, -1).contiguous(), packed, bias)[:1].view(*x.shape[:-1], -1)
    return _packed_matmul(x, packed, bias)


class PackedLinear(nn.Module):
    """An nn.Linear whose forward uses its weight packed once (see the module docstring). `weight` and
    `bias` stay the original parameters (tied embeddings, state dicts and shape lookups still see them);
    inputs the packed copy cannot take (another dtype or device, or needing gradients) go through the
    plain linear. The packed copy is taken at construction: change the weight afterwards and it is stale."""

    def __init__(self, linear: nn.Linear, packed: Packed) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        # a plain attribute, not a buffer: model.to(...) must not cast a blocked layout element by element
        self.packed = packed
        self._dtype, self._device = linear.weight.dtype, linear.weight.device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # after model.to(...) inputs arrive in the new dtype or device, so the input alone tells a stale copy
        if x.dtype != self._dtype or x.device != self._device or (
                torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return nn.functional.linear(x, self.weight, self.bias)
        return _run_packed(x, self.packed, self.bias)  # [..., in] -> [..., out]

    def __deepcopy__(self, memo: dict[int, Any]) -> nn.Module:
        """A copy packed from the copied weight (the blocked layout itself has no storage to copy); a
        plain nn.Linear where the packed copy was already stale (the model converted after packing)."""
        shell = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        shell.weight = copy.deepcopy(self.weight, memo)  # memo: a tied weight stays tied in the copy
        shell.bias = copy.deepcopy(self.bias, memo)
        shell.train(self.training)
        out: nn.Module = shell
        if (shell.weight.dtype, shell.weight.device) == (self._dtype, self._device):
            with torch.no_grad():
                out = PackedLinear(shell, _pack(shell.weight))
            out.train(self.training)
        memo[id(self)] = out
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, packed"


class _Stacked:
    """The weights of a group of sibling layers stacked along their outputs and packed once, and the last
    input's product split back into the members' outputs. Not a module: the members hold the parameters."""

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None]) -> None:
        self.weights, self.biases = weights, biases
        self.sizes = [int(w.shape[0]) for w in weights]
        with torch.no_grad():
            self.packed = _pack(torch.cat([w.detach() for w in weights]))
            self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases if b is not None])
        # (input, its outputs, members served): kept until every member has taken its output
        self._last: tuple[torch.Tensor, list[torch.Tensor], set[int]] | None = None

    def run(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x [..., in] -> each member's [..., out_i]: a view into the stacked product where out_i is a multiple
        of VIEW_WIDTH, else a contiguous copy. Downstream elementwise kernels then compute every element
        in the same (vectorized) code path as on the member's own contiguous output: PyTorch's CPU loops
        take two vectors (at most 2 x 32 bf16 elements) an iteration and leave the remainder of each
        contiguous run to a scalar loop, so a run of the view's width leaves none. (Copying every part
        cost the pass most of what stacking saves: 3 small copies ~25 us a layer at 4 rows.)"""
        parts = torch.split_with_sizes(_run_packed(x, self.packed, self.bias), self.sizes, dim=-1)
        return [part if part.shape[-1] % VIEW_WIDTH == 0 else part.contiguous() for part in parts]

    def take(self, x: torch.Tensor, member: int) -> torch.Tensor:
        """Member `member`'s output for x: computed with its siblings' on the first call for this input
        (identity, not value: the decoder layer hands every member the same tensor), then served."""
        last = self._last  # read once: a concurrent pass replaces the tuple, never edits the products
        if last is None or last[0] is not x:
            last = (x, self.run(x), set())
            self._last = last
        last[2].add(member)
        if len(last[2]) == len(self.sizes) and self._last is last:
            self._last = None  # every member served: hold neither the input nor the products
        return last[1][member]


class PackedProjection(nn.Module):
    """One of a group of sibling linear layers that run as one packed matmul (`_Stacked`, see the module
    docstring); `weight` and `bias` stay its own parameters. Inputs the packed copy cannot take go through
    the plain linear, as in PackedLinear."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, stacked: _Stacked, member: int) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        self.bias = bias
        self.stacked, self.member = stacked, member  # plain attributes (shared by the group)
        self._dtype, self._device = weight.dtype, weight.device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self._dtype or x.device != self._device or (
                torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return nn.functional.linear(x, self.weight, self.bias)
        return self.stacked.take(x, self.member)  # [..., in] -> [..., out]

    def __deepcopy__(self, memo: dict[int, Any]) -> nn.Module:
        """A member of a group stacked again from the copied weights (the group's copies share one stack,
        through `memo`); a plain nn.Linear where the stack is stale (the model converted after packing)."""
        shell = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        shell.weight = copy.deepcopy(self.weight, memo)
        shell.bias = copy.deepcopy(self.bias, memo)
        shell.train(self.training)
        out: nn.Module = shell
        if (shell.weight.dtype, shell.weight.device) == (self._dtype, self._device):
            stacked = memo.get(id(self.stacked))
            if stacked is None:
                stacked = _Stacked([copy.deepcopy(w, memo) for w in self.stacked.weights],
                                   [copy.deepcopy(b, memo) for b in self.stacked.biases])
                memo[id(self.stacked)] = stacked
            out = PackedProjection(shell.weight, shell.bias, stacked, self.member)
            out.train(self.training)
        memo[id(self)] = out
        return out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"packed with its siblings (member {self.member})")


def group_runner(members: Sequence[nn.Module]) -> Callable[[torch.Tensor], Sequence[torch.Tensor]] | None:
    """One call giving each of `members` its output for an input x [..., in] (a list [..., out_i]), where
    they are exactly the members of one stack, in order: the stacked matmul and its split, without a
    module call, the checks and the hand-over (`_Stacked.take`) per member (a decoder layer that knows
    its siblings read one input, models/lean.py, calls this once for them). Inputs the stack cannot take
    go through the members' own forward, as each would alone. None where `members` are not one stack."""
    if not members or not all(type(m) is PackedProjection for m in members):
        return None
    stacked: _Stacked = members[0].stacked  # type: ignore[assignment]
    if len(members) != len(stacked.sizes) or any(m.stacked is not stacked or m.member != i  # type: ignore[union-attr]
                                                 for i, m in enumerate(members)):
        return None
    dtype, device = members[0]._dtype, members[0]._device  # type: ignore[union-attr]
    weights = [m.weight for m in members]

    def run(x: torch.Tensor) -> Sequence[torch.Tensor]:
        if x.dtype != dtype or x.device != device or (
                torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights))):
            return [m(x) for m in members]
        return stacked.run(x)

    return run


def _plain_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return nn.functional.linear(x, weight, bias)


def _rows_by_count(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> list[torch.Tensor]:
    """fn over the first n rows of x, for every n in CHECK_ROWS."""
    with torch.no_grad():
        return [fn(x[:n]) for n in CHECK_ROWS]


def _width_invariant(outs: list[torch.Tensor], fewest: int = 2) -> bool:
    """Are the rows of every pass of >= `fewest` rows the same rows of the widest pass, bit for bit?"""
    widest = outs[-1]
    return all(torch.equal(out, widest[: out.shape[0]]) for n, out in zip(CHECK_ROWS, outs) if n >= fewest)


def _packing_is_exact(linear: nn.Linear, packed: Packed) -> bool:
    """May this layer run packed without costing exactness? Where the packed kernel as it runs
    (`_run_packed`) gives the plain kernel's bits at every row count of CHECK_ROWS from 2 on (one row
    then gives those bits too, where the plain kernel's single row may not), or where the plain
    kernel's rows depend on the row count and the packed kernel's do not (see the module docstring).
    The tiled kernel: where its rows are the same at every row count, one row included."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(max(CHECK_ROWS), linear.in_features, generator=gen).to(linear.weight.dtype)
    fast = _rows_by_count(lambda rows: _run_packed(rows, packed, linear.bias), x)
    if isinstance(packed, TiledWeight):
        return _width_invariant(fast, fewest=1)
    plain = _rows_by_count(lambda rows: _plain_matmul(rows, linear.weight, linear.bias), x)
    if all(torch.equal(a, b) for n, a, b in zip(CHECK_ROWS, plain, fast) if n >= 2):
        return True
    return not _width_invariant(plain) and _width_invariant(fast)


def pack_linears(model: Any) -> int:
    """Replace the model's CPU nn.Linear layers by PackedLinear where packing costs no exactness (checked
    per layer shape and dtype; see the module docstring). Returns how many layers were packed (0 where the ops are missing, the model
    is not on the CPU, or no shape passes the check)."""
    if not _ops_available():
        return 0
    verdicts: dict[tuple[int, int, torch.dtype, bool], bool] = {}
    swaps: list[tuple[nn.Module, str, PackedLinear]] = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is not nn.Linear or child.weight.device.type != "cpu":
                continue
            kind = (child.in_features, child.out_features, child.weight.dtype, child.bias is not None)
            if verdicts.get(kind) is False:
                continue
            with torch.no_grad():
                try:
                    packed = _pack(child.weight)
                except RuntimeError:  # a dtype or layout oneDNN does not take
                    verdicts[kind] = False
                    continue
            if kind not in verdicts:
                verdicts[kind] = _packing_is_exact(child, packed)
            if verdicts[kind]:
                swaps.append((parent, name, PackedLinear(child, packed)))
    for parent, name, packed_linear in swaps:
        setattr(parent, name, packed_linear)
    _stack_siblings(model)
    return len(swaps)


def _stack_siblings(model: Any) -> None:
    """Run each STACKED_GROUPS group of packed sibling layers as one PackedProjection group, where the
    stacked product gives every member its own bits (checked once per group shape and dtype)."""
    verdicts: dict[tuple[object, ...], bool] = {}
    for parent in list(model.modules()):
        for names in STACKED_GROUPS:
            members = [getattr(parent, n, None) for n in names]
            if not all(type(m) is PackedLinear for m in members):
                continue
            layers: list[PackedLinear] = members  # type: ignore[assignment]
            if len({(m.in_features, m._dtype, m._device, m.bias is None) for m in layers}) != 1:
                continue
            kind = (layers[0].in_features, tuple(m.out_features for m in layers), layers[0]._dtype,
                    layers[0].bias is None)
            if verdicts.get(kind) is False:
                continue
            stacked = _Stacked([m.weight for m in layers], [m.bias for m in layers])
            if kind not in verdicts:
                verdicts[kind] = _stacking_is_exact(layers, stacked)
            if verdicts[kind]:
                for i, (name, m) in enumerate(zip(names, layers)):
                    setattr(parent, name, PackedProjection(m.weight, m.bias, stacked, i))


def _stacking_is_exact(layers: list[PackedLinear], stacked: _Stacked) -> bool:
    """Does the stacked product give every member exactly its own packed output, at every row count of
    CHECK_ROWS (one row included)?"""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(max(CHECK_ROWS), layers[0].in_features, generator=gen).to(layers[0]._dtype)
    with torch.no_grad():
        for n in CHECK_ROWS:
            parts = stacked.run(x[:n])
            if not all(torch.equal(part, _run_packed(x[:n], m.packed, m.bias)) for part, m in zip(parts, layers)):
                return False
    return True


def unpack_linears(model: Any) -> int:
    """Put plain nn.Linear layers back in place of the model's packed ones (PackedLinear, PackedProjection;
    same parameters). Returns how many were unpacked."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if isinstance(child, (PackedLinear, PackedProjection))]
    for parent, name, child in swaps:
        plain = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
        plain.weight, plain.bias = child.weight, child.bias
        plain.train(child.training)
        setattr(parent, name, plain)
    return len(swaps)


def packed_count(model: Any) -> int:
    """How many of the model's layers run packed."""
    return sum(isinstance(m, (PackedLinear, PackedProjection)) for m in model.modules())
