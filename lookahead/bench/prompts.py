"""The six fixed prompts of the prompt benchmark (benchmarks/bench_prompts.py), named a-f, shared
with the real-model identity tests."""

from __future__ import annotations

PROMPTS = {
    "a": "Write a Python function that checks whether a number is prime, with a docstring and three doctests.",
    "b": "Write a Python class Stack with push, pop, peek, is_empty and __len__, fully type-annotated.",
    "c": "Convert this to JSON with keys name, age, city, email for each person: Alice Smith, 34, Paris, "
         "alice@example.com; Bob Jones, 28, Berlin, bob@example.com; Carol White, 45, Madrid, carol@example.com; "
         "Dan Brown, 39, Rome, dan@example.com.",
    "d": "Explain what a hash table is to a beginner in two short paragraphs.",
    "e": "Write a short poem about the sea at night.",
    "f": "List the numbers from 1 to 40, one per line, each followed by its square.",
}
