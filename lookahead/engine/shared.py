"""What the requests on one model share within a process: one object per (model, kind, label).

Requests of one kind of traffic learn things that outlive them: how often each source's guesses are
accepted (a Calibrator, engine/calibration.py) and which tokens the model predicts after which (the
recycled successors, candidates/recycling.py). A request that ends after 128 tokens has not learned
much of either, so the next request on the same model and label starts from what the earlier ones
learned. Objects are created on first use, held weakly by their model (dropped with it) and looked up
under a lock, so requests in several threads get the same one. Their updates are not locked: two
requests updating at once may lose a count or keep an older row, which changes which guesses are
offered, never a token (verification decides every token).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_shared: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], Any]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def shared(owner: Any, kind: str, label: str, factory: Callable[[], T]) -> T:
    """The `kind` object that every request on `owner` (a model) labelled `label` shares in this process,
    made by `factory` on first use. Label requests whose statistics differ (another strategy, sampled
    against greedy text, another request class) apart."""
    with _lock:
        per_owner = _shared.setdefault(owner, {})
        key = (kind, label)
        if key not in per_owner:
            per_owner[key] = factory()
        return per_owner[key]  # type: ignore[no-any-return]


def shared_items(owner: Any) -> dict[tuple[str, str], Any]:
    """Every object shared on `owner`, by (kind, label) (a copy of the mapping, not of the objects)."""
    with _lock:
        return dict(_shared.get(owner, {}))


def put_shared(owner: Any, kind: str, label: str, value: Any) -> None:
    """Make `value` the `kind` object that requests on `owner` labelled `label` share from now on
    (lookahead/learned.py restores what an earlier process learned). Requests already running keep theirs."""
    with _lock:
        _shared.setdefault(owner, {})[(kind, label)] = value


def reset_shared() -> None:
    """Forget everything requests share: the next request on each model starts from the priors again
    (for runs whose step structure must not depend on what ran before them in the process)."""
    with _lock:
        _shared.clear()
