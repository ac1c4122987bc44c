"""Tokenizers read from a llama.cpp server alone (members/server_tokenizer.py): on the real zoo
GGUFs they must give the same token bytes, prompts and spellings as the tokenizer loaded on the
client, and a member whose model file is not on this machine must ensemble exactly as one whose is."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared_engine import EnsembleEngine
from shared_engine.alignment import TokenTable
from shared_engine.members import load_member
from shared_engine.members.llamacpp import LocalLlamaServer
from shared_engine.members.remote import load_tokenizer
from shared_engine.members.server_tokenizer import LlamaCppServerTokenizer
from shared_engine.zoo import gguf_path
from tests.fixture_server import free_port

QWEN, SMOL, GEMMA = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"

# Ids llama.cpp marks as control tokens (no bytes) that the transformers tokenizer reads from the
# same GGUF as plain text "</s>"; llama.cpp also ends the answer on them. Beside Qwen's padding
# rows, nothing else may differ.
CONTROL_ON_THE_SERVER_ONLY = {QWEN: {128247}, SMOL: set(), GEMMA: {212}}

CONVERSATIONS = [
    [{"role": "user", "content": "What is 17 + 25?"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Grüße aus Köln, 東京 🙂 and <b>tags</b>"},
     {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "  x**2  # é́'s\n"}],
]
TEXTS = ["Hello, world! Grüße aus Köln", " Sofia\n\n  x**2 # it's", "東京 🙂.", "<|im_end|> <b>\t\r\x04"]
NOT_NFC = " e\u0301's"
"""Qwen's transformers tokenizer NFC-normalises (so the table spells "e" + U+0301 byte by byte) and
llama.cpp does not: both spellings are exact, the server's is the one its model reads."""


@pytest.mark.parametrize("name", [SMOL, QWEN, GEMMA])
@pytest.mark.zoo
def test_the_table_read_from_the_server_matches_the_local_tokenizer(name: str) -> None:
    server = LocalLlamaServer(gguf_path(name, progress=False), n_ctx=512, threads=1)
    remote = LlamaCppServerTokenizer(server.url)
    try:
        local = load_tokenizer(name)
        theirs, ours = remote.token_table(), local.token_table()
        assert theirs.vocab_size == ours.vocab_size
        text_ids = range(len(local.tokenizer))
        differ = {i for i in text_ids if i not in ours.special_ids and ours.pieces[i] != theirs.pieces[i]}
        assert all(theirs.pieces[i] == b"" for i in differ)
        # Qwen's output layer is padded: the GGUF names those rows "[PAD151665]".. as text, llama.cpp as unused
        padding = {i for i in differ if ours.pieces[i] == f"[PAD{i}]".encode()}
        assert differ - padding == CONTROL_ON_THE_SERVER_ONLY[name]
        assert len(padding) == (ours.vocab_size - 151665 if name == QWEN else 0)
        assert theirs.eos_ids == ours.eos_ids | CONTROL_ON_THE_SERVER_ONLY[name]
        assert {k: v for k, v in theirs._by_bytes.items()} == \
            {k: v for k, v in ours._by_bytes.items() if v not in differ}
        assert theirs._unspellable == ours._unspellable and theirs._prefix_space == ours._prefix_space
        assert remote.has_chat_template == local.has_chat_template  # Gemma base: neither
        for messages in CONVERSATIONS:
            assert remote.prompt_ids(messages) == local.prompt_ids(messages)
        bos = local.tokenizer.bos_token or ""
        for text in [*TEXTS, bos + TEXTS[0]]:  # a raw prompt (/v1/completions): BOS once, specials parsed
            assert remote.text_prompt_ids(text) == local.text_prompt_ids(text), text
        for text in TEXTS:
            assert theirs.spell_covering(text) == ours.spell_covering(text)
        assert theirs.to_bytes(theirs.spell(NOT_NFC)) == ours.to_bytes(ours.spell(NOT_NFC)) == NOT_NFC.encode()
    finally:
        remote.close()
        server.close()


@pytest.fixture
def server_without_local_file(tmp_path: Path) -> Iterator[str]:
    """A llama-server on a copy of SmolLM2's GGUF that is deleted once the server has loaded it."""
    from tests.test_llamacpp import start_server

    copy = tmp_path / "elsewhere.gguf"
    shutil.copyfile(gguf_path(SMOL, progress=False), copy)
    port = free_port()
    proc = start_server(str(copy), port)
    copy.unlink()  # the server keeps its mapping; this machine no longer has the file
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.zoo
def test_a_member_whose_model_file_is_elsewhere_ensembles_like_one_with_a_local_tokenizer(
        server_without_local_file: str) -> None:
    url = server_without_local_file
    from_server = load_member(f"llamacpp:{url}")
    assert isinstance(from_server.tokenizer, LlamaCppServerTokenizer)
    with_local = load_member(f"llamacpp:{url}#{SMOL}")  # the same server, tokenizer loaded here
    qwen = f"llamacpp:{QWEN}"
    prompt = "Natalia sold 48 clips in April and half as many in May. How many clips in total?"
    # llama.cpp is not batch-invariant: the first request on a fresh server reads the prompt in one
    # batch, later ones reuse the cached prefix, and a near-tie can flip between the two. One
    # discarded answer puts the server in the state both compared runs then see.
    EnsembleEngine([from_server, qwen], method="safe").generate(prompt, max_new_tokens=32)
    for members in ([from_server, qwen], [qwen, from_server]):  # drafting, then verifying
        twin = [with_local if m is from_server else m for m in members]
        a = EnsembleEngine(members, method="safe").generate(prompt, max_new_tokens=32)
        b = EnsembleEngine(twin, method="safe").generate(prompt, max_new_tokens=32)
        assert a.text == b.text and a.text.strip() and a.stats.ensembled_tokens > 0
        assert (a.stats.ensembled_tokens, a.stats.changed_tokens) == (b.stats.ensembled_tokens, b.stats.changed_tokens)


def test_a_table_from_bytes_maps_shared_bytes_to_the_id_the_tokenizer_produces() -> None:
    """Toy vocabulary: id 1 is a byte-fallback "a" listed before the normal "a" (id 3), as in Gemma."""
    pieces = [b"", b"a", b"b", b"a", b"ab", b"\xc3", b"\xa9"]

    def encode(text: str) -> list[int]:  # longest match over the normal ids
        normal = {b"a": 3, b"b": 2, b"ab": 4, b"\xc3": 5, b"\xa9": 6}
        data, out = text.encode(), []
        while data:
            piece = max((p for p in normal if data.startswith(p)), key=len, default=None)
            if piece is None:  # no token: dropped, as SmolLM2's tokenizer drops bytes it lacks
                data = data[1:]
                continue
            out.append(normal[piece])
            data = data[len(piece):]
        return out

    table = TokenTable.from_bytes(pieces, special_ids={0}, eos_ids={0}, encode=encode, name="toy",
                                  secondary_ids={1})
    assert table.token_id(b"a") == 3 and table.token_id(b"") is None
    assert table.spell("aab") == [3, 4] and table.spell("é") == [5, 6]
    assert table.can_spell("é".encode()) and not table.can_spell(b"c")
    assert table.vocab_size == 7 and table.longest_piece == 2 and table.eos_ids == {0}
    with pytest.raises(ValueError, match="toy has no token for byte 0x63"):
        table.spell("c")


def test_a_server_that_lists_part_of_its_vocabulary_is_refused_with_its_url() -> None:
    from shared_engine.errors import MemberError
    from tests.fixture_server import serve

    def partial(method: str, path: str, body: object) -> tuple[int, bytes]:
        answers = {
            "/props": {"bos_token": "", "eos_token": "", "chat_template": ""},
            "/v1/models": {"data": [{"meta": {"n_vocab": 4}}]},
            "/tokenize": {"tokens": [1]},
            "/completion": {"completion_probabilities": [{"top_logprobs": [
                {"id": 0, "bytes": [], "logprob": -1.0}, {"id": 1, "bytes": [97], "logprob": -2.0}]}]},
        }
        return 200, json.dumps(answers[path]).encode()

    with serve(partial) as (url, _), pytest.raises(MemberError, match=f"{url}.*listed 2 of 4 token ids"):
        LlamaCppServerTokenizer(url)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
QWEN_LIKE = "{%- if tools %}{{ tools | tojson }}{%- endif %}{{ messages }}"  # what /props shows: renders tools=


def _tool_server(template: str, renders_tools: bool) -> Any:
    """A stand-in llama.cpp server of a two-id vocabulary whose /apply-template writes tools= (as
    the current build does for a template that renders them) or drops them (an older build)."""
    def answer(method: str, path: str, body: Any) -> tuple[int, bytes]:
        if path == "/apply-template":
            tools = body.get("tools") if renders_tools else None
            head = f"You are Qwen, created by Alibaba Cloud.\n{json.dumps(tools)}\n" if tools else ""
            return 200, json.dumps({"prompt": head + json.dumps(body["messages"])}).encode()
        answers = {
            "/props": {"bos_token": "", "eos_token": "", "chat_template": template},
            "/v1/models": {"data": [{"meta": {"n_vocab": 2}}]},
            "/tokenize": {"tokens": [1]},
            "/completion": {"completion_probabilities": [{"top_logprobs": [
                {"id": 0, "bytes": [], "logprob": -1.0}, {"id": 1, "bytes": [97], "logprob": -2.0}]}]},
        }
        return 200, json.dumps(answers[path]).encode()
    return answer


EARLIER_CALL = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'},
                {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}]


@pytest.mark.parametrize("template, renders_tools, own", [
    (QWEN_LIKE, True, True),  # the server's rendering: its template's own default system prompt
    (QWEN_LIKE, False, False),  # a build that drops tools=: the fallback, not a prompt without tools
    ("{{ messages }}", True, False),  # SmolLM2's template renders no tools: the fallback, as locally
])
@pytest.mark.parametrize("messages", [[{"role": "user", "content": "Weather in Paris?"}], EARLIER_CALL])
def test_tools_go_through_the_servers_template_where_it_renders_them(
        template: str, renders_tools: bool, own: bool, messages: list[dict[str, str]]) -> None:
    """A llama.cpp member reading its tokenizer from the server always put tools into the fallback
    system message ("You are a helpful assistant." + the tools block), on the belief that
    /apply-template renders no tools; it renders them as transformers' apply_chat_template(tools=)
    does ("You are Qwen, created by Alibaba Cloud. ..."), so the same model saw another prompt as a
    member with a local tokenizer. Tools now go to /apply-template where the template renders them."""
    from shared_engine.tools import with_tools_system
    from tests.fixture_server import serve

    with serve(_tool_server(template, renders_tools)) as (url, log):
        remote = LlamaCppServerTokenizer(url)
        try:
            del log[:]
            remote.prompt_ids(messages, TOOLS)
        finally:
            remote.close()
    [prompt] = [body["content"] for _, path, body in log if path == "/tokenize" and body["parse_special"]]
    fallback = with_tools_system(messages, TOOLS)
    assert prompt == (f"You are Qwen, created by Alibaba Cloud.\n{json.dumps(TOOLS)}\n{json.dumps(messages)}"
                      if own else json.dumps(fallback))
    sent = [body for _, path, body in log if path == "/apply-template"]
    assert ("tools" in sent[0]) == (template == QWEN_LIKE)  # a template that renders none is not sent them
    assert sent[-1]["messages"] == (messages if own else fallback)


@pytest.mark.zoo
def test_a_servers_zoo_gguf_loads_the_zoo_tokenizer(tmp_path: Path) -> None:
    """A llama.cpp server reports its model's path; where that is a zoo GGUF, the member loads the zoo's
    converted tokenizer (1 s), not one read from the GGUF by transformers (16 s, and no context window)."""
    by_name = load_tokenizer(QWEN)
    by_path = load_tokenizer(str(gguf_path(QWEN, progress=False)))
    assert by_path.context_window == by_name.context_window == 32768
    assert by_path.eos_ids == by_name.eos_ids and by_path.vocab_size == by_name.vocab_size
    link = tmp_path / "served.gguf"  # a link to the zoo's file is that file
    link.symlink_to(gguf_path(QWEN, progress=False))
    assert load_tokenizer(str(link)).context_window == 32768
