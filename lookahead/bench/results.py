"""results.jsonl: one row per (request, strategy, repeat), appended and flushed as measured.

A rerun of the same command skips the rows already there. A row cut short by an interrupt (the
only way a line can be incomplete) is removed on the next start and measured again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lookahead.errors import ConfigError

RESULTS = "results.jsonl"
RUN = "run.json"

ROW_FIELDS = (
    "request_id", "class", "strategy", "repeat", "greedy", "max_new_tokens", "prompt_tokens", "new_tokens",
    "steps", "tokens_per_step", "guesses_verified", "guesses_accepted", "acceptance_rate", "prefill_s",
    "decode_s", "total_s", "ttft_s", "device_s", "cpu_s", "processed_tokens", "wasted_fraction",
    "finish_reason", "output_sha256", "identical", "reference",
)

Key = tuple[str, str, int]


def row_key(row: dict[str, Any]) -> Key:
    return (str(row["request_id"]), str(row["strategy"]), int(row["repeat"]))


class ResultsFile:
    """Append-only results with resume. Use as a context manager."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.path = directory / RESULTS
        self.rows: list[dict[str, Any]] = []
        self.keys: set[Key] = set()
        self.dropped_partial = False
        self._fh: Any = None

    def check_run(self, fingerprint: dict[str, Any]) -> None:
        """Refuse to mix rows measured under different settings in one directory."""
        run = self.dir / RUN
        if run.is_file():
            try:
                old = json.loads(run.read_text(encoding="utf-8"))
            except ValueError:
                old = None
            if old != fingerprint:
                raise ConfigError(
                    f"{self.dir} holds a run with other settings ({old}); rerun with those settings to "
                    f"resume, or give a new --out"
                )
        else:
            self.dir.mkdir(parents=True, exist_ok=True)
            run.write_text(json.dumps(fingerprint, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    def load(self) -> None:
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        good_end = 0
        pos = 0
        lineno = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            lineno += 1
            if nl < 0:  # an incomplete last line: cut by an interrupt mid-write
                break
            line = data[pos:nl]
            pos = nl + 1
            if line.strip():
                try:
                    row = json.loads(line)
                    key = row_key(row)
                except (ValueError, KeyError, TypeError) as exc:
                    if pos >= len(data):  # a garbled last line is the same interrupted write
                        break
                    raise ConfigError(
                        f"{self.path}:{lineno} is not a valid result row ({exc}); delete that line or use a new --out"
                    ) from None
                if key not in self.keys:
                    self.keys.add(key)
                    self.rows.append(row)
            good_end = pos
        if good_end < len(data):
            self.dropped_partial = True
            with self.path.open("r+b") as fh:
                fh.truncate(good_end)

    def __enter__(self) -> ResultsFile:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def append(self, row: dict[str, Any]) -> None:
        key = row_key(row)
        if key in self.keys:
            raise RuntimeError(f"row {key} measured twice")  # a bug in the scheduler, never user input
        self._fh.write(json.dumps(row, sort_keys=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.keys.add(key)
        self.rows.append(row)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every complete row of a results file (for reports and tests)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def unique(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[Key] = set()
    out = []
    for r in rows:
        k = row_key(r)
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out
