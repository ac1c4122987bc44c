"""Rendering chat messages into each member's own prompt format.

Each member reads the conversation through its *own* chat template (the ensemble shares the
answer text, not the prompt tokens). Base models without a template (Gemma-3-270m) get a plain
documented format; its turn marker doubles as a stop string so a base model does not write the
user's next turn.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from ..errors import InvalidRequestError
from ..tools import template_renders_tools, with_tools_system

Message = Mapping[str, Any]
ROLES = ("system", "user", "assistant", "tool")

ASSISTANT_TURN = "Assistant:\n"
"""How the plain format opens an assistant turn, earlier ones and the one to generate alike."""

PLAIN_TEMPLATE_STOPS = ("\nUser:",)
"""Stop strings implied by the plain template: a base model would go on to write the next turn."""


def normalize_messages(messages_or_prompt: str | Sequence[Message]) -> list[dict[str, Any]]:
    """Accept a prompt string or OpenAI-style messages; reject what no template can render.

    An assistant message may carry OpenAI-style ``tool_calls`` (its content may then be None or
    empty); ``tool`` messages hold tool results. ``tools.tool_history_as_text`` renders both."""
    if isinstance(messages_or_prompt, str):
        if not messages_or_prompt.strip():
            raise InvalidRequestError("the prompt is empty")
        _check_encodable(messages_or_prompt, "the prompt")
        return [{"role": "user", "content": messages_or_prompt}]
    if not isinstance(messages_or_prompt, Sequence) or isinstance(messages_or_prompt, (bytes, bytearray)):
        raise InvalidRequestError(
            f"the prompt must be a string or a list of messages, got {type(messages_or_prompt).__name__}")
    messages = list(messages_or_prompt)
    if not messages:
        raise InvalidRequestError("the message list is empty")
    normalized = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"message {i} is a {type(message).__name__}, not a mapping")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise InvalidRequestError(f"message {i} has unknown role {role!r}; use one of {ROLES}")
        calls = message.get("tool_calls") or None
        if calls is not None and (role != "assistant" or not isinstance(calls, Sequence)
                                  or not all(isinstance(c, Mapping) for c in calls)):
            raise InvalidRequestError(f"message {i}: tool_calls must be a list of calls on an assistant message")
        if content is None and calls:
            content = ""
        if isinstance(content, Sequence) and not isinstance(content, (str, bytes, bytearray)):
            content = _text_of_parts(content, i)  # OpenAI's content parts, as the server and both adapters read them
        if not isinstance(content, str):
            raise InvalidRequestError(f"message {i} content must be a string, got {type(content).__name__}")
        _check_encodable(content, f"message {i}")
        normalized.append({"role": role, "content": content, **({"tool_calls": list(calls)} if calls else {})})
    if not any(m["content"].strip() or m.get("tool_calls") for m in normalized):
        raise InvalidRequestError("every message is empty")
    return normalized


def _text_of_parts(parts: Sequence[Any], index: int) -> str:
    """A list of OpenAI content parts as one text (``join_text_parts``); any part but text is refused:
    the members read text only."""
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if kind != "text" or not isinstance(part.get("text"), str):
            raise InvalidRequestError(f"message {index} content part {j} is {kind!r}: only text parts are read "
                                      "(the members are text models)")
        texts.append(part["text"])
    return join_text_parts(texts)


def _check_encodable(text: str, where: str) -> None:
    """Lone surrogates (JSON's "\\ud800" decodes to one) are not text: no tokenizer can take them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InvalidRequestError(f"{where} is not valid Unicode: {err.reason} at character {err.start}") from None


def render_plain(messages: Sequence[Message]) -> str:
    """The fallback format for models without a chat template. It ends on a new line, as chat
    templates' generation prompts do (``<|im_start|>assistant\\n``): the answer is shared text,
    and a chat drafter starts it with a word and no leading space, which reads naturally here
    (``Assistant:\\nThe``), while ``Assistant:The`` would not; a plain-format drafter, in turn,
    starts without the space that chat members would read after their newline.

    Earlier assistant turns (few-shot answers) are written the same way, ``Assistant:\n<answer>``:
    the generation prompt must be the start of an assistant turn as the conversation shows them,
    as a chat template's is. With ``Assistant: <answer>`` in the exemplars, a base model read
    ``Assistant:\n`` as an empty answer and wrote ``User:`` next (Gemma-3-270m on 5-shot SQuAD)."""
    parts = []
    for message in messages:
        if message["role"] == "system":
            parts.append(f"{message['content']}\n\n")
        elif message["role"] == "assistant":
            parts.append(f"{ASSISTANT_TURN}{message['content']}\n")
        else:
            parts.append(f"{message['role'].capitalize()}: {message['content']}\n")
    return "".join(parts) + ASSISTANT_TURN


def join_text_parts(texts: Sequence[str]) -> str:
    """A message's text parts (OpenAI content parts, LangChain text blocks, LlamaIndex TextBlocks) as
    one content, a newline apart, as vLLM reads them; empty parts add nothing. One rule for every
    surface: the same message reads the same through the server and both adapters."""
    return "\n".join(text for text in texts if text)


def render_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message],
                      tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """Prompt token ids for ``messages`` in this tokenizer's own format, ready for generation:
    exactly what ``apply_chat_template(..., tokenize=True, add_generation_prompt=True)`` gives
    (a template writes its own BOS if the model wants one, so none is added), else the plain
    format with the tokenizer's usual special tokens (its BOS, once).

    ``tools`` (OpenAI format) go through the chat template where it renders them, else into the
    system message in the documented fallback format (see ``shared_engine.tools``)."""
    if tools and not template_renders_tools(tokenizer):
        messages, tools = with_tools_system(messages, tools), None
    if getattr(tokenizer, "chat_template", None):
        try:
            return _templated(tokenizer, [dict(m) for m in messages], tools)
        except TemplateError as refused:
            # Gemma-3-it, Mistral, Llama-2: a system turn only first, user and assistant alternating;
            # the engine's own turns (a format reminder, a retry's feedback, a tool-result hint) break that
            try:
                return _templated(tokenizer, alternating(messages), tools)
            except TemplateError:
                raise InvalidRequestError(f"the member's chat template refuses these messages: {refused}") from None
    return plain_prompt_ids(tokenizer, render_plain(messages))


def plain_prompt_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """The plain format's ``text`` (``render_plain``) as ``render_text_ids`` reads it, except where a
    message wrote a control token's text (``<bos>``, ``<end_of_turn>``): the plain format writes none
    of its own, so such text is the messages' and is read as text, with the usual BOS."""
    if control_text_in(tokenizer, text) is None:
        return render_text_ids(tokenizer, text)
    return list(tokenizer(text, split_special_tokens=True)["input_ids"])


def render_text_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """``text`` as a plain-text prompt (OpenAI's completions: no chat format): the tokenizer's own
    encoding with its usual special tokens, as vLLM reads it (special-token names in the text are
    those tokens: a client may render its own chat format), but a BOS once where the text starts with it."""
    bos = getattr(tokenizer, "bos_token", None)
    return list(tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"])


def _templated(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]],
               tools: Sequence[Mapping[str, Any]] | None) -> list[int]:
    """The template's ids; where a message (or a tool) writes a control token's text, that text is
    read as text (``guarded_pieces``), so that no message can close its turn or open another."""
    tool_list: Any = [dict(t) for t in tools] if tools else None  # transformers' type: a list of dicts or callables
    if not any(control_text_in(tokenizer, text) for text in strings_of(messages, tool_list)):
        encoded: Any = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                     return_dict=True, tools=tool_list)
        return list(encoded["input_ids"])

    def render(these: list[dict[str, Any]], their_tools: list[dict[str, Any]] | None) -> str:
        template_tools: Any = their_tools
        return str(tokenizer.apply_chat_template(these, tokenize=False, add_generation_prompt=True,
                                                 tools=template_tools))

    where = f"the chat template of {getattr(tokenizer, 'name_or_path', '') or 'a member'}"
    ids: list[int] = []
    for text, is_content in guarded_pieces(render, messages, tool_list,
                                           lambda t: control_text_in(tokenizer, t), where):
        ids += tokenizer(text, add_special_tokens=False, split_special_tokens=is_content)["input_ids"]
    return ids


_CONTROL_PATTERNS: weakref.WeakKeyDictionary[Any, re.Pattern[str] | None] = weakref.WeakKeyDictionary()


def control_text_in(tokenizer: PreTrainedTokenizerBase, text: str) -> str | None:
    """The first control token's text in ``text`` (an added token marked special: BOS, EOS, pad, chat
    markers), or None. A pattern built as a trie: Gemma's 6k control tokens search 1 MB in milliseconds."""
    try:
        pattern = _CONTROL_PATTERNS[tokenizer]
    except (KeyError, TypeError):
        texts = {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special}
        texts |= {t for t in getattr(tokenizer, "all_special_tokens", []) if isinstance(t, str)}
        pattern = control_pattern(texts)
        try:
            _CONTROL_PATTERNS[tokenizer] = pattern
        except TypeError:
            pass  # a tokenizer that takes no weak reference builds its pattern each time
    found = pattern.search(text) if pattern is not None else None
    return found.group(0) if found else None


def control_pattern(texts: set[str]) -> re.Pattern[str] | None:
    """A regular expression matching any of ``texts``, longest first, as a trie (an alternation of
    thousands of words tried one by one at every ``<`` took seconds on a long document)."""
    trie: dict[str, Any] = {}
    for text in texts:
        if text:
            node = trie
            for char in text:
                node = node.setdefault(char, {})
            node[""] = {}

    def alternation(node: dict[str, Any]) -> str:
        branches = [re.escape(char) + alternation(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        ends = "" in node
        body = branches[0] if len(branches) == 1 and not ends else "(?:" + "|".join(branches) + ")"
        return body + ("?" if ends else "")

    return re.compile(alternation(trie)) if trie else None


def strings_of(messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """Every text a template may write from the request: contents, tool calls' names and arguments,
    tool descriptions and schemas (keys too)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                walk(key)
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk([dict(m) for m in messages])
    walk(list(tools or []))
    return found


SENTINEL_MARKS = ("\ue000", "\ue001", "\uf8fe", "\uf8ff", "\U000f0000", "\U000f0001", "\U0010fffd")
"""Private-use characters that stand in for a content while the template renders (two not in the request)."""


def guarded_pieces(render: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str],
                   messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   control: Callable[[str], str | None], where: str) -> list[tuple[str, bool]]:
    """The rendering of ``messages`` as (text, is_content) pieces, each text that holds a control
    token's text (``control``) a content piece, to be tokenized without special-token parsing, the
    template's own text around them with it.

    Each such text is replaced by a sentinel, the template renders that, and the rendering is cut at
    the sentinels; the cut parts joined with the texts as the template writes them (as they are,
    trimmed, or JSON-escaped) must give the real rendering exactly, or the request is refused: a
    template that changes a text in other ways could hide a control token from this check."""
    everything = json.dumps([messages, tools], ensure_ascii=False)
    marks = [m for m in SENTINEL_MARKS if m not in everything][:2]
    first_control = next(c for c in map(control, strings_of(messages, tools)) if c)
    if len(marks) < 2:
        raise InvalidRequestError(f"{where}: a message writes the control token {first_control!r} and uses "
                                  "every private-use character this library marks texts with")
    open_mark, close_mark = marks
    texts: list[str] = []

    def swap(value: Any) -> Any:
        if isinstance(value, str):
            if control(value) is None:
                return value
            texts.append(value)
            return f"{open_mark}{len(texts) - 1}{close_mark}"
        if isinstance(value, Mapping):
            return {swap(key): swap(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [swap(item) for item in value]
        return value

    swapped_messages = [swap(dict(m)) for m in messages]
    swapped_tools = [swap(dict(t)) for t in tools] if tools else None
    real, marked = render(messages, tools), render(swapped_messages, swapped_tools)
    parts = re.split(f"{open_mark}([0-9]+){close_mark}", marked)
    refused = InvalidRequestError(
        f"{where}: a message writes the control token {first_control!r} as text, and the template changes "
        "that message in a way this library cannot keep apart from the template's own tokens; the request "
        "is refused rather than read with a forged turn")
    template_parts, indices = parts[0::2], [int(i) for i in parts[1::2]]
    if any(open_mark in p or close_mark in p for p in template_parts) or any(i >= len(texts) for i in indices):
        raise refused
    pieces: list[tuple[str, bool]] = [(template_parts[0], False)]
    at = len(template_parts[0])
    if not real.startswith(template_parts[0]):
        raise refused
    for index, after in zip(indices, template_parts[1:]):
        text = texts[index]
        forms = dict.fromkeys((text, text.strip(), text.rstrip(), text.lstrip(),
                               json.dumps(text, ensure_ascii=False)[1:-1], json.dumps(text)[1:-1]))
        form = next((f for f in forms if real.startswith(f, at) and real.startswith(after, at + len(f))), None)
        if form is None:
            raise refused
        pieces += [(form, True), (after, False)]
        at += len(form) + len(after)
    if at != len(real):
        raise refused
    return [(text, is_content) for text, is_content in pieces if text]


def alternating(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """``messages`` as a strict template takes them: a system message after the first turn is read as
    the user's, and consecutive turns of one role (text only) are joined into one, a blank line apart."""
    out: list[dict[str, Any]] = []
    for message in messages:
        turn = dict(message)
        if turn["role"] == "system" and out:
            turn["role"] = "user"
        last = out[-1] if out else None
        if last is not None and last["role"] == turn["role"] and isinstance(last.get("content"), str) \
                and isinstance(turn.get("content"), str) and not last.get("tool_calls") and not turn.get("tool_calls"):
            last["content"] = f"{last['content']}\n\n{turn['content']}"
        else:
            out.append(turn)
    return out


TEMPLATE_SHAPES: tuple[tuple[str, ...], ...] = (("user",), ("system", "user"))
"""The conversations whose rendering with empty contents measures a chat format's overhead: one
question, and a system prompt before it (LlamaIndex's and LangChain's RAG prompts)."""


def template_overhead(prompt_ids: Callable[[list[dict[str, Any]]], Sequence[int]]) -> int:
    """The most tokens a member's chat format writes around the contents of a one- or two-message
    prompt (``TEMPLATE_SHAPES``): its rendering (``prompt_ids``, as ``Member.prompt_ids``) with
    every content empty. That is its turn markers, role names, newlines and generation prompt, a BOS,
    and a system prompt the template inserts when none is given (Qwen2.5's and SmolLM2's do, so the
    one-message prompt can render longer than the two-message one). A counter that counts only the
    contents (LlamaIndex's prompt helper) must leave this much of a window unfilled. A shape the
    template refuses counts 0: such a prompt is never sent in that shape."""
    measured = [0]
    for roles in TEMPLATE_SHAPES:
        try:
            measured.append(len(prompt_ids([{"role": role, "content": ""} for role in roles])))
        except InvalidRequestError:
            continue
    return max(measured)
