"""Each member reads the prompt in its own format, exactly as its tokenizer renders it (issue #16).

- A member with a chat template gets what ``apply_chat_template(..., tokenize=True,
  add_generation_prompt=True)`` gives: no second BOS in front of a template that has its own
  (or that has none on purpose).
- A member without one gets the plain ``User:/Assistant:`` format, which ends like a chat
  template's generation prompt: on a new line, so the answer's first word (written without a
  leading space by a chat drafter after ``assistant\\n``) reads naturally for every member.
- The answer's first token is read the same way by every member: the prompt ids followed by the
  member's tokenization of the answer are what its tokenizer makes of prompt + answer as one text.

On the toy tokenizers always, and on the three zoo tokenizers when their converted folders exist
(as in test_alignment.py).
"""

from __future__ import annotations

import copy
from functools import cache

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from shared_engine import zoo
from shared_engine.alignment import TokenTable
from shared_engine.members.chat import render_plain, render_prompt_ids
from tests import toy
from tests.test_alignment import REAL_NAMES

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "Count to 3."}],
]
ANSWERS = ["The answer is 4.", "42", "Sure! Here", "To find 17 + 25, add.", "- first"]
"""Answers as a drafter starts them after a generation prompt: with a word, no leading whitespace."""


@cache
def _metaspace_with_template() -> PreTrainedTokenizerBase:
    """A tokenizer whose post-processor adds BOS, with a chat template that does not start with
    it (as some instruction-tuned SentencePiece models ship): rendering text, then tokenizing it
    with special tokens, used to put a BOS the template never asked for in front."""
    tokenizer = copy.deepcopy(toy.metaspace_tokenizer())
    tokenizer.chat_template = toy.CHATML_TEMPLATE
    return tokenizer


@cache
def _tokenizer(key: str) -> PreTrainedTokenizerBase:
    if key == "metaspace+template":
        return _metaspace_with_template()
    if key in toy.TOKENIZERS:
        return toy.TOKENIZERS[key]()
    return AutoTokenizer.from_pretrained(str(zoo.tokenizer_dir(key, progress=False)))


KEYS = (*toy.TOKENIZERS, "metaspace+template", *REAL_NAMES)


def _prompt_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> str:
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return render_plain(messages)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_prompt_ids_are_the_members_own_rendering(key: str, messages: list[dict[str, str]]) -> None:
    tokenizer = _tokenizer(key)
    ids = render_prompt_ids(tokenizer, messages)
    if tokenizer.chat_template:
        expected = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                 return_dict=True)["input_ids"]
        assert ids == list(expected)
    else:  # the plain format, with the tokenizer's own special tokens (its BOS, once)
        assert ids == list(tokenizer(render_plain(messages))["input_ids"])
    bos = tokenizer.bos_token_id
    if bos is not None:
        assert ids[:2] != [bos, bos], "a second BOS in front of the prompt"


def test_the_plain_format_ends_on_a_new_line_like_a_chat_template() -> None:
    """A chat drafter writes its first word without a leading space after ``assistant\\n``; a
    plain-format member must read that answer as a natural continuation (``Assistant:\\nThe``, not
    ``Assistant:The``), and a plain-format drafter must not start the answer with a space that
    every chat member would then read after its newline."""
    text = render_plain(CONVERSATIONS[0])
    assert text.endswith("\nAssistant:\n")
    chatml = toy.byte_level_tokenizer().apply_chat_template(CONVERSATIONS[0], tokenize=False,
                                                            add_generation_prompt=True)
    assert chatml.endswith("\n") and text.endswith("\n")


def test_the_plain_generation_prompt_starts_an_assistant_turn_as_the_exemplars_show_them() -> None:
    """Rendering the conversation plus an answer gives the generation prompt followed by that
    answer, as a chat template does: a few-shot base model then reads its turn as it read the
    exemplars' (before the fix, exemplars read ``Assistant: France`` and the prompt ended
    ``Assistant:\n``, so Gemma-3-270m took the turn for an empty one and wrote ``User:``)."""
    shots = [{"role": "system", "content": "Answer briefly."},
             {"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris"},
             {"role": "user", "content": "Capital of Italy?"}]
    prompt = render_plain(shots)
    answered = render_plain([*shots, {"role": "assistant", "content": "Rome"}])
    assert answered.startswith(prompt + "Rome\n")
    assert "Assistant:\nParis\nUser: Capital of Italy?\nAssistant:\n" in prompt


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("answer", ANSWERS)
def test_every_member_reads_the_first_answer_token_as_its_tokenizer_would(key: str, answer: str) -> None:
    """Prompt ids + the member's tokenization of the answer == the tokenizer's reading of prompt +
    answer as one text: the prompt ends on a token boundary the answer does not merge across."""
    tokenizer = _tokenizer(key)
    messages = CONVERSATIONS[0]
    table = TokenTable(tokenizer)
    prompt_ids = render_prompt_ids(tokenizer, messages)
    whole = tokenizer(_prompt_text(tokenizer, messages) + answer,
                      add_special_tokens=not tokenizer.chat_template)["input_ids"]
    assert prompt_ids + table.encode_fragment(answer) == list(whole)


STRICT_TEMPLATE = (  # Gemma-3-it's rules: a system turn only first, then user and assistant alternating
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{{ '<start_of_turn>system\n' + messages[0]['content'] + '<end_of_turn>\n' }}"
    "{% else %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


def test_a_strict_template_takes_the_engines_own_turns() -> None:
    """A structured-output retry ([user, system, assistant, user]) and a tool-result hint (two user
    turns) made a template that wants alternating turns (Gemma-3-it, Mistral) raise a raw jinja error
    (the server answered 500); the turns are joined as such a template takes them."""
    from shared_engine.tools import OutputOptions, OutputPlan

    tokenizer = copy.deepcopy(toy.byte_level_tokenizer())
    tokenizer.chat_template = STRICT_TEMPLATE
    retry = OutputPlan(OutputOptions(response_format={"type": "json_object"})).messages(
        [{"role": "user", "content": "Give me JSON."}], [("{", "unterminated")])
    assert [m["role"] for m in retry] == ["user", "system", "assistant", "user"]
    text = tokenizer.decode(render_prompt_ids(tokenizer, retry))
    assert text.count("<start_of_turn>user") == 2 and "Give me JSON.\n\nAnswer with one JSON object" in text
    hint = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Let me look."},
            {"role": "user", "content": "sunny"}, {"role": "user", "content": "Answer in plain text."}]
    assert "sunny\n\nAnswer in plain text." in tokenizer.decode(render_prompt_ids(tokenizer, hint))
    # a conversation no joining makes acceptable is refused readably, not as a jinja error
    from shared_engine.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="chat template refuses"):
        render_prompt_ids(tokenizer, [{"role": "assistant", "content": "Hi."}])
