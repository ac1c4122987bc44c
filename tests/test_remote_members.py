"""Server-backed members without real servers: the top-K -> logits rule, spec strings, the
RemoteSession contract (checked against the transformers session), vLLM/SGLang request/response
contracts on hand-built fixtures (tests/fixtures/README.md), and the fault rules of members/http.py
against loopback servers that fail in each way."""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpcore
import httpx
import pytest
import torch

from shared_engine import EnsembleEngine
from shared_engine.errors import InvalidRequestError, MemberError
from shared_engine.members import Capabilities, HFMember, MemberConfig, MemberDefaults, parse_member_spec, with_backend
from shared_engine.members.http import HttpSettings, JsonClient
from shared_engine.members.remote import LocalTokenizer, RemoteMember
from shared_engine.members.sglang import SGLangMember
from shared_engine.members.topk import TopK, topk_logits
from shared_engine.members.vllm import VLLMMember
from tests import toy
from tests.fixture_server import load_exchanges, replay, serve, silent_socket

FAST = HttpSettings(timeout_s=1.0, connect_timeout_s=0.5, retries=2, backoff_s=0.05)
IDS = [11, 12, 13, 14, 15, 16, 17]


def toy_tokenizer() -> LocalTokenizer:
    tok = toy.byte_level_tokenizer()
    return LocalTokenizer(tok, len(tok), frozenset(), 512)


# ------------------------------------------------------------------ capabilities and top-K rows
def test_capabilities_require_k_exactly_for_top_k() -> None:
    assert HFMember.capabilities.distribution == "full"
    assert Capabilities(distribution="top_k", k=5).k == 5
    with pytest.raises(ValueError):
        Capabilities(distribution="top_k")
    with pytest.raises(ValueError):
        Capabilities(k=5)


def test_topk_logits_keep_top_k_exact_and_spread_the_rest_evenly() -> None:
    entry = TopK([7, 2, 9], [math.log(0.5), math.log(0.2), math.log(0.1)])
    probs = torch.softmax(topk_logits(entry, 10), dim=0)
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-6)
    assert [float(probs[i]) for i in (7, 2, 9)] == pytest.approx([0.5, 0.2, 0.1], abs=1e-6)
    rest = [float(probs[i]) for i in range(10) if i not in (7, 2, 9)]
    assert rest == pytest.approx([0.2 / 7] * 7, abs=1e-6)
    assert int(probs.argmax()) == 7


def test_topk_logits_survive_a_top_k_that_sums_past_one() -> None:
    probs = torch.softmax(topk_logits(TopK([0, 1], [math.log(0.7), math.log(0.30001)]), 5), dim=0)
    assert float(probs[0]) == pytest.approx(0.7, abs=1e-4) and float(probs[4]) < 1e-8
    with pytest.raises(ValueError):
        topk_logits(TopK([5], [0.0]), 5)


# ------------------------------------------------------------------ spec strings
def test_member_specs() -> None:
    assert parse_member_spec("smollm2-135m-instruct").backend == "llamacpp"  # a zoo name: its GGUF
    assert parse_member_spec("smollm2-135m-instruct", "transformers").backend == "transformers"
    assert parse_member_spec("./folder#x").backend == "transformers"
    spec = parse_member_spec("llamacpp:smollm2-135m-instruct")
    assert (spec.backend, spec.target, spec.tokenizer) == ("llamacpp", "smollm2-135m-instruct", None)
    spec = parse_member_spec("vllm:http://gpu1:8000#qwen2.5-coder-0.5b-instruct")
    assert (spec.backend, spec.target, spec.tokenizer) == ("vllm", "http://gpu1:8000", "qwen2.5-coder-0.5b-instruct")
    assert with_backend("smollm2-135m-instruct", "llamacpp") == "llamacpp:smollm2-135m-instruct"
    assert with_backend("vllm:http://h:1", "llamacpp") == "vllm:http://h:1"  # an explicit prefix wins
    for bad in ("vllm:qwen", "sglang:", "http://h:8000", "llamacpp:#tok"):
        with pytest.raises(InvalidRequestError):
            parse_member_spec(bad)


def test_a_mistyped_backend_prefix_is_named_with_the_backend_meant(tmp_path) -> None:  # noqa: ANN001
    """A typo in the prefix was read as a model name: "unknown model 'vlm:http://...'" and a list of
    zoo names, nothing about the prefix."""
    for spec, meant in (("vlm:http://h:8000", "vllm"), ("llama.cpp:smollm2-135m-instruct", "llamacpp"),
                        ("hf:Qwen/Qwen2.5-7B-Instruct", "transformers"), ("SGLang:http://h:30000", "sglang")):
        with pytest.raises(InvalidRequestError, match=f"unknown backend .*did you mean '{meant}:'"):
            parse_member_spec(spec)
    with pytest.raises(InvalidRequestError, match="unknown backend 'remote'.*one of transformers, llamacpp"):
        parse_member_spec("remote:http://h:8000")
    odd = tmp_path / "model:v2.gguf"  # a file whose name holds a colon is still a file
    odd.write_bytes(b"")
    assert parse_member_spec(str(odd)).target == str(odd)
    assert parse_member_spec("C:/models/x.gguf").backend == "transformers"  # a drive letter, not a prefix


# ------------------------------------------------------------------ RemoteSession vs HFSession
class TopKOfHF(RemoteMember):
    """Test double: a "server" that is a transformers member cut to its top-K. With K = the whole
    vocabulary it must reproduce the transformers member exactly, which checks RemoteSession's rows
    (alignment, the reused row after ``ids``) through real decoding."""

    def __init__(self, hf: HFMember, k: int) -> None:
        self.hf = hf
        self.requests: list[tuple[int, int]] = []
        tok = LocalTokenizer(hf.tokenizer, hf.table.vocab_size, frozenset(hf.table.eos_ids), hf.context_window)
        super().__init__(hf.name, "http://test.invalid", tok, top_k=k, check_tokenizer=False)
        self._eos = hf.table.eos_ids

    def wire_capabilities(self) -> dict[str, bool]:
        return {"block_scoring": True, "prefix_cache": False, "token_id_prompts": True}

    def server_tokenize(self, text: str) -> list[int]:  # pragma: no cover - check disabled
        raise AssertionError

    def score(self, ids: list[int], first_row: int) -> list[TopK]:
        self.requests.append((len(ids), first_row))
        rows = self.hf.new_session().sync(ids, first_row)
        logprobs = torch.log_softmax(rows, dim=-1)
        values, top = torch.topk(logprobs, self.top_k, dim=-1)
        return [TopK(t.tolist(), v.tolist()) for t, v in zip(top, values)]


def test_remote_session_rows_match_the_transformers_session() -> None:
    hf = toy.toy_member("llama-byte", "byte_level", "llama")
    remote = TopKOfHF(hf, hf.table.vocab_size)
    ids = hf.tokenizer("Hello Sofia, how are you today?")["input_ids"]
    session = remote.new_session()
    for target, first in ((ids[:6], 6), (ids[:9], 6), (ids[:9], 9), (ids[:4] + [5, 6], 3)):
        got = torch.softmax(session.sync(target, first), -1)
        want = torch.softmax(hf.new_session().sync(target, first), -1)
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-5)
    # the row after the held ids is reused (ids[:9] from row 6 asks only from row 7; ids[:9] again asks nothing)
    assert remote.requests == [(6, 6), (9, 7), (6, 3)]
    assert session.last_sync == (4, 5)


def test_safe_over_full_topk_members_equals_safe_over_transformers() -> None:
    a = toy.toy_member("llama-byte", "byte_level", "llama")
    b = toy.toy_member("gpt2-meta", "metaspace", "gpt2", seed=1)
    prompt = "Tell me about Sofia."
    want = EnsembleEngine([a, b], method="safe").generate(prompt, max_new_tokens=24)
    got = EnsembleEngine([TopKOfHF(a, a.table.vocab_size), TopKOfHF(b, b.table.vocab_size)],
                         method="safe").generate(prompt, max_new_tokens=24)
    assert got.text == want.text and got.stats.ensembled_tokens == want.stats.ensembled_tokens
    # K = 10 < vocabulary: the mass outside the top-10 is spread evenly, decoding still runs
    small = EnsembleEngine([TopKOfHF(a, 10), TopKOfHF(b, 10)], method="safe").generate(prompt, max_new_tokens=24)
    # (the random toy pair may choose EOS before the cap: a finished answer, not a stall)
    assert (small.stats.tokens == 24 or small.finish_reason == "eos") and small.stats.ensembled_tokens > 0


# ------------------------------------------------------------------ SGLang contract (fixtures)
def test_sglang_scores_a_block_in_one_request_aligned_from_the_end() -> None:
    with serve(replay(load_exchanges("sglang/generate.json"))) as (url, log):
        member = SGLangMember("sg", url, toy_tokenizer(), top_k=3, check_tokenizer=False)
        block = member.score(IDS, 5)
        assert [e.ids for e in block] == [[16, 30, 31], [32, 33, 17], [40, 41, 42]]
        assert block[1].logprobs == [-0.9, -1.1, -2.6]
        assert [e.ids for e in member.score(IDS[:5], 5)] == [[16, 30, 31]]
        with pytest.raises(MemberError, match="line up"):
            member.score(IDS[:6] + [18], 5)
        assert member.server_tokenize("Hello, world") == [101, 11, 102]
        assert [m for m, _, _ in log] == ["POST"] * 4


def test_sglang_session_turns_fixture_answers_into_rows() -> None:
    with serve(replay(load_exchanges("sglang/generate.json"))) as (url, _):
        member = SGLangMember("sg", url, toy_tokenizer(), top_k=3, check_tokenizer=False)
        rows = member.new_session().sync(IDS, 5)
        assert rows.shape == (3, member.table.vocab_size)
        assert rows.argmax(-1).tolist() == [16, 32, 40]
        assert float(torch.softmax(rows[0], -1)[16]) == pytest.approx(math.exp(-0.4), abs=1e-5)


def test_tokenizer_disagreement_is_refused_with_the_url() -> None:
    with serve(replay(load_exchanges("sglang/generate.json"))) as (url, _):
        with pytest.raises(MemberError) as err:  # the probe text is not in the fixtures: HTTP 418
            SGLangMember("sg", url, toy_tokenizer(), top_k=3, http=FAST)
        assert url in str(err.value) and "'sg'" in str(err.value)

    def wrong_tokens(method: str, path: str, body: object) -> tuple[int, bytes]:
        return 200, b'{"tokens": [1, 2, 3], "count": 3}'

    with serve(wrong_tokens) as (url, _), pytest.raises(MemberError, match="disagree"):
        SGLangMember("sg", url, toy_tokenizer(), top_k=3, http=FAST)


# ------------------------------------------------------------------ vLLM contract (fixtures)
def test_vllm_scores_a_block_with_prompt_logprobs_and_drops_rank_above_k() -> None:
    with serve(replay(load_exchanges("vllm/completions.json"))) as (url, log):
        member = VLLMMember("tiny", url, toy_tokenizer(), model="tiny", top_k=3, check_tokenizer=False)
        block = member.score(IDS, 5)
        assert [sorted(e.ids) for e in block] == [[30, 31, 32], [17, 33, 34], [40, 41, 42]]
        assert dict(zip(block[0].ids, block[0].logprobs))[30] == -0.4
        # the next-token request carries no prompt_logprobs (so vLLM's prefix cache is used)
        assert [e.ids for e in member.score(IDS[:5], 5)] == [[16, 30, 31]]
        assert "prompt_logprobs" not in log[-1][2]
        with pytest.raises(MemberError, match="token_id"):
            member.score(IDS[:4], 4)
        assert member.server_tokenize("Hello, world") == [101, 11, 102]


# ------------------------------------------------------------------ faults
def test_a_server_that_never_answers_fails_within_the_deadline() -> None:
    with silent_socket() as url:
        client = JsonClient("m", url, HttpSettings(timeout_s=0.5, retries=1, backoff_s=0.05))
        started = time.monotonic()
        with pytest.raises(MemberError) as err:
            client.post("/completion", {"prompt": [1]})
        elapsed = time.monotonic() - started
    # two attempts of 0.5 s and one backoff (a load can only lengthen it); the upper bound catches a hang
    assert 0.9 < elapsed < 30.0
    assert url in str(err.value) and "2 attempt" in str(err.value)


def test_a_server_this_process_starts_has_no_deadline_unless_one_is_given() -> None:
    """An in-process llama.cpp member got a remote server's 60 s deadline: a long prefill on a slow
    CPU (a large GGUF, or Qwen's 8-shot GSM8K prompt on 2 busy cores in an eval) failed its request
    "timed out after 60 s (not retried)" though the server was computing it. Without a deadline the
    call waits for the answer; a deadline the user gives is kept."""
    from shared_engine.members.llamacpp import local_http

    def slow(method: str, path: str, body: Any) -> tuple[int, bytes]:
        time.sleep(1.0)
        return 200, b'{"ok": 1}'

    assert local_http(None).timeout_s == math.inf and local_http(HttpSettings(retries=0)).timeout_s == math.inf
    assert local_http(HttpSettings(timeout_s=30)).timeout_s == 30
    assert JsonClient("m", "http://h:1", HttpSettings()).deadline_s == 60  # a server at a URL: 60 s
    # the config's round trips (engine defaults, a dump as to_dict/pickle write it) keep "not given"
    config = MemberConfig(model="llamacpp:x.gguf", http={"retries": 3}).with_defaults(MemberDefaults(slots=2))
    again = MemberConfig.model_validate(config.model_dump())
    assert config.http is not None and again.http is not None
    assert local_http(config.http).timeout_s == local_http(again.http).timeout_s == math.inf
    gguf = "llamacpp:x.gguf"
    assert MemberConfig(model=gguf, http={"timeout_s": 60}).key != MemberConfig(model=gguf).key
    with serve(slow) as (url, _):
        client = JsonClient("m", url, local_http(HttpSettings(retries=0)))
        assert client.deadline_s is None and client.post("/completion", {}) == {"ok": 1}
        with pytest.raises(MemberError, match="timed out after 0.3 s"):
            JsonClient("m", url, HttpSettings(timeout_s=0.3, retries=0)).post("/completion", {}, retry_timeouts=False)


def test_a_timed_out_call_is_not_retried_where_the_server_would_compute_every_copy() -> None:
    """A llama.cpp server goes on computing a ``/completion`` its client gave up on: a retry queued behind it
    in the same slot timed out too (timeout 3 s, 2 retries: the error after 9.4 s, the server busy until 48 s)."""
    with silent_socket() as url:
        client = JsonClient("m", url, HttpSettings(timeout_s=0.5, retries=2, backoff_s=0.05))
        started = time.monotonic()
        with pytest.raises(MemberError, match="not retried") as err:
            client.post("/completion", {"prompt": [1]}, retry_timeouts=False)
        assert time.monotonic() - started < 1.4  # one attempt of 0.5 s, not three
    assert "timed out after 0.5 s" in str(err.value)


def test_a_llamacpp_server_restarted_on_another_model_is_an_error_not_garbage() -> None:
    """A member connected to a Qwen server, the server restarted on Gemma at the same URL: the next answer
    was read through Qwen's vocabulary ('vent\x13\x13...', no error)."""
    from shared_engine.members.llamacpp import LlamaCppMember

    serving = {"model": "/models/qwen.gguf"}

    def handler(method: str, path: str, body: object) -> tuple[int, bytes]:
        if path == "/props":
            return 200, json.dumps({"total_slots": 1, "model_path": serving["model"],
                                    "default_generation_settings": {"n_ctx": 512}}).encode()
        return 200, json.dumps({"model": serving["model"], "completion_probabilities": [
            {"top_logprobs": [{"id": 5, "logprob": -0.1}]}]}).encode()

    tok = toy.byte_level_tokenizer()
    with serve(handler) as (url, _):
        member = LlamaCppMember("ll", url, LocalTokenizer(tok, len(tok), frozenset(), 512), check_tokenizer=False,
                                http=HttpSettings(retries=0))
        try:
            member.score([1, 2, 3], 3)  # the model it started with: read as before
            serving["model"] = "/models/gemma.gguf"
            with pytest.raises(MemberError, match="now serves /models/gemma.gguf, not /models/qwen.gguf"):
                member.score([1, 2, 3], 3)
        finally:
            member.close()


def test_a_llamacpp_member_does_not_retry_a_timed_out_completion() -> None:
    from shared_engine.members.llamacpp import LlamaCppMember

    completions: list[float] = []

    def handler(method: str, path: str, body: object) -> tuple[int, bytes]:
        if path == "/props":
            return 200, b'{"total_slots": 1, "default_generation_settings": {"n_ctx": 512}}'
        completions.append(time.monotonic())
        time.sleep(1.0)  # past the member's deadline
        return 200, b'{"completion_probabilities": []}'

    tok = toy.byte_level_tokenizer()
    with serve(handler) as (url, _):
        member = LlamaCppMember("ll", url, LocalTokenizer(tok, len(tok), frozenset(), 512), check_tokenizer=False,
                                http=HttpSettings(timeout_s=0.3, retries=2, backoff_s=0.05))
        try:
            with pytest.raises(MemberError, match="not retried"):
                member.score([1, 2, 3], 3)
        finally:
            member.close()
    assert len(completions) == 1  # three before: each queued behind the last in a real server's slot



@contextmanager
def trickling(answered: int, part: str) -> Iterator[tuple[str, list[int]]]:
    """A keep-alive server that answers the first ``answered`` requests of a connection with ``{}``
    and the next one with its ``part`` (headers or body) one byte every 0.2 s, forever. Yields its
    URL and the number of connections it accepted."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop, accepted = threading.Event(), [0]

    def read_request(conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += conn.recv(65536)

    def talk(conn: socket.socket) -> None:
        with conn:
            try:
                for _ in range(answered):
                    read_request(conn)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                read_request(conn)
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                if part == "body":
                    conn.sendall(b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
                while not stop.is_set():
                    conn.sendall(b"X" if part == "headers" else b" ")
                    time.sleep(0.2)
            except OSError:
                pass

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            accepted[0] += 1
            threading.Thread(target=talk, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        stop.set()
        thread.join()
        listener.close()


@pytest.mark.parametrize(("answered", "part"), [(0, "headers"), (1, "headers"), (0, "body")])
def test_a_server_that_trickles_its_answer_fails_at_the_deadline(answered: int, part: str) -> None:
    """The deadline holds from connect to last byte: httpx's timeouts bound each socket read, and a
    byte every 0.2 s never trips them (the headers case hung forever), on a new connection and on a
    kept-alive one alike."""
    with trickling(answered, part) as (url, accepted):
        client = JsonClient("m", url, HttpSettings(timeout_s=1.0, retries=0))
        for _ in range(answered):
            assert client.get("/props") == {}
        outcome: list[Any] = []

        def call() -> None:
            started = time.monotonic()
            try:
                client.post("/completion", {"prompt": [1]})
            except MemberError as err:
                outcome.extend([err, time.monotonic() - started])

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(8)
        assert not caller.is_alive(), "the request outlived its deadline"
        client.close()
    err, elapsed = outcome
    assert "1 s" in str(err) and 0.9 < elapsed < 5
    assert accepted[0] == 1  # the answered requests kept their connection


def test_looking_up_the_servers_name_ends_by_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """getaddrinfo takes no timeout: a resolver that hangs held the request past its deadline (3 s for
    a 0.5 s deadline here). A name's addresses are tried in turn, past a refused or a silent one, as
    socket.create_connection tries them."""
    real, release = socket.getaddrinfo, threading.Event()

    def resolver(host: str, port: object, *args: Any, **kwargs: Any) -> Any:
        if host == "hung.test":
            release.wait(3)
            return real("127.0.0.1", port, *args, **kwargs)
        if host == "two.test":  # nothing listens on 127.0.0.2, 127.0.0.3 is silent, the server is on 127.0.0.1
            return [entry for ip in ("127.0.0.2", "127.0.0.3", "127.0.0.1")
                    for entry in real(ip, port, *args, **kwargs)]
        if host == "missing.test":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, port, *args, **kwargs)

    def connect(backend: httpcore.SyncBackend, host: str, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        if host == "127.0.0.3":
            raise httpcore.ConnectTimeout("timed out")
        return real_connect(backend, host, *args, **kwargs)

    real_connect = httpcore.SyncBackend.connect_tcp
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    monkeypatch.setattr(httpcore.SyncBackend, "connect_tcp", connect)
    with serve(lambda method, path, body: (200, b'{"ok": true}')) as (url, _):
        port = url.rsplit(":", 1)[1]
        client = JsonClient("m", f"http://hung.test:{port}", HttpSettings(timeout_s=0.5, retries=0))
        started = time.monotonic()
        with pytest.raises(MemberError, match="timed out after 0.5 s"):
            client.get("/props")
        assert time.monotonic() - started < 2
        release.set()
        assert JsonClient("m", f"http://two.test:{port}", FAST).get("/props") == {"ok": True}
    with pytest.raises(MemberError, match="ConnectError: .*not known"):
        JsonClient("m", "http://missing.test:8000", HttpSettings(retries=0)).get("/props")


def test_a_refused_connection_is_retried_then_named() -> None:
    with silent_socket() as url:
        pass  # the port is closed again: connections are refused
    with pytest.raises(MemberError, match="ConnectError") as err:
        JsonClient("m", url, FAST).get("/health")
    assert err.value.url == url and err.value.member == "m"


def test_garbage_fails_at_once_and_503_is_retried() -> None:
    calls = []

    def flaky(method: str, path: str, body: object) -> tuple[int, bytes]:
        calls.append(path)
        if path == "/garbage":
            return 200, b"<html>oops</html>"
        if path == "/bad":
            return 400, b'{"error": "Requested sample logprobs of 301"}'
        return (503, b"busy") if calls.count(path) < 3 else (200, b'{"ok": true}')

    with serve(flaky) as (url, _):
        client = JsonClient("m", url, FAST)
        with pytest.raises(MemberError, match="not JSON"):
            client.get("/garbage")
        with pytest.raises(MemberError, match="HTTP 400.*301"):
            client.get("/bad")
        assert client.get("/busy") == {"ok": True}
    assert calls.count("/garbage") == 1 and calls.count("/bad") == 1 and calls.count("/busy") == 3



@pytest.mark.parametrize("url", ["http://127.0.0.1:80a0", "http://[::1", "http://exa mple.com",
                                 "http://127.0.0.1:99999", "http://:8000"])
def test_a_url_no_request_could_reach_is_refused_readably_before_connecting(url: str) -> None:
    with pytest.raises(InvalidRequestError, match="not a valid URL"):
        parse_member_spec(f"vllm:{url}")
    with pytest.raises(MemberError, match="not a valid URL") as err:
        JsonClient("m", url, FAST)
    assert err.value.member == "m"


def test_a_body_httpx_cannot_decode_and_a_closed_client_fail_as_member_errors_at_once() -> None:
    class BadGzip(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            calls.append(self.path)
            body = b"this is not gzip"
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    calls: list[str] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), BadGzip)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = JsonClient("m", f"http://127.0.0.1:{server.server_address[1]}", FAST)
        with pytest.raises(MemberError, match="DecodingError"):
            client.get("/props")
        assert calls == ["/props"]  # not retried: the same body would come back
        client.close()
        with pytest.raises(MemberError, match="closed"):
            client.get("/props")
    finally:
        server.shutdown()
        server.server_close()


def test_a_member_that_fails_to_start_closes_what_it_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server member whose start failed (its /tokenize disagrees, its /props fails, its vocabulary
    cannot be read) kept its HTTP client open (connections held while the error was kept, a
    ResourceWarning when collected); it closes its client, its tokenizer and an in-process server."""
    from shared_engine.members import http, remote, server_tokenizer
    from shared_engine.members.llamacpp import LlamaCppMember

    clients: list[JsonClient] = []

    class Recorded(JsonClient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            clients.append(self)

    class Tokenizer(LocalTokenizer):
        def close(self) -> None:
            closed.append("tokenizer")

    class Server:
        slots = 2

        def close(self) -> None:
            closed.append("server")

    monkeypatch.setattr(remote, "JsonClient", Recorded)
    monkeypatch.setattr(server_tokenizer, "JsonClient", Recorded)
    tok, closed = toy.byte_level_tokenizer(), []
    failing = HttpSettings(retries=0)

    def handler(method: str, path: str, body: object) -> tuple[int, bytes]:
        return (500, b"no") if path == "/props" else (200, b'{"tokens": [1, 2, 3]}')

    with serve(handler) as (url, _):
        with pytest.raises(MemberError, match="disagree"):
            SGLangMember("sg", url, Tokenizer(tok, len(tok), frozenset(), 512), http=failing)
        with pytest.raises(MemberError, match="HTTP 500"):
            LlamaCppMember("ll", url, Tokenizer(tok, len(tok), frozenset(), 512), http=failing,
                           server=Server(), check_tokenizer=False)  # type: ignore[arg-type]
        with pytest.raises(MemberError, match="HTTP 500"):
            server_tokenizer.LlamaCppServerTokenizer(url, failing)
    assert len(clients) == 3 and all(client._client.is_closed for client in clients)
    assert closed == ["tokenizer", "tokenizer", "server"]
    made: list[httpx.Client] = []

    class Client(httpx.Client):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(httpx, "Client", Client)
    monkeypatch.setattr(http, "_bound_by_deadline", lambda client, deadline: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # an httpx whose pools it cannot bound
        JsonClient("m", "http://127.0.0.1:9")
    assert made[0].is_closed


def test_cli_backend_applies_to_names_without_a_prefix() -> None:
    from shared_engine.cli import build_parser
    from shared_engine.engine_args import engine_from_args

    args = build_parser().parse_args(["bench", "--models", "smollm2-135m-instruct,vllm:http://h:1#x",
                                      "--backend", "transformers,llamacpp"])
    assert args.backend == ["transformers", "llamacpp"]
    engine = engine_from_args(args, "safe", "llamacpp")  # members load lazily: nothing starts here
    assert [s.model for s in engine._specs] == ["llamacpp:smollm2-135m-instruct", "vllm:http://h:1#x"]
    run = build_parser().parse_args(["run", "--models", "a,b", "--backend", "llamacpp", "hi"])
    assert [s.model for s in engine_from_args(run, "safe")._specs] == ["llamacpp:a", "llamacpp:b"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--models", "a", "--backend", "vllm"])


class MeetingTopK(TopKOfHF):
    """Its first scoring request waits at a barrier shared with the other verifier: the barrier only
    opens when both requests are in flight at once, so serial scoring breaks it (no timing involved)."""

    def __init__(self, hf: HFMember, barrier: threading.Barrier) -> None:
        super().__init__(hf, 20)
        self.barrier, self.met = barrier, False

    def score(self, ids: list[int], first_row: int) -> list[TopK]:
        if not self.met:
            self.met = True
            self.barrier.wait()  # raises BrokenBarrierError after its timeout if the other never comes
        return super().score(ids, first_row)


def test_remote_verifiers_are_scored_concurrently() -> None:
    barrier = threading.Barrier(2, timeout=60)
    drafter = toy.toy_member("llama-byte", "byte_level", "llama")
    verifiers = [MeetingTopK(toy.toy_member(n, "metaspace", "gpt2", seed=s), barrier)
                 for n, s in (("v1", 1), ("v2", 2))]
    EnsembleEngine([drafter, *verifiers], method="safe", draft_length=4).generate("Hi Sofia", max_new_tokens=4)
    assert all(v.met for v in verifiers) and not barrier.broken  # both first requests were in flight together



class Offline(RemoteMember):
    """A server member whose server is never asked (for what ``run`` does)."""

    def wire_capabilities(self) -> dict[str, bool]:
        return {"block_scoring": True, "prefix_cache": False, "token_id_prompts": True}

    def score(self, ids: list[int], first_row: int) -> list[TopK]:  # pragma: no cover - never called
        raise AssertionError

    def server_tokenize(self, text: str) -> list[int]:  # pragma: no cover - never called
        raise AssertionError


def test_a_server_members_calls_are_not_capped_by_asyncios_shared_thread_pool() -> None:
    """More calls at once than asyncio's default pool has threads (``min(32, cores + 4)``, shared by
    every member: 6 on a 2-core machine) all run together: each waits at a barrier that opens only
    when all of them are in flight. Cancelling an await leaves its call running, as before; a closed
    member runs no more calls."""
    calls = min(32, (os.cpu_count() or 1) + 4) + 1
    member = Offline("m", "http://127.0.0.1:9", toy_tokenizer(), check_tokenizer=False)
    barrier = threading.Barrier(calls, timeout=5)
    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.3)
        finished.set()

    async def main() -> None:
        await asyncio.gather(*(member.run(barrier.wait) for _ in range(calls)))
        task = asyncio.create_task(member.run(slow))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not finished.is_set()

    asyncio.run(main())
    assert not barrier.broken
    assert finished.wait(5)  # the cancelled call ran to its end in its thread
    member.close()
    with pytest.raises(MemberError, match="closed"):
        asyncio.run(member.run(time.sleep, 0))


def test_connecting_by_spec_finds_the_model_and_checks_the_tokenizer(tmp_path) -> None:  # noqa: ANN001
    import json

    from shared_engine.members import load_member
    from shared_engine.members.remote import PROBE_TEXT

    tok = toy.byte_level_tokenizer()
    tok.save_pretrained(tmp_path)
    recorded = replay(load_exchanges("vllm/completions.json", "sglang/generate.json"))

    def handler(method: str, path: str, body: object) -> tuple[int, bytes]:
        if path == "/tokenize" and isinstance(body, dict) and body.get("prompt") == PROBE_TEXT:
            return 200, json.dumps({"tokens": tok(PROBE_TEXT, add_special_tokens=False)["input_ids"]}).encode()
        return recorded(method, path, body)

    with serve(handler) as (url, _):
        vllm = load_member(f"vllm:{url}#{tmp_path}")
        # max_model_len 512, less the one new token every request asks
        assert isinstance(vllm, VLLMMember) and vllm.model == "tiny" and vllm.context_window == 511
        assert not vllm.capabilities.prefix_cache and vllm.capabilities.k == 20
        assert vllm.capabilities.computes_apart  # served elsewhere: overlap auto is on
        sglang = load_member(f"sglang:{url}#{tmp_path}")
        assert isinstance(sglang, SGLangMember) and sglang.capabilities.prefix_cache
        # without '#TOKENIZER' the model root /v1/models reports (/models/tiny) is not on this machine
        with pytest.raises(MemberError, match="TOKENIZER"):
            load_member(f"vllm:{url}")


def test_decoders_never_pick_from_the_spread_mass_of_a_top_k_member() -> None:
    """With temperature sampling, a top-K drafter only ever drafts one of its K exact ids, and its
    fusion candidates are only those K (the rest of its distribution is the even spread)."""
    from shared_engine.fusion import MemberDist, top_keys
    from shared_engine.members.base import exact_support
    from shared_engine.sampling import Sampler

    hf = toy.toy_member("a", "byte_level", "llama", 1)
    member = TopKOfHF(hf, 3)
    assert exact_support(member) == 3 and exact_support(hf) is None
    session = member.new_session()
    context = hf.prompt_ids([{"role": "user", "content": "Sofia"}])
    logits = session.sync(context, len(context))[-1]
    allowed = set(torch.topk(logits, 3).indices.tolist())
    sampler = Sampler(temperature=5.0, seed=0)  # hot: the spread mass would win almost always
    assert {sampler.from_logits(logits, exact_support(member)) for _ in range(200)} <= allowed
    assert len(top_keys(MemberDist("a", hf.table, logits, exact_support(member)), 10)) <= 3
    other = toy.toy_member("b", "metaspace", "gpt2", 2)
    result = EnsembleEngine([member, other], method="safe").generate("Sofia", max_new_tokens=16, temperature=2.0,
                                                                     seed=1)
    assert result.stats.tokens > 0


class PerRowTopK(TopKOfHF):
    """Test double of a server that pays one decode step per row (llama.cpp's multi-prompt scoring):
    no block scoring, and every row it is asked for is recorded."""

    def __init__(self, hf: HFMember) -> None:
        super().__init__(hf, hf.table.vocab_size)
        self.rows_asked: list[list[int]] = []

    def wire_capabilities(self) -> dict[str, bool]:
        return {"block_scoring": False, "prefix_cache": True, "token_id_prompts": True}

    def score(self, ids: list[int], first_row: int) -> list[TopK]:
        return self.score_at(ids, list(range(first_row, len(ids) + 1)))

    def score_at(self, ids: list[int], positions: list[int]) -> list[TopK]:
        self.rows_asked.append(list(positions))
        block = super().score(ids, positions[0])
        return [block[p - positions[0]] for p in positions]


def test_a_per_row_server_is_asked_only_for_the_rows_wanted() -> None:
    hf = toy.toy_member("llama-byte", "byte_level", "llama")
    remote = PerRowTopK(hf)
    ids = hf.tokenizer("Hello Sofia, how are you today?")["input_ids"]
    session = remote.new_session()
    rows = session.rows_at(ids, [4, 7, 9])
    want = torch.softmax(hf.new_session().sync(ids[:9], 4), -1)
    assert sorted(rows) == [4, 7, 9]
    for p in (4, 7, 9):
        assert torch.allclose(torch.softmax(rows[p], -1), want[p - 4], atol=1e-5)
    assert remote.rows_asked == [[4, 7, 9]] and session.ids == ids[:9]  # nothing past the last row wanted
    # the row after the held ids is reused; nothing wanted: nothing asked
    again = session.rows_at(ids, [9, 11])
    assert torch.equal(again[9], rows[9]) and remote.rows_asked[-1] == [11]
    assert session.rows_at(ids, []) == {} and len(remote.rows_asked) == 2
    # a server that scores blocks is asked for the block, as before
    block = TopKOfHF(hf, hf.table.vocab_size)
    block.new_session().rows_at(ids, [4, 7])
    assert block.requests == [(7, 4)]


def test_safe_asks_a_per_row_verifier_only_for_the_positions_the_drafter_is_unsure_of(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """#18: with drafter_confidence only the drafted positions below it can be fused, so a verifier
    that pays per row is asked for those rows alone: the same answer and fusions, fewer rows."""
    from shared_engine.decoding import round as round_module

    drafter = toy.toy_member("llama-byte", "byte_level", "llama")
    verifier_hf = toy.toy_member("gpt2-meta", "metaspace", "gpt2", seed=1)
    prompt, options = "Tell me about Sofia.", dict(max_new_tokens=32, draft_length=4)

    def run(threshold: float) -> tuple[object, PerRowTopK]:
        verifier = PerRowTopK(verifier_hf)
        answer = EnsembleEngine([drafter, verifier], method="safe", drafter_confidence=threshold,
                                **options).generate(prompt, keep_events=True)
        return answer, verifier

    probe, _ = run(0.5)
    sure = sorted(p.probs[probe.stats.drafter] for e in probe.events if e.type == "verify" for p in e.positions
                  if p.probs)
    threshold = sure[len(sure) // 2]  # about half the verified positions are decided by the drafter
    with monkeypatch.context() as patched:  # every row of every verified block, as before
        patched.setattr(round_module, "_undecided_offsets", lambda *args: None)
        every, every_verifier = run(threshold)
    only, only_verifier = run(threshold)
    assert only.text == every.text
    assert [(e.position, e.chosen) for e in only.events if e.type == "ensemble"] == \
        [(e.position, e.chosen) for e in every.events if e.type == "ensemble"]
    asked, asked_before = (sum(map(len, v.rows_asked)) for v in (only_verifier, every_verifier))
    assert only.stats.ensembled_tokens > 0 and 0 < asked < asked_before
    # and the same answer as a verifier that scores whole blocks
    block = EnsembleEngine([drafter, TopKOfHF(verifier_hf, verifier_hf.table.vocab_size)], method="safe",
                           drafter_confidence=threshold, **options).generate(prompt)
    assert block.text == only.text
