"""One request's decoding state, stepped by the scheduler (scheduler.py):

    propose -> (the scheduler allocates across requests and runs the pass) -> absorb: stop rules, emit,
    update the sources

plus the statistics and the result it reports when it ends.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from lookahead.candidates.ngram_cache import NGramCache
from lookahead.candidates.recycling import SuccessorTable
from lookahead.candidates.registry import ProposerInputs, make_proposer
from lookahead.config import GenerationConfig
from lookahead.engine.allocator import Allocation, Candidates, chain_first
from lookahead.engine.calibration import Calibrator
from lookahead.engine.draft import CandidateTree, Draft, Proposer, ReportsDraftCost, StepOutcome
from lookahead.engine.realization import Realization
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.sources import HISTORY, WantsStates
from lookahead.engine.step import StepItem
from lookahead.engine.stopping import StopState
from lookahead.errors import PromptError
from lookahead.models.loader import LoadedModel


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache (not prefilled)
    new_tokens: int = 0
    steps: int = 0
    tokens_per_step: float = 0.0
    guesses_verified: int = 0  # candidate tokens fed to the verification branch
    guesses_accepted: int = 0  # of those, tokens the model confirmed (and that were emitted)
    acceptance_rate: float = 0.0
    processed_tokens: int = 0  # query tokens summed over decode steps: the compute spent
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0
    ttft_s: float = 0.0
    tokens_per_s: float = 0.0  # decode tokens per second
    device_s: float = 0.0  # time inside the model's forward passes (prefill and draft model included; a batched pass is shared by its requests)
    overhead_s: float = 0.0  # decode time outside the forward passes: proposing, allocating, verifying, masks
    speculative_steps: int = 0  # steps that verified at least one guess
    aux_steps: int = 0  # steps that ran an aux branch (the Jacobi window)
    draft_steps: int = 0  # forward passes of a draft model (speculative; its prefill included)
    draft_s: float = 0.0  # time inside them (part of device_s and decode_s)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    batch_size: float = 0.0  # mean number of requests sharing this request's decode passes

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    strategy: str
    stats: GenerationStats
    dtype: str = "float32"  # the weights' dtype that ran
    width_floor: int | None = None  # every pass was padded to this many rows (None: unpadded)

    def to_dict(self) -> dict[str, object]:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "strategy": self.strategy,
            "dtype": self.dtype,
            "width_floor": self.width_floor,
            "stats": self.stats.to_dict(),
        }


@dataclass
class StepEvent:
    """One accepted run: its new text (may be empty while a stop string could still match) and tokens.
    The last event carries the final result."""

    text: str
    token_ids: list[int]
    result: GenerationResult | None = None


class Request:
    """One request: prompt ids, its configuration and the sources it proposes from. `ngram_cache`:
    cross-request n-grams, updated with the response when it finishes; `calibrator`: acceptance
    estimates shared by the requests of a class, `successors`: the model's recycled successors, shared
    likewise (candidates/recycling.py; None: this request learns its own)."""

    def __init__(self, loaded: LoadedModel, prompt_ids: list[int], cfg: GenerationConfig, *,
                 draft: LoadedModel | None = None, ngram_cache: NGramCache | None = None,
                 calibrator: Calibrator | None = None, successors: SuccessorTable | None = None) -> None:
        if len(prompt_ids) + cfg.max_new_tokens > loaded.context_length:
            raise PromptError(
                f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the model's "
                f"context of {loaded.context_length} tokens; shorten the prompt or lower max_new_tokens"
            )
        self.cfg = cfg
        self.loaded = loaded
        self.prompt_ids = list(prompt_ids)
        self.context = list(prompt_ids)  # prompt + accepted tokens; the last is the next step's root
        vocab = loaded.model.get_output_embeddings().weight.shape[0]
        self.chooser = TokenChooser(cfg.sampling, vocab)
        self.proposer: Proposer = make_proposer(ProposerInputs(cfg, self.prompt_ids, loaded, self.chooser, draft,
                                                               ngram_cache, calibrator, successors))
        self.top_k: int = getattr(self.proposer, "top_k", 0)  # sources that recycle the model's top-k predictions
        # sources that compare final hidden states (engine/sources.WantsStates): the engine reports them
        self.states = isinstance(self.proposer, WantsStates) and self.proposer.states
        self.ngram_cache = ngram_cache
        self.state = StopState(loaded.tokenizer, loaded.eos_token_ids, cfg.max_new_tokens, cfg.stop)
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids))
        self.by_source: Counter[str] = Counter()
        self.forward_s = 0.0  # this request's share of the decode passes
        self.device_s = 0.0  # ... plus its prefill
        self.companions = 0  # requests summed over its decode passes (for the mean batch size)
        self.started = time.perf_counter()
        self.decode_started = self.started
        self.draft: Draft | None = None
        # The allocator sees every probability scaled by this request's realization: accepted over
        # promised extra tokens, decayed, learned from unverified steps too (engine/realization.py).
        self._realization = Realization()
        self._promised_now = 0.0

    @property
    def realization(self) -> float:
        """Accepted / promised extra tokens over recent steps, at most 1 (1 before any evidence)."""
        return self._realization.ratio

    def shadow(self, nodes: Sequence[int]) -> None:
        """Nodes of this step's draft that it would have verified at face value but that its realization
        priced out: scored against the tokens that follow (engine/realization.py). Before `item`."""
        assert self.draft is not None, "propose() comes before shadow()"
        self._realization.shadow(len(self.context), self.draft.tree, nodes)

    @property
    def finished(self) -> bool:
        return self.state.finish_reason is not None

    def propose(self, chain_only: bool = False, batched: bool = False,
                verifiable: Callable[[CandidateTree, int], CandidateTree] | None = None,
                room: int | None = None) -> Candidates:
        """This step's draft (kept until `absorb`) as the allocator sees it (`chain_only`: the pass can
        verify one path only; `batched`: the step is shared with other requests; `verifiable`: the part of
        a tree rooted at a position that the pass can verify, StepRunner.verifiable; `room`: the most rows
        this request may have in the pass (its share of the widest exact pass; None: its widest step):
        a draft verified as proposed is cut to fit, the Jacobi window first). A batched step runs no
        aux branch (the Jacobi window): a pass is rectangular, so its block of rows is paid once per
        request in the batch, for tokens that come (if at all) in later steps; measured on the public
        workloads, bf16, batches of 4-16 spent 2.3x the rows of plain batching and lost 8% throughput
        at 16 with it."""
        cfg = self.cfg
        budget = cfg.max_new_tokens - len(self.state.token_ids) - 1  # candidate tokens worth verifying
        draft = self.proposer.propose(self.context, budget)
        if draft.aux is not None and len(self.context) + int(draft.aux.offsets.max()) >= self.loaded.context_length:
            draft = Draft(tree=draft.tree, calibrated=draft.calibrated)  # the window would run past the context
        if verifiable is not None:
            tree = verifiable(draft.tree, len(self.context) - 1)  # the root sits at the cache's length
            if tree is not draft.tree:
                draft = Draft(tree, draft.aux, draft.aux_value, draft.calibrated)
        widest = cfg.widest_step if room is None else max(1, min(cfg.widest_step, room))
        if not draft.calibrated:
            draft = _cut(draft, widest)
        self.draft = draft
        aux_rows = 0 if draft.aux is None else int(draft.aux.tokens.shape[0])
        fixed = None if draft.calibrated else 1 + len(draft.tree) + aux_rows  # not calibrated: run as proposed
        r = self.realization
        probs = [p * r for p in draft.tree.probs] if r < 1.0 else draft.tree.probs
        if batched and not fixed:
            aux_rows = 0  # see propose(): the window runs only for a request alone
        return Candidates(draft.tree, probs, aux_rows, draft.aux_value * r, chain_only, fixed=fixed,
                          max_width=widest)

    def item(self, plan: Allocation) -> StepItem:
        """The step's part for the pass: the draft cut to its allocation (as proposed when uncalibrated)."""
        draft = self.draft
        assert draft is not None, "propose() comes before item()"
        if draft.calibrated:
            self._promised_now = sum(draft.tree.probs[n] for n in plan.nodes)
            # the likeliest path first: an exact step computes its rows without key views
            draft = Draft(tree=draft.tree.subtree(chain_first(draft.tree, plan.nodes)),
                          aux=draft.aux if plan.aux else None)
        self.draft = draft
        return StepItem(self.context[-1], draft, self.chooser, self.top_k, tuple(self.context[-1 - HISTORY : -1]),
                        self.states)

    def absorb(self, outcome: StepOutcome, batch: int) -> StepEvent | None:
        """Apply one step's outcome: stop rules, emit, let the sources learn. Returns the event to stream
        (None when the step emitted nothing visible)."""
        stats = self.stats
        self.forward_s += outcome.forward_s
        self.device_s += outcome.forward_s
        self.companions += batch
        stats.steps += 1
        stats.speculative_steps += outcome.candidate_tokens > 0
        stats.aux_steps += self.draft is not None and self.draft.aux is not None
        stats.processed_tokens += outcome.query_tokens
        stats.guesses_verified += outcome.candidate_tokens
        if self._promised_now > 0:
            self._realization.record(self._promised_now, len(outcome.accepted) - 1)
            self._promised_now = 0.0
        emitted: list[int] = []
        for token, source in zip(outcome.accepted, outcome.accepted_sources):
            emitted.append(token)
            self.by_source[source] += 1
            if self.state.push(token):
                break
        self.context.extend(emitted)
        self._realization.resolve(self.context)
        self.chooser.forget_before(len(self.context))
        if stats.steps == 1:
            stats.ttft_s = time.perf_counter() - self.started
        if not self.finished:
            self.proposer.update(self.context, outcome)
        chunk = self.state.take_text()
        return StepEvent(text=chunk, token_ids=emitted) if chunk or emitted else None

    def result(self, floor: int | None) -> StepEvent:
        """The final event, with the result and its statistics (`floor`: the passes' width floor)."""
        stats = self.stats
        end = time.perf_counter()
        stats.new_tokens = len(self.state.token_ids)
        stats.decode_s = end - self.decode_started
        stats.total_s = end - self.started
        if isinstance(self.proposer, ReportsDraftCost):
            stats.draft_steps, stats.draft_s = self.proposer.draft_cost()
        stats.device_s = self.device_s + stats.draft_s
        stats.overhead_s = max(stats.decode_s - self.forward_s - stats.draft_s, 0.0)
        stats.tokens_per_step = stats.new_tokens / max(stats.steps, 1)
        stats.guesses_accepted = sum(n for s, n in self.by_source.items() if s != "model")
        stats.acceptance_rate = stats.guesses_accepted / stats.guesses_verified if stats.guesses_verified else 0.0
        stats.tokens_per_s = stats.new_tokens / stats.decode_s if stats.decode_s > 0 else 0.0
        stats.accepted_by_source = dict(self.by_source)
        stats.batch_size = self.companions / max(stats.steps, 1)
        if self.ngram_cache is not None:
            self.ngram_cache.add_response(self.prompt_ids, self.state.token_ids)
        result = GenerationResult(self.state.text, list(self.state.token_ids), self.state.finish_reason or "length",
                                  self.cfg.strategy, stats, dtype=str(self.loaded.dtype).replace("torch.", ""),
                                  width_floor=floor)
        return StepEvent(text=self.state.take_text(), token_ids=[], result=result)


def _cut(draft: Draft, rows: int) -> Draft:
    """`draft` within `rows` query rows (the root's among them): without its aux branch where the root
    and the branch do not fit, then its tree's first nodes (parents come before their children)."""
    aux = 0 if draft.aux is None else int(draft.aux.tokens.shape[0])
    if 1 + len(draft.tree) + aux <= rows:
        return draft
    if 1 + aux > rows:
        draft, aux = Draft(draft.tree, calibrated=draft.calibrated), 0
    keep = rows - 1 - aux
    if len(draft.tree) <= keep:
        return draft
    return Draft(draft.tree.subtree(range(keep)), draft.aux, draft.aux_value, draft.calibrated)
