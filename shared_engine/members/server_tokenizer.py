"""A llama.cpp model's tokenizer read from its server alone, for when the client has no copy.

The alignment needs the exact **bytes** of every token id (alignment.TokenTable), an encoder and the
chat format. A llama.cpp server gives all three without any file on the client:

- bytes of every id: ONE ``/completion`` with ``n_probs`` = the vocabulary size lists every token
  with its ``bytes`` (exact, including partial UTF-8 pieces; control tokens come back empty, which
  is how they are told apart). Measured: 1.7 s and 14 MB for Qwen's 152k ids, 2.8 s and 26 MB for
  Gemma's 262k, once per member.
- encoding: ``/tokenize`` (no special-token parsing: answer text such as "</s>" stays text), one
  loopback request per re-encode.
- prompts: ``/apply-template`` renders the GGUF's own chat template, then ``/tokenize`` with
  special-token parsing; where a message writes a control token's text (``<|im_end|>``), that text
  is tokenized without it (``chat.guarded_pieces``), so no message can close its turn. Tools go to
  ``/apply-template`` too where the template renders them
  (Qwen2.5: the text of transformers' ``apply_chat_template(tools=...)``), else, or where the
  server drops them, into the system message (``tools.with_tools_system``), as with a local
  tokenizer. A GGUF without a template (Gemma-3-270m base) gets llama.cpp's built-in
  ChatML, whose ``<|im_start|>`` is no control token of that vocabulary: such a model gets the
  library's plain format instead, as it does with a local tokenizer.
- byte fallback: where two ids spell the same bytes (Gemma's ``<0x0A>`` and ``"\\n"``), the one the
  server's tokenizer produces for that text is the one fused candidates map to.

vLLM and SGLang cap top-logprobs and report tokens as decoded strings, so they have no such route:
their members load the tokenizer on the client (see docs/members.md, Remote members).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ..alignment import END_OF_TURN_TOKENS, TokenTable
from ..tools import template_renders_tools, with_tools_system
from .chat import Message, guarded_pieces, render_plain, strings_of
from .http import HttpSettings, JsonClient


def llamacpp_tokenize(client: JsonClient, text: str, *, add_special: bool = False,
                      parse_special: bool = False) -> list[int]:
    """``POST /tokenize`` of a llama.cpp server (plain ids or ``{id, piece}`` objects)."""
    answer = client.post("/tokenize", {"content": text, "add_special": add_special,
                                       "parse_special": parse_special})
    try:
        return [int(t["id"]) if isinstance(t, dict) else int(t) for t in answer["tokens"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise client.error(f"answered an unexpected shape (/tokenize): {str(answer)[:200]}") from exc


class LlamaCppServerTokenizer:
    """The ``MemberTokenizer`` of a llama.cpp server's model, built from its endpoints (module doc)."""

    from_server = True

    def __init__(self, url: str, http: HttpSettings | None = None, name: str | None = None) -> None:
        self.client = JsonClient(name or url, url, http)
        try:
            props = self.client.get("/props")
            props = props if isinstance(props, dict) else {}
            self.context_window: int | None = None  # the member asks the server's /props itself
            self.bos_token: str = props.get("bos_token") or ""
            self.pieces = self._vocabulary()
            self.special_ids = {i for i, piece in enumerate(self.pieces) if not piece}
            self.eos_ids = {i for text in {props.get("eos_token") or "", *END_OF_TURN_TOKENS} if text
                            for i in [self._control_token(text)] if i is not None}
            self.chat_template: str = props.get("chat_template") or ""  # tools.template_renders_tools reads it
            self.has_chat_template = bool(self.chat_template) and (
                "<|im_start|>" not in self.chat_template or self._control_token("<|im_start|>") is not None)
        except BaseException:
            self.client.close()  # a server that cannot give its vocabulary keeps no connection of ours
            raise

    def _vocabulary(self) -> list[bytes]:
        """The exact bytes of every id, from one completion that lists the whole vocabulary."""
        models = self.client.get("/v1/models")
        try:
            size = int(models["data"][0]["meta"]["n_vocab"])
        except (KeyError, TypeError, ValueError, IndexError):
            size = 1 << 22  # the server clamps n_probs to its vocabulary
        for probe in ("a", "Hello", "1"):  # a partial-UTF-8 argmax gets no probabilities: try another
            answer = self.client.post("/completion", {
                "prompt": llamacpp_tokenize(self.client, probe), "n_predict": 1, "n_probs": size,
                "temperature": 0, "cache_prompt": False})
            probs = answer.get("completion_probabilities") if isinstance(answer, dict) else None
            if probs:
                break
        else:
            raise self.client.error("listed no token probabilities for its vocabulary")
        try:
            listed = {int(t["id"]): bytes(t["bytes"]) for t in probs[0]["top_logprobs"]}
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise self.client.error(f"answered an unexpected shape (vocabulary): {str(probs)[:200]}") from exc
        if sorted(listed) != list(range(len(listed))) or (size != 1 << 22 and len(listed) != size):
            raise self.client.error(f"listed {len(listed)} of {size} token ids; cannot read its vocabulary")
        return [listed[i] for i in range(len(listed))]

    def _control_token(self, text: str) -> int | None:
        """The id of control token ``text`` (one id, no bytes of its own), or None."""
        ids = llamacpp_tokenize(self.client, text, parse_special=True)
        return ids[0] if len(ids) == 1 and not self.pieces[ids[0]] else None

    def _secondary_ids(self) -> set[int]:
        """Of ids sharing their bytes, those the server does not produce for that text."""
        groups: dict[bytes, list[int]] = defaultdict(list)
        for i, piece in enumerate(self.pieces):
            if piece:
                groups[piece].append(i)
        secondary: set[int] = set()
        for piece, ids in groups.items():
            if len(ids) < 2:
                continue
            try:
                produced = llamacpp_tokenize(self.client, piece.decode("utf-8"))
            except UnicodeDecodeError:
                continue  # a lone byte: no text to ask about, the lowest id stays first
            if len(produced) == 1 and produced[0] in ids:
                secondary |= set(ids) - {produced[0]}
        return secondary

    def token_table(self) -> TokenTable:
        return TokenTable.from_bytes(self.pieces, special_ids=self.special_ids, eos_ids=self.eos_ids,
                                     encode=self.encode, name=f"llama.cpp tokenizer at {self.client.base_url}",
                                     secondary_ids=self._secondary_ids())

    def encode(self, text: str) -> list[int]:
        return llamacpp_tokenize(self.client, text)

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Message] | None = None) -> list[int]:
        """As ``chat.render_prompt_ids`` with a local tokenizer: tools through the GGUF's template
        where it renders them (Qwen2.5: its own system prompt and tools block, word for word), else
        the documented fallback in the system message."""
        if not self.has_chat_template:
            return self.plain_prompt_ids(render_plain(with_tools_system(messages, tools) if tools else messages))
        if tools and template_renders_tools(self):
            text = self._apply_template(messages, tools)
            # a server whose /apply-template drops tools= (an older llama.cpp) writes each name no more
            # often than the conversation does (an earlier call in it names its tool too)
            written = json.dumps([dict(m) for m in messages], ensure_ascii=False)
            if all(text.count(name) > written.count(name) for t in tools for name in [t["function"]["name"]]):
                return self._templated_ids(text, messages, tools)
        if tools:
            messages = with_tools_system(messages, tools)
        return self._templated_ids(self._apply_template(messages), messages, None)

    def _templated_ids(self, text: str, messages: Sequence[Message], tools: Sequence[Message] | None) -> list[int]:
        """``text`` (the template's rendering of ``messages``) as ``text_prompt_ids`` reads it, but a
        control token's text that a message (or tool) writes is read as text (``chat.guarded_pieces``)."""
        ids, controls = self._prompt_tokens(text)
        message_list = [dict(m) for m in messages]
        tool_list = [dict(t) for t in tools] if tools else None

        def control(written: str) -> str | None:
            return next((c for c in controls if c in written), None)

        if not any(map(control, strings_of(message_list, tool_list))):
            return ids

        def render(these: list[dict[str, Any]], their_tools: list[dict[str, Any]] | None) -> str:
            return text if these is message_list else self._apply_template(these, their_tools)

        add_bos = not (self.bos_token and text.startswith(self.bos_token))
        ids = []
        for piece, is_content in guarded_pieces(render, message_list, tool_list, control,
                                                f"the chat template of {self.client.member}"):
            ids += llamacpp_tokenize(self.client, piece, add_special=add_bos and not ids,
                                     parse_special=not is_content)
        return ids

    def _prompt_tokens(self, text: str) -> tuple[list[int], set[str]]:
        """``text_prompt_ids(text)`` and the texts of the control tokens among them (``with_pieces``):
        a message that writes one of these texts wrote a control token."""
        add_bos = not (self.bos_token and text.startswith(self.bos_token))
        answer = self.client.post("/tokenize", {"content": text, "add_special": add_bos, "parse_special": True,
                                                "with_pieces": True})
        try:
            tokens = answer["tokens"]
            ids = [int(t["id"]) if isinstance(t, dict) else int(t) for t in tokens]
            pieces = [t.get("piece") if isinstance(t, dict) else None for t in tokens]
        except (KeyError, TypeError, ValueError) as exc:
            raise self.client.error(f"answered an unexpected shape (/tokenize): {str(answer)[:200]}") from exc
        controls = {bytes(p).decode("utf-8", "replace") if isinstance(p, list) else str(p)
                    for i, p in zip(ids, pieces) if i in self.special_ids and p}
        return ids, controls

    def plain_prompt_ids(self, text: str) -> list[int]:
        """The plain format's ``text`` (``render_plain``) as ``text_prompt_ids`` reads it, except where a
        message wrote a control token's text: the plain format writes none of its own, so such text
        is the messages' and is read as text, with the usual BOS (``chat.plain_prompt_ids``)."""
        ids, controls = self._prompt_tokens(text)
        if not any(c in text for c in controls):
            return ids
        return llamacpp_tokenize(self.client, text, add_special=True, parse_special=False)

    def _apply_template(self, messages: Sequence[Message], tools: Sequence[Message] | None = None) -> str:
        """The server's rendering of the conversation in its GGUF's chat template."""
        request: dict[str, Any] = {"messages": [dict(m) for m in messages]}
        if tools:
            request["tools"] = [dict(t) for t in tools]
        answer: Any = self.client.post("/apply-template", request)
        if not isinstance(answer, dict) or not isinstance(answer.get("prompt"), str):
            raise self.client.error(f"answered an unexpected shape (/apply-template): {str(answer)[:200]}")
        return str(answer["prompt"])

    def text_prompt_ids(self, text: str) -> list[int]:
        """As ``chat.render_text_ids`` reads text with a transformers tokenizer: special-token names
        parsed, a BOS once."""
        add_bos = not (self.bos_token and text.startswith(self.bos_token))
        return llamacpp_tokenize(self.client, text, add_special=add_bos, parse_special=True)

    def close(self) -> None:
        self.client.close()
