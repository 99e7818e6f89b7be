"""The decoding engine: the step routine (query -> forward -> verify -> compact KV), the allocator that
sizes each step from calibrated guesses and the device's cost curve, the numerics that keep steps exact.

The engine defines the interface candidate sources implement (engine/sources.py, engine/draft.py) and
never imports a source: the generation loop (lookahead/generation.py) ties the two together.
"""
