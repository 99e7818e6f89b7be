"""What requests learned, kept across processes (lookahead/learned.py): the calibrator's and the
successor table's files, restoring them into a model's shared state, and `generate --learned`."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import lookahead
from lookahead.candidates.recycling import SuccessorTable
from lookahead.cli.main import main
from lookahead.engine.calibration import CalibrationConfig, Calibrator, shared_calibrator
from lookahead.engine.shared import reset_shared, shared
from lookahead.engine.sources import Candidate
from lookahead.errors import ConfigError
from lookahead.learned import export_learned, load_learned, save_learned
from lookahead.testing import tiny_model

LABEL = "lookahead/greedy"  # what generate() shares for default (greedy lookahead) requests


def test_a_calibrator_read_back_estimates_exactly_as_the_one_written() -> None:
    cal = Calibrator(CalibrationConfig(decay=0.9, agreement=True))
    tracker = cal.tracker()
    tracker.offer([Candidate((5, 6, 7), "recycle", 1), Candidate((5, 8), "context", 3), Candidate((4,), "recycle", 2)])
    tracker.record([5, 6, 9])  # recycle/1: depths 1, 2 hit, 3 missed; context/3: 1 hit, 2 missed; recycle/2 missed
    cal.observe_siblings([0.7, 0.2], hit_rank=0)
    cal.observe_siblings([0.6], hit_rank=None, agreed=[True])  # a first token two sources proposed
    cal.observe_confidence("recycle", 1, 6, 0.4, hit=True)  # a token the model was sure of, right
    back = Calibrator.from_json(json.loads(json.dumps(cal.to_json())), CalibrationConfig(decay=0.9, agreement=True))
    assert back.reached == cal.reached and back.hits == cal.hits
    # Seen keys, and unseen features that back off to their source's other features at that depth.
    for key in [("recycle", 1, 3), ("context", 3, 2), ("recycle", 2, 1), ("recycle", 7, 1), ("context", 0, 1)]:
        assert back.conditional(*key) == pytest.approx(cal.conditional(*key), abs=1e-12), key
    assert back.sibling_factor(0) == pytest.approx(cal.sibling_factor(0)) != 1.0
    assert back.sibling_factor(0, agreed=True) == pytest.approx(cal.sibling_factor(0, agreed=True)) != 1.0
    assert back.confidence_factor("recycle", 1, 6) == pytest.approx(cal.confidence_factor("recycle", 1, 6)) != 1.0
    assert not back.empty and Calibrator().empty
    older = {k: v for k, v in cal.to_json().items() if k != "confidence"}  # a file written before the factors
    assert Calibrator.from_json(older).confidence_factor("recycle", 1, 6) == 1.0


def test_a_successor_table_read_back_walks_and_forgets_as_the_one_written() -> None:
    table = SuccessorTable(top_k=3, order=2, max_contexts=2)
    table.adj.update({7: (8, 9), 8: (7,)})
    table.confirmed[7] = 8
    table.write_key((1, 7), (9, 8))  # oldest keyed row
    table.write_key((2, 7), (8,))
    back = SuccessorTable.from_json(json.loads(json.dumps(table.to_json())), vocab=10,
                                    into=SuccessorTable(top_k=3, order=2, max_contexts=2))
    assert (back.adj, back.confirmed, back.top_k, back.order) == (table.adj, table.confirmed, 3, 2)
    assert back.row((1,), 7) == ((9, 8), 2) and back.row((5,), 7) == ((8, 9), 1)
    # The least recently written keyed row is still the first to go.
    for t in (table, back):
        t.write_key((3, 7), (7,))
    assert list(back.contexts) == list(table.contexts) == [(2, 7), (3, 7)]


@pytest.mark.parametrize("broken, needle", [
    ({"adj": [[12, [1]]]}, "below 10"),  # a token outside the model's vocabulary
    ({"adj": [[1, [2, 3, 4, 5]]]}, "0..3"),  # a row longer than the file's own top_k
    ({"contexts": [[[1], [2]]]}, "want 2.."),  # a keyed row without its preceding token
    ({"adj": [[1, ["2"]]]}, "bad token ids"),  # a string is not a token id
    ({"top_k": float("inf")}, "top_k must be an integer"),
])
def test_a_successor_table_from_another_vocabulary_or_shape_is_refused(broken: dict, needle: str) -> None:
    data = {**SuccessorTable(top_k=3, order=2).to_json(), **broken}
    with pytest.raises(ValueError, match=needle):
        SuccessorTable.from_json(data, vocab=10)


def test_a_table_is_read_into_todays_settings_not_the_files() -> None:
    # Written by a table of top-12 rows at order 3; read into the default (top-8, order 2) that the
    # recycle source is built for: rows are cut to 8 and the rows keyed by two preceding tokens left out.
    old = SuccessorTable(top_k=12, order=3)
    old.adj[5] = tuple(range(12))
    old.write_key((1, 5), (7,))
    old.write_key((0, 1, 5), (8,))
    back = SuccessorTable.from_json(old.to_json())
    assert (back.top_k, back.order) == (8, 2)
    assert back.adj[5] == tuple(range(8)) and dict(back.contexts) == {(1, 5): (7,)}


@pytest.mark.parametrize("entry", [
    ["recycle", 0, 1, 3.0, 2.0],  # more hits than tries
    ["recycle", 0, 1, 1.0, float("inf")],  # not finite
    ["recycle", 0, 1, "1", 2.0],  # a string is not a count
    ["recycle", True, 1, 1.0, 2.0],  # nor is a bool a feature
])
def test_a_calibrator_entry_that_no_calibrator_writes_is_refused(entry: list) -> None:
    with pytest.raises(ValueError, match="calibration entry"):
        Calibrator.from_json({"keys": [entry], "siblings": []})
    with pytest.raises(ValueError, match="repeated"):  # the backoff's sums would count it twice
        Calibrator.from_json({"keys": [["recycle", 0, 1, 1.0, 2.0]] * 2, "siblings": []})
    with pytest.raises(ValueError, match="sibling entry"):  # ranks 0..3, and 4..7 for agreed first tokens
        Calibrator.from_json({"keys": [], "siblings": [[8, 0.5, 0.0]]})
    for bad in (["recycle", 3, 6, 1.0, 0.0],  # depths are 1 or 2 (for 2+)
                ["recycle", 1, -1, 1.0, 0.0],  # no negative bucket
                ["recycle", 1, 6, -1.0, 0.0]):  # nor a negative count
        with pytest.raises(ValueError, match="confidence entry"):
            Calibrator.from_json({"keys": [], "siblings": [], "confidence": [bad]})
    with pytest.raises(ValueError, match="repeated"):
        Calibrator.from_json({"keys": [], "siblings": [], "confidence": [["recycle", 1, 6, 1.0, 0.0]] * 2})


def _learn(lm: lookahead.LoadedModel) -> None:
    lookahead.generate(lm, "the cat sat on the mat, the cat sat on the mat", raw=True, max_new_tokens=24)


def test_a_saved_state_is_what_the_next_process_shares(tmp_path: Path) -> None:
    lm = tiny_model("llama")
    _learn(lm)
    saved = {label: {kind: obj.to_json() for kind, obj in kinds.items()} for label, kinds in export_learned(lm).items()}
    path = tmp_path / "learned.json"
    save_learned(lm, path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # statistics of users' text: owner-only
    assert list(json.loads(path.read_text())["labels"]) == [LABEL]  # autoregressive's empty calibrator is left out

    reset_shared()  # a new process: nothing shared yet
    assert shared_calibrator(lm.model, LABEL).empty
    assert load_learned(lm, path) == [LABEL]
    assert shared_calibrator(lm.model, LABEL).to_json() == saved[LABEL]["calibrator"]
    assert shared(lm.model, "successors", LABEL, SuccessorTable).to_json() == saved[LABEL]["successors"]
    # ... and what a request then uses: tokens as autoregressive decoding's, the file's state learning on.
    prompt = "a b c a b c a b"
    ar = lookahead.generate(lm, prompt, raw=True, max_new_tokens=16, strategy="autoregressive")
    la = lookahead.generate(lm, prompt, raw=True, max_new_tokens=16)
    assert la.token_ids == ar.token_ids
    assert shared_calibrator(lm.model, LABEL).to_json() != saved[LABEL]["calibrator"]


def test_a_file_learned_on_another_model_is_refused(tmp_path: Path) -> None:
    lm = tiny_model("llama")
    _learn(lm)
    path = tmp_path / "learned.json"
    save_learned(lm, path)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "model": "someone-else"}))
    with pytest.raises(ConfigError, match="learned on someone-else .* use a file per model"):
        load_learned(lm, path)
    path.write_text(json.dumps({**data, "labels": {LABEL: ["not", "kinds"]}}))
    with pytest.raises(ConfigError, match="not valid learned state"):
        load_learned(lm, path)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read learned-state file"):
        load_learned(lm, path)
    with pytest.raises(ConfigError, match="no learned-state file"):
        load_learned(lm, tmp_path / "missing.json")


def test_generate_learned_reads_and_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "learned.json"
    argv = ["generate", "the cat sat on the mat, the cat sat", "--model", "tiny:llama", "--raw", "--json",
            "--max-new-tokens", "16", "--learned", str(path)]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    written = json.loads(path.read_text())
    assert written["model"] == "tiny-llama" and LABEL in written["labels"]
    reset_shared()  # the second run is a new process
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["token_ids"] == first["token_ids"]
    assert json.loads(path.read_text())["labels"] != written["labels"]  # it learned on from the file


@pytest.mark.parametrize("where", ["missing-folder/l.json", "a-file/l.json", "a-folder", "corrupt.json"])
def test_generate_learned_that_cannot_be_read_or_written_exits_2_before_loading(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "corrupt.json").write_text("{not json")
    # The model does not exist either: the file is checked first, so the error names the file.
    assert main(["generate", "hi", "--model", "/nonexistent/model", "--learned", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / where) in err and "learned-state file" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
