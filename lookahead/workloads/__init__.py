"""Benchmark workloads: the JSONL request format and a builder of public workloads from PyPI wheels."""

from lookahead.workloads.format import Request, WorkloadError, load_workloads, parse_lines, parse_workload

__all__ = ["Request", "WorkloadError", "load_workloads", "parse_lines", "parse_workload"]
