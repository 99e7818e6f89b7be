"""The workload JSONL parser: valid lines, malformed lines, unknown classes, missing fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lookahead.workloads.format import Request, WorkloadError, load_workloads, parse_line, parse_lines, parse_workload


def lines(*objs: object) -> list[str]:
    return [o if isinstance(o, str) else json.dumps(o) for o in objs]


def test_valid_lines_parse_with_all_optional_fields() -> None:
    reqs = parse_lines(lines(
        {"id": "a", "class": "code", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
         "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": 3, "seed": 11, "meta": {"k": 1},
         "some_future_field": [1, 2]},
        "",
        {"id": 7, "class": "raw", "prompt": "continue this"},
    ))
    assert [r.id for r in reqs] == ["a", "7"]
    a, b = reqs
    assert a.messages == (("system", "s"), ("user", "u")) and a.prompt is None
    assert (a.max_tokens, a.temperature, a.top_p, a.top_k, a.seed, a.meta) == (5, 0.7, 0.9, 3, 11, {"k": 1})
    assert not a.greedy and a.effective_seed == 11
    assert b.prompt == "continue this" and b.messages is None and b.greedy
    assert a.source == "<workload>:1" and b.source == "<workload>:3"


def test_malformed_lines_are_all_reported_with_line_numbers() -> None:
    text = lines(
        {"id": "ok", "class": "c", "prompt": "x"},
        "{not json",
        {"id": "ok2", "class": "c", "prompt": "y"},
        "[1, 2]",
        '{"id": "z", "class": "c", "prompt": "unterminated',
    )
    with pytest.raises(WorkloadError) as exc:
        parse_lines(text, name="w.jsonl")
    msg = str(exc.value)
    assert "3 invalid line(s) in w.jsonl" in msg
    assert "w.jsonl:2: not valid JSON" in msg
    assert "w.jsonl:4: a line must be a JSON object" in msg
    assert "w.jsonl:5: not valid JSON" in msg
    assert "w.jsonl:1" not in msg and "w.jsonl:3" not in msg


@pytest.mark.parametrize("obj, expected", [
    ({"class": "c", "prompt": "x"}, "missing field(s): id"),
    ({"id": "a", "prompt": "x"}, "missing field(s): class"),
    ({"id": "a", "class": "c"}, "missing field(s): messages or prompt"),
    ({}, "missing field(s): id, class, messages or prompt"),
    ({"id": "a", "class": "c", "prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "give either 'messages' or 'prompt', not both"),
    ({"id": "", "class": "c", "prompt": "x"}, "'id' must be"),
    ({"id": True, "class": "c", "prompt": "x"}, "'id' must be"),
    ({"id": "a", "class": "has space", "prompt": "x"}, "'class' must be"),
    ({"id": "a", "class": "c", "prompt": "   "}, "'prompt' must be a non-empty string"),
    ({"id": "a", "class": "c", "messages": []}, "'messages' must be a non-empty list"),
    ({"id": "a", "class": "c", "messages": [{"role": "user"}]}, "messages[0] must be an object with 'role' and 'content'"),
    ({"id": "a", "class": "c", "messages": [{"role": "bot", "content": "x"}]}, "messages[0].role is 'bot'"),
    ({"id": "a", "class": "c", "messages": [{"role": "user", "content": 3}]}, "messages[0].content must be a string"),
    ({"id": "a", "class": "c", "messages": [{"role": "user", "content": " "}]}, "'messages' has no text in it"),
    ({"id": "a", "class": "c", "prompt": "x", "max_tokens": 0}, "'max_tokens' must be an integer >= 1"),
    ({"id": "a", "class": "c", "prompt": "x", "max_tokens": 2.5}, "'max_tokens' must be an integer >= 1"),
    ({"id": "a", "class": "c", "prompt": "x", "temperature": -0.1}, "'temperature' must be a number >= 0"),
    ({"id": "a", "class": "c", "prompt": "x", "temperature": "hot"}, "'temperature' must be a number >= 0"),
    ({"id": "a", "class": "c", "prompt": "x", "top_p": 0}, "'top_p' must be a number in (0, 1]"),
    ({"id": "a", "class": "c", "prompt": "x", "top_k": -1}, "'top_k' must be an integer >= 0"),
    ({"id": "a", "class": "c", "prompt": "x", "seed": -1}, "'seed' must be an integer in [0, 2**63)"),
    ({"id": "a", "class": "c", "prompt": "x", "meta": [1]}, "'meta' must be an object"),
])
def test_bad_fields_are_named(obj: dict, expected: str) -> None:
    with pytest.raises(WorkloadError) as exc:
        parse_lines([json.dumps(obj)], name="f.jsonl")
    assert f"f.jsonl:1: {expected}" in str(exc.value)


def test_unknown_class_is_rejected_when_classes_are_known() -> None:
    good = {"id": "a", "class": "code", "prompt": "x"}
    bad = {"id": "b", "class": "poetry", "prompt": "x"}
    assert len(parse_lines(lines(good, bad))) == 2  # no class list: any well-formed name
    with pytest.raises(WorkloadError) as exc:
        parse_lines(lines(good, bad), name="w", classes={"code", "chat"})
    assert "w:2: unknown class 'poetry'; this workload's classes are chat, code" in str(exc.value)


def test_directory_with_manifest_checks_classes_and_ids(tmp_path: Path) -> None:
    d = tmp_path / "wl"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"sources": [{"class": "code"}, {"class": "chat"}]}))
    (d / "code.jsonl").write_text(json.dumps({"id": "1", "class": "code", "prompt": "x"}) + "\n")
    (d / "chat.jsonl").write_text(json.dumps({"id": "2", "class": "chat", "prompt": "y"}) + "\n")
    assert sorted(r.id for r in load_workloads([d])) == ["1", "2"]
    (d / "extra.jsonl").write_text(json.dumps({"id": "3", "class": "math", "prompt": "z"}) + "\n")
    with pytest.raises(WorkloadError, match=r"extra.jsonl:1: unknown class 'math'"):
        load_workloads([d])
    (d / "extra.jsonl").unlink()
    other = tmp_path / "other.jsonl"
    other.write_text("\n" + json.dumps({"id": "1", "class": "code", "prompt": "again"}) + "\n")
    with pytest.raises(WorkloadError) as exc:
        load_workloads([d, other])
    assert "duplicate request ids" in str(exc.value) and "other.jsonl:2" in str(exc.value)


def test_missing_inputs_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="does not exist; build one with `lookahead workloads build`"):
        parse_workload(tmp_path / "nope.jsonl")
    with pytest.raises(WorkloadError, match="has no \\*.jsonl files"):
        load_workloads([tmp_path])
    with pytest.raises(WorkloadError, match="no workload given"):
        load_workloads([])


def test_many_errors_are_capped_but_counted() -> None:
    with pytest.raises(WorkloadError) as exc:
        parse_lines(["nope"] * 30, name="w")
    msg = str(exc.value)
    assert msg.startswith("30 invalid line(s) in w") and "... and 10 more" in msg and "w:20:" in msg and "w:21:" not in msg


def test_effective_seed_is_stable_and_in_range() -> None:
    r = Request(id="hellaswag/1", cls="x", prompt="p", temperature=1.0)
    assert r.effective_seed == Request(id="hellaswag/1", cls="y", prompt="q").effective_seed
    assert r.effective_seed != Request(id="hellaswag/2", cls="x", prompt="p").effective_seed
    assert 0 <= r.effective_seed < 2**63


texts = st.text(min_size=1, max_size=30).filter(lambda s: s.strip() != "")


@given(
    rid=texts, content=texts, use_prompt=st.booleans(),
    max_tokens=st.none() | st.integers(1, 10_000), temperature=st.floats(0, 5),
    top_p=st.floats(0.01, 1.0), top_k=st.integers(0, 100), seed=st.none() | st.integers(0, 2**63 - 1),
)
def test_to_json_round_trips(rid: str, content: str, use_prompt: bool, max_tokens: int | None, temperature: float,
                             top_p: float, top_k: int, seed: int | None) -> None:
    obj = {"id": rid, "class": "c", "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
           "top_k": top_k, "seed": seed}
    obj.update({"prompt": content} if use_prompt else {"messages": [{"role": "user", "content": content}]})
    req = parse_line({k: v for k, v in obj.items() if v is not None})
    again = parse_line(json.loads(json.dumps(req.to_json())))
    assert again == req
