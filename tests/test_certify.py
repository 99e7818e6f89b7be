"""The faithfulness certificate (`lookahead generate --certify`) and the dtype choices on the CLI."""

from __future__ import annotations

import json

import pytest
import torch

import lookahead
from lookahead import SamplingConfig
from lookahead.cli.main import main
from lookahead.engine.certify import certify, reference_model
from lookahead.models import dtypes
from lookahead.testing import tiny_model


def test_certificate_counts_exactly_the_tokens_that_are_not_the_references_choice() -> None:
    # A float64 model's reference is a float64 copy: its own greedy output is certified clean; swap the
    # last token for the reference's second choice and exactly that token is reported, with the gap.
    lm = tiny_model("llama", dtype=torch.float64, seed=3)
    prompt = lm.encode("abcabc tick tock", raw=True)
    out = lookahead.generate(lm, prompt, max_new_tokens=16, strategy="autoregressive").token_ids
    clean = certify(lm.model, prompt, out)
    assert (clean.tokens, clean.mismatches, clean.first_mismatch, clean.max_gap) == (16, 0, None, 0.0)
    assert clean.reference_dtype == "float64"
    with torch.no_grad():
        logits = reference_model(lm.model)(torch.tensor([prompt + out[:15]])).logits[0, -1]
    second = int(torch.topk(logits, 2).indices[1])
    cert = certify(lm.model, prompt, out[:15] + [second])
    assert (cert.tokens, cert.mismatches, cert.first_mismatch) == (16, 1, 15)
    assert cert.max_gap == pytest.approx(float(logits.max() - logits[second]))
    # a token changed earlier also changes what the reference expects after it: counted from there
    early = certify(lm.model, prompt, out[:5] + [(out[5] + 1) % 256] + out[6:])
    assert early.first_mismatch == 5 and early.mismatches >= 1


def test_certificate_applies_the_requests_sampling_rule() -> None:
    lm = tiny_model("qwen2", dtype=torch.float64, seed=4)
    prompt = lm.encode("hello there", raw=True)
    sampling = SamplingConfig(temperature=1.0, top_k=20, seed=7)
    out = lookahead.generate(lm, prompt, max_new_tokens=12, sampling=sampling).token_ids
    assert certify(lm.model, prompt, out, sampling).mismatches == 0
    assert certify(lm.model, prompt, out, SamplingConfig(temperature=1.0, top_k=20, seed=8)).mismatches > 0


def test_bf16_output_is_certified_against_float32() -> None:
    lm = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    prompt = lm.encode("abcabcabc", raw=True)
    ar = lookahead.generate(lm, prompt, max_new_tokens=16, strategy="autoregressive")
    la = lookahead.generate(lm, prompt, max_new_tokens=16)
    a, b = certify(lm.model, prompt, ar.token_ids), certify(lm.model, prompt, la.token_ids)
    assert a.reference_dtype == "float32" and a == b  # the same sequence: exactly as faithful


def test_cli_certify_json(capsys) -> None:
    assert main(["generate", "abcabcabc", "--model", "tiny:llama", "--raw", "--json", "--certify",
                 "--max-new-tokens", "10"]) == 0
    out = json.loads(capsys.readouterr().out)
    cert = out["certificate"]
    assert cert["tokens"] == len(out["token_ids"]) == 10 and cert["reference_dtype"] == "float64"
    assert 0 <= cert["mismatches"] <= 10


def test_cli_certify_compare_prints_both(capsys) -> None:
    assert main(["generate", "abcabcabc", "--model", "tiny:llama", "--raw", "--compare", "--certify",
                 "--max-new-tokens", "10"]) == 0
    text = capsys.readouterr().out
    assert "faithfulness [autoregressive]:" in text and "faithfulness [lookahead]:" in text
    assert "exact, steps at least" in text or "exact, width floor 1" in text or "(float32, unpadded)" in text


def test_unsupported_dtype_on_this_device_is_one_line_naming_the_choices(monkeypatch, capsys) -> None:
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: frozenset())  # a CPU without bf16 kernels
    assert main(["generate", "hi", "--model", "tiny:llama", "--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: dtype bfloat16 is not supported on this device (cpu: no bfloat16 kernels); "
                   "choose one of auto, float32, float64")


def test_auto_resolves_to_float32_without_bf16_kernels(monkeypatch) -> None:
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: frozenset())
    assert dtypes.choose(object(), "any") == torch.float32  # no measurement needed
