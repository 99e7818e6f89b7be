"""The token-choice rule shared by every strategy.

Lossless speculation needs one rule that maps (distribution at position t, seed, t) to a token:
- greedy: argmax(logits);
- sampling: argmax(processed_logits + g_t), where g_t ~ Gumbel(0, 1)^V is drawn from a generator
  seeded by (seed, t). Gumbel-max makes that an exact sample of softmax(processed_logits), and because
  the noise depends only on (seed, t), autoregressive and speculative decoding pick the same token at
  every position: a candidate is accepted iff it equals the token this rule picks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from lookahead.config import SamplingConfig
from lookahead.engine import exact_kernel

_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant (golden ratio) for seed mixing
_NARROW = (torch.bfloat16, torch.float16)  # float32 holds every value of these exactly
BLOCK = 128  # `largest`: logits per block of a row's first pass
TWO_PASS_FROM = 100_000  # `largest`: vocabularies from this size take two passes (see its docstring)


class Largest(NamedTuple):
    """A row's k largest logits [R, k], descending, and their indices [R, k] (as torch.topk's result)."""

    values: torch.Tensor
    indices: torch.Tensor


def largest(logits: torch.Tensor, k: int) -> Largest:
    """The k largest logits of each row and their indices, [R, V] -> ([R, k], [R, k]), descending: the
    values torch.topk(logits, k, dim=-1) gives. Rows are independent (a row's result does not depend on
    the rows beside it). Equal values: see `_kernel_top`, else in no stated order (as with torch.topk).

    Where lookahead's extension is loaded (a bfloat16 model built it; engine/topk_kernel.cpp) and the
    logits are bfloat16 or float32 on the CPU: one pass over each row (`_kernel_top`). Else, from
    TWO_PASS_FROM tokens on, two passes: first every row's maximum per block of BLOCK logits, then the k
    largest logits among the k blocks with the largest maxima. Those blocks hold the k largest values: a
    logit in any other block is at most each of those k maxima, k values in distinct blocks, so it is
    among the k largest only through a tie, and an equal value then takes its place. bfloat16/float16
    rows are compared widened to float32 (exact; CPU reductions over them are several times slower); the
    values come back in the logits' dtype. Under TWO_PASS_FROM, one torch.topk.

    Why: a lookahead step reads the top-k predictions of every row it computed (recycled successors).
    SmolLM2's 49,152 bfloat16 logits, 7 rows, k = 8 (Zen 4, 2 threads, timed alone): torch.topk 259 us,
    the kernel 23 us; Gemma 3's 262,144 tokens, 8 rows: 1,339 against 89 us. (The two passes, timed
    inside decoding steps: Gemma 3 1.95 ms with torch.topk against 0.87-1.04 ms.)"""
    top = _kernel_top(logits, k)
    if top is not None:
        return top
    rows, vocab = logits.shape
    if vocab < TWO_PASS_FROM or k * BLOCK * 4 > vocab:  # one pass is as cheap
        return Largest(*torch.topk(logits, k, dim=-1))
    wide = logits.float() if logits.dtype in _NARROW else logits
    pad = -vocab % BLOCK
    if pad:
        wide = F.pad(wide, (0, pad), value=float("-inf"))
    blocks = wide.view(rows, -1, BLOCK)  # [R, B, BLOCK]
    best = blocks.amax(dim=-1).topk(k, dim=-1).indices  # [R, k]: the blocks with the k largest maxima
    picked = blocks.gather(1, best[..., None].expand(rows, k, BLOCK)).view(rows, k * BLOCK)  # [R, k*BLOCK]
    values, at = picked.topk(k, dim=-1)  # [R, k]
    indices = best.gather(1, at // BLOCK) * BLOCK + at % BLOCK  # [R, k] in the row
    if pad and bool((indices >= vocab).any()):  # a row with fewer than k logits above -inf picked padding
        return Largest(*torch.topk(logits, k, dim=-1))
    return Largest(values.to(logits.dtype), indices)


def _kernel_top(logits: torch.Tensor, k: int) -> Largest | None:
    """`largest` on lookahead's kernel (engine/topk_kernel.cpp): one walk over each row, equal values by
    ascending index (the first k of a stable descending sort; k = 1: argmax's first maximum). None where
    the extension is not loaded (never built for this: a float32 model pays no compile), the logits are
    not bfloat16/float32 [R, V] on the CPU, or a row holds a NaN (torch ranks NaN first; the caller's
    PyTorch path then does)."""
    kern = exact_kernel.loaded()
    if (kern is None or logits.dim() != 2 or logits.device.type != "cpu" or not 1 <= k <= logits.shape[-1]
            or logits.dtype not in (torch.bfloat16, torch.float32)):
        return None
    values, indices, nan = kern.top_rows(logits.contiguous(), k)
    return None if nan else Largest(values, indices)


def process_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, top-k, top-p applied row-wise. logits: [R, V] -> [R, V] (float32, -inf outside)."""
    x = logits.float() / cfg.temperature
    vocab = x.shape[-1]
    if 0 < cfg.top_k < vocab:
        kth = largest(x, cfg.top_k).values[..., -1:]  # [R, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if cfg.top_p < 1.0:
        x = x.masked_fill(~nucleus(x, cfg.top_p), float("-inf"))
    return x


# The tokens a row's top-p cut is looked for among: its FIRST_K best (one pass on lookahead's kernel), then
# for the few rows whose cut lies further (flat rows), its SECOND_K best, then the tokens at or above
# probability floors (the first ones in descending order), the floor lowered until the cut is among them
# (0: the whole row).
FIRST_K, SECOND_K = 16, 64
_FLOORS = (1e-4, 1e-5, 0.0)


def nucleus(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """[R, V] -> [R, V] bool: the tokens top-p keeps. Per row, in descending order of x, a token is kept
    while the probability mass before it is below top_p (so the first always is); a token tied with the
    last one kept is kept too, so the set is {x >= cut} whatever order a sort gives equal values.

    Only the best tokens are sorted, as few as contain the cut: sorting whole rows (49,152 tokens) took
    12 ms for the 8 rows of a lookahead step against 2.8 ms for an autoregressive step's one (SmolLM2
    logits, Zen 4, 2 threads), a quarter of a lookahead step's forward pass. The cut is the same for any
    number of best tokens that contains it (the same values in the same order, summed in that order), so
    a row's set does not depend on the rows beside it."""
    return x >= nucleus_cut(x, top_p)


def nucleus_cut(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """[R, V] -> [R, 1]: each row's top-p cut, the value of the last token `nucleus` keeps. The rows' best
    come from `largest` (torch.topk's values; tied values have the same probability, so the sums before
    each rank do not depend on how ties are ordered). On lookahead's extension, first its `top_p_cuts`
    (engine/topk_kernel.cpp): each row's SECOND_K best walked once and summed in double, kept where no
    rank's mass lies within 1e-5 of top_p (float32 sums of up to 128 values move by less); the rest here."""
    probs = torch.softmax(x, dim=-1)  # [R, V]
    kern = exact_kernel.loaded()
    if kern is not None and x.dim() == 2 and x.device.type == "cpu" and x.dtype == torch.float32:
        # Among each row's SECOND_K best in one walk, where float32 sums cannot move the cut (most rows).
        x = x.contiguous()
        cuts, found = kern.top_p_cuts(x, probs, top_p, min(SECOND_K, x.shape[-1]))
        cut, past = cuts[:, None], torch.nonzero(~found).flatten().tolist()
        for r in past:  # near the line, past the SECOND_K best, or NaN: the sums as PyTorch does them
            cut[r] = _cut(x[r], probs[r], top_p, first=True)
        return cut
    cut, past = _cut_among(x, probs, min(FIRST_K, x.shape[-1]), top_p)
    for r in past:
        cut[r] = _cut(x[r], probs[r], top_p)
    return cut


def _cut_among(x: torch.Tensor, probs: torch.Tensor, k: int, top_p: float) -> tuple[torch.Tensor, list[int]]:
    """Each row's cut among its k best ([R, 1]) and the rows whose cut lies past them."""
    top, order = largest(x, k)  # [R, k], descending
    p = probs.gather(-1, order)
    mass = torch.cumsum(p, dim=-1)  # [R, k]: the mass up to each rank
    kept = (mass - p) < top_p  # [R, k]: mass before each rank below p (a prefix)
    kept[:, 0] = True  # the best token always: a top_p under float32's least value compares as 0 (0 < 0)
    cut = top.gather(-1, kept.sum(dim=-1, keepdim=True) - 1)  # [R, 1]: the last kept token's value
    if k == x.shape[-1]:
        return cut, []
    # The mass before the next rank is the k best's whole mass (the same values summed in the same order):
    # where it is below top_p, that token is kept too and the cut lies past the k best.
    return cut, torch.nonzero(mass[:, -1] < top_p).flatten().tolist()


def _cut(row: torch.Tensor, probs: torch.Tensor, top_p: float, first: bool = False) -> torch.Tensor:
    """One row's top-p cut value past its FIRST_K best (anywhere where `first`): among its SECOND_K best,
    else sorting the tokens above the floors in turn."""
    if SECOND_K < row.shape[-1] or first:
        cut, past = _cut_among(row[None], probs[None], min(SECOND_K, row.shape[-1]), top_p)
        if not past:
            return cut[0, 0]
    for floor in _FLOORS:
        at = torch.nonzero(probs >= floor).flatten() if floor > 0 else None  # [n] candidate tokens
        if at is not None and at.numel() <= SECOND_K:
            continue  # no more tokens than SECOND_K reach this floor: a lower one
        top, order = torch.sort(row if at is None else row[at], descending=True)  # [n]
        p = (probs if at is None else probs[at])[order]
        mass = torch.cumsum(p, dim=0)  # [n]
        kept = (mass - p) < top_p  # [n]
        if at is None or not bool(mass[-1] < top_p):  # the next token is not kept: the cut is among them
            break
    return top[int(kept.sum()) - 1]


def first_maximum(logits: torch.Tensor, values: Sequence[Sequence[float]], indices: Sequence[Sequence[int]]) -> list[int]:
    """argmax(logits) per row (the first of equal maxima) from the row's k largest values and their
    indices (lists [R][k], descending; equal values in any order). Every value tied with the maximum is
    among the k unless all k tie, so the smallest index among them is the first maximum; a row whose k
    values all tie is left to argmax. A lookahead step that recycles the model's top-k predictions has
    them anyway (as lists: a step reads them in Python), and argmax over 8 rows of 49,152 logits took
    0.36 ms (Zen 4, 2 threads)."""
    out = []
    for row, (vals, idx) in enumerate(zip(values, indices)):
        if vals[-1] == vals[0]:  # all k tie with the maximum; more may lie outside them
            x = logits[row]
            out.append(int((x.float() if x.dtype in _NARROW else x).argmax()))
        else:
            out.append(min(i for v, i in zip(vals, idx) if v == vals[0]))
    return out


_uniform_checked: dict[str, bool] = {}  # "agrees": lookahead's kernel gave torch.rand's values here
_U_MIN, _U_MAX = 1e-20, 1.0 - 1e-7  # the rule's clamp of its uniform draws before the logarithms
_U_MIN_F, _U_MAX_F = float(torch.tensor(_U_MIN)), float(torch.tensor(_U_MAX))  # the same, rounded to float32
NOISE_TOLERANCE = 1e-5  # gumbel_choice's bounds assume PyTorch's noise within 1e-3 of the double one; checked to this


def uniform(seed: int, n: int) -> torch.Tensor:
    """torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float32): [n] float32,
    bit for bit, for 0 <= seed < 2**63. On lookahead's extension where it is loaded (engine/uniform_kernel.cpp:
    the same Mersenne Twister without PyTorch's per-value generator calls, 12 against 156 us for 49,152
    values on 2 Zen 4 cores) once it has given torch.rand's values in this process (checked on first use,
    so a PyTorch whose generator differs keeps its own); else torch.rand."""
    kern = exact_kernel.loaded()
    if kern is not None and _kernel_uniform_agrees(kern):
        return kern.mt_uniform(seed, n)
    return torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def _kernel_uniform_agrees(kern: Any) -> bool:
    agrees = _uniform_checked.get("agrees")
    if agrees is None:
        seeds = (0, 2**32 + 7, 0x2545F4914F6CDD1D)  # the last two also check that only the low 32 bits seed it
        agrees = all(torch.equal(kern.mt_uniform(s, 1500), torch.rand(1500, generator=torch.Generator().manual_seed(s)))
                     for s in seeds)
        if not agrees:
            logging.getLogger(__name__).warning(
                "lookahead: this PyTorch's torch.rand differs from lookahead's Mersenne Twister; seeded sampling "
                "draws its noise with torch.rand (the same tokens, ~0.15 ms more per position)")
        _uniform_checked["agrees"] = agrees
    return agrees


def gumbel_noise(u: torch.Tensor) -> torch.Tensor:
    """The rule's noise from its uniform draws: -log(-log(u)), u clamped to [1e-20, 1 - 1e-7], as float32
    PyTorch computes it (a new tensor; u is left as it is)."""
    return u.clamp(min=_U_MIN, max=_U_MAX).log_().neg_().log_().neg_()


_noise_checked: dict[str, bool] = {}  # "close": PyTorch's float32 noise matched the double one here


def _noise_bounds_hold() -> bool:
    """Does PyTorch's float32 noise lie within NOISE_TOLERANCE of the same formula in double here? The
    kernel's choice from the draws (engine/gumbel_kernel.cpp) allows 1e-3; measured 5.4e-7 on this
    machine's PyTorch (MKL's logarithm). Checked once per process on 3 x 49,152 draws; where it fails, a
    warning, and every sampled choice computes the noise row."""
    close = _noise_checked.get("close")
    if close is None:
        u = torch.cat([uniform(s, 49_152) for s in (1, 2**40 + 3, 977)])
        u = torch.cat([u, torch.tensor([0.0, 0.5, 1.0 - 2.0**-24, 2.0**-24])])  # both clamps and their neighbours
        exact = -torch.log(-torch.log(u.double().clamp(min=_U_MIN_F, max=_U_MAX_F)))
        close = bool(((gumbel_noise(u).double() - exact).abs().max() <= NOISE_TOLERANCE))
        if not close:
            logging.getLogger(__name__).warning(
                "lookahead: this PyTorch's logarithm strays from the double one by more than %g; seeded sampling "
                "computes every position's noise row (the same tokens, ~0.06 ms more per position)", NOISE_TOLERANCE)
        _noise_checked["close"] = close
    return close


class TokenChooser:
    """Applies the rule to rows of logits whose absolute positions are known.

    Noise for a position is generated once and reused (a position is verified in several steps).
    """

    def __init__(self, cfg: SamplingConfig, vocab_size: int) -> None:
        self.cfg = cfg
        self.vocab_size = vocab_size
        self._draws: dict[int, torch.Tensor] = {}  # position -> its uniform draws [V]
        self._noise: dict[int, torch.Tensor] = {}  # position -> its noise row [V], where one was needed
        self._views: dict[int, Any] = {}  # position -> a NumPy view of its draws (`noise_at`)

    def draws(self, position: int) -> torch.Tensor:
        """The uniform draws behind one absolute position's noise: [V] float32, a pure function of (seed,
        position); cached (a position is verified in several steps)."""
        u = self._draws.get(position)
        if u is None:
            seed = ((self.cfg.seed * _MIX) ^ (position * 0x2545F4914F6CDD1D)) % (2**63)
            u = self._draws[position] = uniform(seed, self.vocab_size)
        return u

    def gumbel(self, position: int) -> torch.Tensor:
        """Gumbel(0,1) noise for one absolute position: [V], a pure function of (seed, position)."""
        g = self._noise.get(position)
        if g is None:
            g = self._noise[position] = gumbel_noise(self.draws(position))
        return g

    def noise_at(self, position: int, tokens: Sequence[int]) -> list[float]:
        """The noise of `position` at `tokens`, as Python floats, computed in double from the draws: within
        ~5e-7 of gumbel(position)'s float32 values (this orders a recycled row's candidates; the choice
        itself never reads it). Read through a NumPy view of the draws: a recycled row's 8 tokens cost a
        few us, where the noise row would cost ~0.1 ms; a sampled lookahead step reads a few such rows."""
        view = self._views.get(position)
        if view is None:
            view = self._views[position] = self.draws(position).numpy()
        return [-math.log(-math.log(min(max(float(view[t]), _U_MIN_F), _U_MAX_F))) for t in tokens]

    def forget_before(self, position: int) -> None:
        """Drop cached draws and noise for positions already decided (bounded memory)."""
        for cache in (self._draws, self._noise, self._views):
            for p in [p for p in cache if p < position]:
                del cache[p]

    def choose(self, logits: torch.Tensor, positions: list[int],
               top: tuple[Sequence[Sequence[float]], Sequence[Sequence[int]]] | None = None) -> list[int]:
        """logits: [R, V] for the positions they predict (len R) -> R chosen token ids. `top`: the rows'
        k largest logits and their indices (lists [R][k], descending, as torch.topk gives them), where the
        caller has them: greedy reads its choice off them."""
        if self.cfg.greedy and top is not None:
            return first_maximum(logits, *top)
        if self.cfg.greedy:
            first = _kernel_top(logits, 1)  # equal maxima by index: argmax's first (~0.02 ms for 7 rows, not 0.23)
            if first is not None:
                return first.indices[:, 0].tolist()
            if logits.dtype in _NARROW:  # widened first: same values, same first maximum, and torch's CPU
                logits = logits.float()  # argmax over bf16 rows is ~5x slower (0.7 ms for [8, 49152] here)
            return logits.argmax(dim=-1).tolist()
        logits = logits[:, : self.vocab_size]
        chosen = self._kernel_choice(logits, positions)
        if chosen is not None:
            return chosen
        x = process_logits(logits, self.cfg)
        noise = torch.stack([self.gumbel(p) for p in positions])  # [R, V]
        return (x + noise).argmax(dim=-1).tolist()

    def _kernel_choice(self, logits: torch.Tensor, positions: list[int]) -> list[int] | None:
        """The sampled choice on lookahead's kernel, where the extension is loaded: first from each row's
        uniform draws alone (engine/gumbel_kernel.cpp `gumbel_choice`: the noise computed in double only for
        the few tokens whose bound could win, the choice taken where bounds on PyTorch's float32 noise leave
        one token; ~0.03 against ~0.1 ms a row), then for rows left undecided (near ties, NaN) from their
        noise rows (engine/topk_kernel.cpp `sampled_choice`: PyTorch's values for logits.float() /
        temperature + noise and argmax's first maximum, one pass). A top-k or top-p rule masks each row
        below its `floors` (the kernels skip what process_logits would set to -inf). None where the
        extension is not loaded, or where a value is NaN (the caller's PyTorch path decides then)."""
        kern = exact_kernel.loaded()
        if (kern is None or logits.dim() != 2 or logits.device.type != "cpu"
                or logits.dtype not in (torch.bfloat16, torch.float32)):
            return None
        logits = logits.contiguous()
        floors = self.floors(logits)
        temperature = float(self.cfg.temperature)
        rows = list(range(len(positions)))  # the rows the noise rows must decide
        out = [0] * len(positions)
        if _noise_bounds_hold():  # 1. from the draws alone where bounds on the noise settle it (most rows)
            chosen, decided = kern.gumbel_choice(logits, temperature, [self.draws(p) for p in positions], floors)
            rows = []
            for r, (c, d) in enumerate(zip(chosen.tolist(), decided.tolist())):
                if d:
                    out[r] = c
                else:
                    rows.append(r)
        if rows:  # 2. the rest on the noise rows
            some = len(rows) < len(positions)
            chosen, nan = kern.sampled_choice(logits[rows].contiguous() if some else logits, temperature,
                                              [self.gumbel(positions[r]) for r in rows],
                                              floors[rows].contiguous() if some and floors is not None else floors)
            if nan:
                return None
            for r, c in zip(rows, chosen.tolist()):
                out[r] = c
        return out

    def floors(self, logits: torch.Tensor) -> torch.Tensor | None:
        """[R, V] -> [R] float32: the least value of logits.float() / temperature that process_logits
        keeps in each row (the k-th largest for top-k, the top-p cut, the larger of the two for both), or
        None where the rule keeps every token. For rows without NaN, process_logits(logits) is
        x.masked_fill(x < floors, -inf): a token below the top-k value is -inf before the top-p cut, and
        the cut is either a kept token's value (not below the k-th) or -inf (a top_p above the float sum
        of the row's probabilities keeps every token, the masked ones still -inf)."""
        cfg = self.cfg
        top_k = 0 < cfg.top_k < logits.shape[-1]
        if not top_k and cfg.top_p >= 1.0:
            return None
        kern = exact_kernel.loaded()
        if kern is not None and logits.device.type == "cpu" and logits.dtype in (torch.bfloat16, torch.float32):
            x = kern.scaled(logits.contiguous(), float(cfg.temperature))  # [R, V]: process_logits's x, one pass
        else:
            x = logits.float() / cfg.temperature
        floor = largest(x, cfg.top_k).values[:, -1:] if top_k else None  # [R, 1]
        if cfg.top_p < 1.0:
            cut = nucleus_cut(x if floor is None else x.masked_fill(x < floor, float("-inf")), cfg.top_p)
            floor = cut if floor is None else torch.maximum(floor, cut)
        return floor.flatten().contiguous()
