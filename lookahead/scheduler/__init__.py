"""Continuous batching: many requests' decoding steps in one forward pass.

`Request` (request.py) is one request's decoding state: its candidate sources, its sampler, its stop
rules and statistics. `Scheduler` (scheduler.py) runs one step for every active request in one pass of
the engine (engine/step.py), sizing every request's speculation under one budget
(engine/allocator.py), and admits and retires requests between steps. A single request is the
batch-of-one case (lookahead/generation.py).
"""
