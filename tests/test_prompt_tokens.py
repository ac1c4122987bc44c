"""``EnsembleEngine.prompt_tokens``: the most prompt tokens any member reads for a request, each in its
own format, as the request's start renders it (what the adapters' token counts give)."""

from __future__ import annotations

import copy

import pytest

from shared_engine import EnsembleEngine, InvalidRequestError
from shared_engine.members import HFMember
from shared_engine.members.chat import render_plain
from tests.toy import byte_level_tokenizer, tiny_llama, toy_member

STRICT = ("{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('roles must alternate') }}{% endif %}"
          "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>{% endif %}")

MESSAGES = [{"role": "user", "content": "Tom walked to the park. " * 4}, {"role": "assistant", "content": "ok"}]


def test_the_count_is_the_largest_member_rendering() -> None:
    members = [toy_member("count-bpe", "byte_level", "llama", 0), toy_member("count-sp", "metaspace", "llama", 1)]
    engine = EnsembleEngine(members)
    assert engine.prompt_tokens(MESSAGES) == max(len(m.prompt_ids(MESSAGES)) for m in members)
    text = "Tom walked to the park."
    assert engine.prompt_tokens(text, raw_prompt=True) == max(len(m.text_prompt_ids(text)) for m in members)
    assert engine.prompt_tokens([]) == 0 == engine.prompt_tokens("")
    with pytest.raises(InvalidRequestError, match="raw prompt"):
        engine.prompt_tokens(MESSAGES, raw_prompt=True)


def test_messages_a_strict_template_refuses_count_in_the_plain_format() -> None:
    """A trimmer counts cut histories (LangChain's trim_messages counts the newest turns in reverse):
    a template that refuses them must not make the count fail."""
    tokenizer = copy.deepcopy(byte_level_tokenizer())  # the toy builder is cached: other tests read its template
    tokenizer.chat_template = STRICT
    strict = HFMember("count-strict", tiny_llama(tokenizer), tokenizer)
    engine = EnsembleEngine([strict], method="single")
    cut = MESSAGES[::-1]  # assistant first: refused
    with pytest.raises(InvalidRequestError, match="refuses"):
        strict.prompt_ids(cut)
    assert engine.prompt_tokens(cut) == len(strict.text_prompt_ids(render_plain(cut)))
    assert engine.prompt_tokens(MESSAGES) == len(strict.prompt_ids(MESSAGES))
