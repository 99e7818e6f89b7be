"""How prompts become token ids: chat messages go through the tokenizer's chat template, and where it has
none (a base model, such as the embedded gemma3-270m) through a plain transcript, so the bench's chat
workloads and the server's chat endpoint run on such a model instead of failing in transformers."""

from __future__ import annotations

import copy
from dataclasses import replace

from lookahead.models.loader import LoadedModel, plain_transcript
from lookahead.server.prepare import encode_chat
from lookahead.server.schemas import ChatCompletionRequest
from lookahead.testing import tiny_model

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def _without_template() -> LoadedModel:
    lm = tiny_model("llama")
    tokenizer = copy.deepcopy(lm.tokenizer)
    tokenizer.chat_template = None
    return replace(lm, tokenizer=tokenizer)


def test_the_transcript_names_each_turn_and_ends_with_the_assistants_cue() -> None:
    assert plain_transcript(MESSAGES) == "System: Be brief.\n\nUser: Hi there\n\nAssistant:"
    assert plain_transcript([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                             {"role": "user", "content": "c"}]) == "User: a\n\nAssistant: b\n\nUser: c\n\nAssistant:"


def test_messages_without_a_chat_template_encode_as_the_transcript() -> None:
    lm = _without_template()
    expected = lm.tokenizer(plain_transcript(MESSAGES), add_special_tokens=True)["input_ids"]
    assert lm.encode(MESSAGES) == list(expected)
    # a plain string is still the text itself, not a one-message transcript
    assert lm.encode("Hi there") == list(lm.tokenizer("Hi there", add_special_tokens=True)["input_ids"])


def test_messages_with_a_chat_template_still_go_through_it() -> None:
    lm = tiny_model("llama")
    templated = lm.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    if hasattr(templated, "keys"):
        templated = templated["input_ids"]
    assert lm.encode(MESSAGES) == [int(t) for t in templated]
    assert lm.encode(MESSAGES) != _without_template().encode(MESSAGES)


def test_the_chat_endpoint_encodes_for_a_model_without_a_template() -> None:
    lm = _without_template()
    body = ChatCompletionRequest(model=lm.name, messages=[{"role": "developer", "content": "Be brief."},
                                                          {"role": "user", "content": "Hi there"}])
    assert encode_chat(lm, body) == lm.encode(MESSAGES)  # "developer" is the system role
