"""The capacity planner on hand-made summaries: every expected number is worked out in the comment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lookahead.bench.capacity import batching_factors, parse_rates, plan, render
from lookahead.cli.main import main
from lookahead.errors import ConfigError


def summary() -> dict:
    def s(ar: float, la: float) -> dict:
        return {"strategies": {"autoregressive": {"device_s_per_request": ar},
                               "lookahead": {"device_s_per_request": la}}}

    return {"classes": {"code": s(4.0, 2.0), "chat": s(3.0, 3.5)},
            "policy": {"default": {"strategy": "autoregressive"}, "classes": {"code": {"strategy": "lookahead"}}}}


def test_load_is_rate_times_device_seconds_and_replicas_round_up() -> None:
    # code: 1 req/s x 4.0 s = 4.0 busy devices AR; under the policy (lookahead) 1 x 2.0 = 2.0.
    # chat: 2 req/s x 3.0 s = 6.0 either way (the policy keeps chat autoregressive).
    # Totals 10.0 and 8.0; at 80% utilisation: ceil(10 / 0.8) = 13 and ceil(8 / 0.8) = 10.
    p = plan(summary(), {"code": 1.0, "chat": 2.0}, utilisation=0.8)
    assert (p.load_baseline, p.load_policy) == (10.0, 8.0)
    assert (p.replicas(p.load_baseline), p.replicas(p.load_policy)) == (13, 10)
    assert "13 without the policy" in render(p) and "10 with it (20% less device time)" in render(p)


def test_another_policy_file_replaces_the_recommended_one() -> None:
    # Everything on lookahead: code 1 x 2.0 + chat 2 x 3.5 = 9.0 (chat got dearer: 7.0 instead of 6.0).
    p = plan(summary(), {"code": 1.0, "chat": 2.0}, policy={"default": {"strategy": "lookahead"}})
    assert p.load_policy == 9.0


def test_batching_scales_each_class_by_its_modes_measured_ratio() -> None:
    levels = [{"mode": "batched-ar", "concurrency": 1, "device_s_per_request": 2.0},
              {"mode": "batched-ar", "concurrency": 8, "device_s_per_request": 0.5},
              {"mode": "batched", "concurrency": 1, "device_s_per_request": 1.6},
              {"mode": "batched", "concurrency": 8, "device_s_per_request": 0.8}]
    factors = batching_factors(levels, 8)
    assert factors == (0.25, 0.5)
    # code speculates: 1 x 2.0 x 0.5 = 1.0; chat stays AR: 2 x 3.0 x 0.25 = 1.5. Baseline: (4 + 6) x 0.25.
    p = plan(summary(), {"code": 1.0, "chat": 2.0}, batching=factors, concurrency=8)
    assert (p.load_baseline, p.load_policy) == (2.5, 2.5)
    with pytest.raises(ConfigError, match="no batched-ar level at concurrency 4"):
        batching_factors(levels, 4)


def test_a_quiet_fleet_still_needs_one_replica() -> None:
    p = plan(summary(), {"code": 0.001, "chat": 0.0})
    assert p.replicas(p.load_policy) == 1


@pytest.mark.parametrize(
    ("rates", "kwargs", "message"),
    [
        ({"math": 1.0}, {}, "no measurements for math"),
        ({"code": 1.0}, {"utilisation": 1.5}, "utilisation must be in"),
        ({"code": 1.0}, {"policy": {"default": {"strategy": "prompt_lookup"}}}, "no prompt_lookup measurements"),
    ],
)
def test_plans_that_cannot_be_made_say_why(rates: dict, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan(summary(), rates, **kwargs)


@pytest.mark.parametrize("text", ["code", "code=x", "code=-1", "code=0"])
def test_bad_mixes(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_rates(text)


def test_the_command_prints_a_table_and_one_json_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(summary()))
    assert main(["plan", "--summary", str(tmp_path), "--mix", "code=1,chat=2", "--utilisation", "0.8"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("| class |") and json.loads(out[-1])["replicas_policy"] == 10
    assert main(["plan", "--summary", str(tmp_path), "--mix", "code=1", "--concurrency", "8"]) == 2
