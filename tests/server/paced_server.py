"""`python -m lookahead.server` for the SIGTERM tests, with barriers instead of timing.

Run as `python -m tests.server.paced_server [serve options]`. A request's steps run freely until one
has produced text (so the client has a first line to read); the next step then waits until the
moment named by LOOKAHEAD_TEST_PAUSE_UNTIL:

- "shutdown": SIGTERM has begun the graceful shutdown (uvicorn.Server.shutdown was entered), and, if
  LOOKAHEAD_TEST_RELEASE_FILE is set, that file exists (the test creates it when it has checked what
  it wants to see while the request is still in flight);
- "cancel": the grace period is over and the worker's cancel_all() has flagged the in-flight job.

So a request is certainly still running when that moment comes, on a fast machine as on a slow one.
Nothing in the package changes; only this process's copies of four functions are wrapped (the
engine's stream_events for the one-at-a-time worker, Scheduler.step for the batched one).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

import lookahead
from lookahead.scheduler.scheduler import Scheduler
from lookahead.server.__main__ import main
from lookahead.server.worker import ModelWorker

PAUSE_UNTIL = os.environ.get("LOOKAHEAD_TEST_PAUSE_UNTIL", "shutdown")
RELEASE_FILE = os.environ.get("LOOKAHEAD_TEST_RELEASE_FILE")
BARRIER_S = 60.0  # a barrier that never opens fails the request instead of hanging the test

moments = {"shutdown": threading.Event(), "cancel": threading.Event()}

_shutdown = uvicorn.Server.shutdown
_cancel_all = ModelWorker.cancel_all
_stream_events = lookahead.stream_events
_step = Scheduler.step


async def shutdown(self: uvicorn.Server, sockets: Any = None) -> None:
    moments["shutdown"].set()
    await _shutdown(self, sockets)


def cancel_all(self: ModelWorker) -> None:
    _cancel_all(self)  # flag first, then let the held step go: the worker must see the flag after it
    moments["cancel"].set()


def _wait_for_the_moment() -> None:
    if not moments[PAUSE_UNTIL].wait(BARRIER_S):
        raise RuntimeError(f"test barrier: {PAUSE_UNTIL!r} never came")
    end = time.monotonic() + BARRIER_S
    while RELEASE_FILE and not os.path.exists(RELEASE_FILE):
        if time.monotonic() > end:
            raise RuntimeError(f"test barrier: {RELEASE_FILE} never appeared")
        time.sleep(0.01)


def paced_stream_events(*args: Any, **kwargs: Any) -> Iterator[Any]:
    inner = _stream_events(*args, **kwargs)
    shown = held = False
    try:
        for event in inner:
            if shown and not held:  # the client has text to read: hold the next step
                held = True
                _wait_for_the_moment()
            yield event
            shown = shown or bool(event.text)
    finally:
        inner.close()


def paced_step(self: Scheduler) -> list[Any]:
    """The batched worker's steps, paced the same way: once a step has produced text, the next waits."""
    state = self.__dict__.setdefault("_paced", {"shown": False, "held": False})
    if state["shown"] and not state["held"]:
        state["held"] = True
        _wait_for_the_moment()
    events = _step(self)
    state["shown"] = state["shown"] or any(event.text for _, event in events)
    return events


uvicorn.Server.shutdown = shutdown  # type: ignore[method-assign]
Scheduler.step = paced_step  # type: ignore[method-assign]
ModelWorker.cancel_all = cancel_all  # type: ignore[method-assign]
lookahead.stream_events = paced_stream_events  # the worker looks it up when the app is created

if __name__ == "__main__":
    sys.exit(main())
