"""Edges of server members found by running them against real servers, checked here against loopback
stand-ins: a llama-server started with ``--alias``, settings that must not leak or be mistyped, two
members of one server, a server of another type than the prefix says, redirects, URL spellings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shared_engine.errors import MemberError
from shared_engine.members import load_member
from shared_engine.members.http import HttpSettings
from shared_engine.members.llamacpp import LlamaCppMember
from shared_engine.members.remote import LocalTokenizer
from tests import toy
from tests.fixture_server import serve


def toy_tokenizer() -> LocalTokenizer:
    tok = toy.byte_level_tokenizer()
    return LocalTokenizer(tok, len(tok), frozenset(), 512)


def test_a_llamacpp_server_with_an_alias_answers_under_its_alias() -> None:
    """``llama-server --alias qwen-coder``: /props gives the file as model_path, every /completion answer
    names the alias; every request failed with 'the server now serves qwen-coder, not /models/x.gguf'."""
    serving = {"model": "qwen-coder"}

    def handler(method: str, path: str, body: object) -> tuple[int, bytes]:
        if path == "/props":
            return 200, json.dumps({"total_slots": 1, "model_path": "/models/qwen.gguf", "model_alias": "qwen-coder",
                                    "default_generation_settings": {"n_ctx": 512}}).encode()
        return 200, json.dumps({"model": serving["model"], "completion_probabilities": [
            {"top_logprobs": [{"id": 5, "logprob": -0.1}]}]}).encode()

    with serve(handler) as (url, _):
        member = LlamaCppMember("ll", url, toy_tokenizer(), check_tokenizer=False, http=HttpSettings(retries=0))
        try:
            assert [e.ids for e in member.score([1, 2, 3], 3)] == [[5]]
            serving["model"] = "/models/qwen.gguf"  # the path is its name too
            assert [e.ids for e in member.score([1, 2, 3], 3)] == [[5]]
            serving["model"] = "gemma"  # restarted on another model: still refused
            with pytest.raises(MemberError, match="now serves gemma, not /models/qwen.gguf or qwen-coder"):
                member.score([1, 2, 3], 3)
        finally:
            member.close()


def test_a_typo_inside_http_settings_is_refused_naming_the_key() -> None:
    """``http: {timeout: 5, api-key: sk-x, retry: 0}`` was accepted as the defaults (60 s, no key, 2 retries)."""
    from shared_engine.errors import InvalidRequestError
    from shared_engine.members import member_config

    with pytest.raises(InvalidRequestError, match=r"http\.timeout: Extra inputs.*http\.api-key: Extra inputs"):
        member_config({"model": "vllm:http://h:8000", "http": {"timeout": 5, "api-key": "sk-x"}})
    assert member_config({"model": "vllm:http://h:8000", "http": {"timeout_s": 5}}).http == HttpSettings(timeout_s=5)


def test_an_api_key_is_sent_but_never_dumped_or_shown() -> None:
    """A member's API key was written in plain text wherever member options are dumped (an eval run's
    config.json and summary, a refused resume's differences, a repr in a log)."""
    from shared_engine.members import member_config
    from shared_engine.members.http import JsonClient

    config = member_config({"model": "vllm:http://h:8000", "http": {"api_key": "sk-VERY-SECRET"}})
    shown = [repr(config), str(config), config.model_dump_json(), json.dumps(config.model_dump(mode="json")),
             config.key, repr(config.http)]
    assert not [s for s in shown if "sk-VERY-SECRET" in s]
    assert config.model_dump(mode="json")["http"]["api_key"] == "**********"
    # the key still reaches the server, and survives the defaults being applied
    assert member_config(config).http is not None
    client = JsonClient("m", "http://127.0.0.1:9", member_config(config).http)
    try:
        assert client._client.headers["Authorization"] == "Bearer sk-VERY-SECRET"
    finally:
        client.close()
    # two keys are still two members (the registry keys them apart), one key one member
    other = member_config({"model": "vllm:http://h:8000", "http": {"api_key": "sk-OTHER"}})
    assert other.key != config.key
    assert member_config({"model": "vllm:http://h:8000", "http": {"api_key": "sk-VERY-SECRET"}}).key == config.key


@pytest.mark.parametrize("spec", ["vllm:HTTP://127.0.0.1:8000", "llamacpp:Http://127.0.0.1:8080", "HTTPS://h:1"])
def test_a_url_with_its_scheme_in_capitals_is_a_url(spec: str) -> None:
    """'vllm:HTTP://...' was refused ('vllm members are servers: give a URL'), 'llamacpp:Http://...' was
    looked up as a zoo name, a bare 'HTTPS://...' read as a backend prefix."""
    from shared_engine.errors import InvalidRequestError
    from shared_engine.members import parse_member_spec

    if spec.startswith("HTTPS"):  # no backend: a URL needs one, and the error says so (not 'unknown backend')
        with pytest.raises(InvalidRequestError, match="a URL needs a server backend prefix"):
            parse_member_spec(spec)
        return
    assert parse_member_spec(spec).is_url


def test_a_redirect_is_named_with_where_it_points() -> None:
    """A server behind a proxy that redirects (http -> https, a moved path) was reported as 'answered
    something that is not JSON: ''', saying nothing of the redirect."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from shared_engine.members.http import JsonClient

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(301)
            self.send_header("Location", "https://example.invalid" + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = JsonClient("m", f"http://127.0.0.1:{server.server_address[1]}", HttpSettings(retries=0))
    try:
        with pytest.raises(MemberError, match="GET /props answered HTTP 301, a redirect to https://example.invalid/props"):
            client.get("/props")
    finally:
        client.close()
        server.shutdown()
        server.server_close()


def test_a_server_of_another_type_than_the_prefix_is_named_with_the_prefix_it_needs() -> None:
    """'vllm:http://<a llama-server>': llama.cpp reads no prompt from vLLM's /tokenize request and answers
    [], and the member said 'the local tokenizer and the server's disagree ... (server [])', advice to
    change the tokenizer rather than the prefix."""
    from shared_engine.members.sglang import SGLangMember
    from shared_engine.members.vllm import VLLMMember

    owner = {"name": "llamacpp"}

    def llama_server(method: str, path: str, body: object) -> tuple[int, bytes]:
        if path == "/v1/models":
            return 200, json.dumps({"object": "list", "data": [{"id": "qwen", "owned_by": owner["name"]}]}).encode()
        if path == "/tokenize":
            return 200, json.dumps({"tokens": []}).encode()  # no "content": nothing tokenized
        return 404, b'{"error": "File Not Found"}'

    with serve(llama_server) as (url, _):
        with pytest.raises(MemberError, match=rf"not a vllm server: it says it is llamacpp \(did you mean "
                                              rf"'llamacpp:{url}'\?\)"):
            VLLMMember("v", url, toy_tokenizer(), model="qwen", http=HttpSettings(retries=0))
        with pytest.raises(MemberError, match=f"not a sglang server.*did you mean 'llamacpp:{url}'"):
            SGLangMember("s", url, toy_tokenizer(), http=HttpSettings(retries=0))
        # 'sglang:' connecting to it: its /get_model_info is a 404 (before: that alone, no hint)
        with pytest.raises(MemberError, match=rf"get_model_info answered HTTP 404.*not a sglang server: it says "
                                              rf"it is llamacpp \(did you mean 'llamacpp:{url}'\?\)"):
            load_member(f"sglang:{url}#toy", http=HttpSettings(retries=0))
        owner["name"] = "someone"  # a server that does not say what it is: the prefixes to check
        with pytest.raises(MemberError, match=r"not a vllm server \(check the backend prefix: llamacpp, vllm, sglang"):
            VLLMMember("v", url, toy_tokenizer(), model="qwen", http=HttpSettings(retries=0))


def test_a_url_ending_in_v1_is_told_to_give_the_servers_root() -> None:
    """'vllm:http://host:8000/v1' (the OpenAI base URL users copy) asked /v1/v1/models and failed with a
    bare 404."""
    from shared_engine.members.http import JsonClient

    def openai_server(method: str, path: str, body: object) -> tuple[int, bytes]:
        return (200, b'{"data": []}') if path == "/v1/models" else (404, b'{"detail": "Not Found"}')

    with serve(openai_server) as (url, _):
        for given in (f"{url}/v1", f"{url}/v1/"):
            client = JsonClient("m", given, HttpSettings(retries=0))
            try:
                with pytest.raises(MemberError, match=f"HTTP 404.*the URL ends in /v1: give the server's root, {url};"):
                    client.get("/v1/models")
            finally:
                client.close()
        client = JsonClient("m", url, HttpSettings(retries=0))  # the root: no hint on another 404
        try:
            with pytest.raises(MemberError, match=r"HTTP 404: \{\"detail\": \"Not Found\"\}$"):
                client.get("/props")
        finally:
            client.close()


def test_members_pinning_one_servers_slots_share_its_pool() -> None:
    """Two pinned members of one llama-server in one process (another top_k, or the URL with a trailing
    slash) each had a pool of their own: both leased slot 0, so their requests queued on one slot and
    evicted each other's prefix cache while the other slot idled (13.2 s against 3.4 s)."""
    from shared_engine.members import parse_member_spec
    from tests.fixture_server import LlamaCppLike

    server = LlamaCppLike(lambda prompt: [(5, -0.1)], slots=2)
    with serve(server) as (url, _):
        assert parse_member_spec(f"llamacpp:{url}/").target == url  # one member, not two
        a = LlamaCppMember("a", url, toy_tokenizer(), check_tokenizer=False, pin_slots=True)
        b = LlamaCppMember("b", f"{url.upper()}/", toy_tokenizer(), check_tokenizer=False, pin_slots=True, top_k=5)
        c = LlamaCppMember("c", url, toy_tokenizer(), check_tokenizer=False)  # pins nothing: leases nothing
        try:
            first, second = a.new_session(), b.new_session()
            assert {first.slot, second.slot} == {0, 1} and c.new_session().slot is None
            assert b.new_session().slot is None  # every slot leased: the next request goes without one
            first.close()
            assert b.new_session().slot == first.slot
        finally:
            for member in (a, b, c):
                member.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "127.1", "0.0.0.0", "[::ffff:127.0.0.1]"])
def test_a_member_on_this_machine_is_reached_past_a_proxy_from_the_environment(
        host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With HTTP_PROXY set and no NO_PROXY (corporate machines, clusters) an in-process llama.cpp server
    started, then every member call went to the proxy and failed as "connection refused" at the
    member's own URL: loopback calls ignore the environment's proxy."""
    from shared_engine.members.http import HttpSettings, JsonClient

    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with serve(lambda method, path, body: (200, json.dumps({"ok": path}).encode())) as (url, log):
        client = JsonClient("m", url.replace("127.0.0.1", host), HttpSettings(retries=0))
        try:
            assert client.get("/health") == {"ok": "/health"}
        finally:
            client.close()
    assert log == [("GET", "/health", None)]


def _sglang_server(folder: str, models: tuple[int, object]) -> object:
    """A stand-in SGLang server in the shapes of SGLang's ``python/sglang/srt/entrypoints/http_server.py``:
    ``GET /get_model_info`` -> ``{"model_path", "tokenizer_path", "is_generation",
    "preferred_sampling_params", "weight_version"}`` (no length); ``GET /v1/models`` -> ``ModelList`` of
    ``ModelCard(id=served_model_name, root=served_model_name, max_model_len=model_config.context_len)``
    (``max_model_len`` since sgl-project/sglang PR #4809; ``models`` is its status and body here); and
    ``/generate`` past the window answered as the tokenizer manager's ValueError is (HTTP 400,
    ``ErrorResponse``)."""
    from shared_engine.members.remote import PROBE_TEXT

    tok = toy.byte_level_tokenizer()

    def handler(method: str, path: str, body: object) -> tuple[int, bytes]:
        if path == "/get_model_info":
            return 200, json.dumps({"model_path": folder, "tokenizer_path": folder, "is_generation": True,
                                    "preferred_sampling_params": None, "weight_version": "default"}).encode()
        if path == "/v1/models":
            return models[0], json.dumps(models[1]).encode()
        if path == "/tokenize" and isinstance(body, dict) and body.get("prompt") == PROBE_TEXT:
            ids = tok(PROBE_TEXT, add_special_tokens=False)["input_ids"]
            return 200, json.dumps({"tokens": ids, "count": len(ids), "max_model_len": 64}).encode()
        return 400, json.dumps({"object": "error", "code": 400, "type": "Bad Request",
                                "message": "Requested token count exceeds the model's maximum context length of "
                                           "64 tokens."}).encode()
    return handler


def _card(**extra: object) -> dict[str, object]:
    return {"object": "list", "data": [{"id": "tiny", "object": "model", "created": 1764000000,
                                        "owned_by": "sglang", "root": "tiny", **extra}]}


def test_an_sglang_server_started_with_a_shorter_context_refuses_a_long_prompt_up_front(tmp_path) -> None:  # noqa: ANN001
    """An SGLang server started with --context-length 64 for a model of 4096 positions: the member took
    its window from the tokenizer folder (4096), so a prompt of ~100 tokens passed the engine's check
    and the server's 400 came mid-generation as a MemberError. The window now comes from the server's
    /v1/models max_model_len (less two: SGLang refuses input + max_new_tokens >= context_len, and
    every request asks one new token)."""
    from shared_engine import EnsembleEngine
    from shared_engine.errors import ContextLengthError

    toy.byte_level_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    with serve(_sglang_server(str(tmp_path), (200, _card(max_model_len=64)))) as (url, log):
        member = load_member(f"sglang:{url}", http=HttpSettings(retries=0))
        engine = EnsembleEngine([member, toy.toy_member("b", "metaspace", "gpt2", 2)], method="safe")
        with pytest.raises(ContextLengthError, match=re.escape(f"{tmp_path}'s context window of 62 tokens")):
            engine.generate("Sofia went to the market and bought " * 8, max_new_tokens=8)
        assert all(path != "/generate" for _, path, _ in log)  # refused before any scoring
        # a longer context than the 2048 the member assumed without max_position_embeddings
        (tmp_path / "config.json").unlink()
    with serve(_sglang_server(str(tmp_path), (200, _card(max_model_len=32768)))) as (url, _):
        assert load_member(f"sglang:{url}", http=HttpSettings(retries=0)).context_window == 32766


def test_an_sglang_or_vllm_server_that_reports_no_context_length_falls_back_to_the_folder(tmp_path) -> None:  # noqa: ANN001
    """An SGLang server from before max_model_len was in /v1/models (or with no /v1/models at all), and a
    vLLM-shaped answer without it: the window is the folder's max_position_embeddings, else 2048."""
    toy.byte_level_tokenizer().save_pretrained(tmp_path)
    for models in ((200, _card()), (404, {"detail": "Not Found"}), (200, _card(max_model_len=None))):
        with serve(_sglang_server(str(tmp_path), models)) as (url, _):
            assert load_member(f"sglang:{url}", http=HttpSettings(retries=0)).context_window == 2048
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    with serve(_sglang_server(str(tmp_path), (200, _card()))) as (url, _):
        assert load_member(f"sglang:{url}", http=HttpSettings(retries=0)).context_window == 4096
        vllm = load_member(f"vllm:{url}#{tmp_path}", http=HttpSettings(retries=0))
        assert vllm.context_window == 4096  # vLLM's /v1/models without max_model_len: the same fallback


def test_what_names_this_machine() -> None:
    """What llama-server prints (0.0.0.0), short and mapped forms and RFC 6761's names are this machine;
    a host that merely contains one is not."""
    from shared_engine.members.http import is_loopback

    local = ["127.0.0.1", "127.1.2.3", "127.1", "0.0.0.0", "[::1]", "[::]", "[::ffff:127.0.0.1]", "localhost",
             "LOCALHOST", "localhost.", "api.localhost"]
    remote = ["10.0.0.1", "example.com", "localhost.example.com", "my-localhost", "[2001:db8::1]"]
    assert [h for h in local if not is_loopback(f"http://{h}:8000")] == []
    assert [h for h in remote if is_loopback(f"http://{h}:8000")] == []


def test_a_member_on_this_machine_over_https_trusts_the_environments_certificates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the proxy, loopback calls still read SSL_CERT_FILE (a self-signed certificate a local server
    is trusted by): turning the environment off for them (b728cba) failed such a member with
    CERTIFICATE_VERIFY_FAILED."""
    import shutil
    import ssl
    import subprocess
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from shared_engine.members.http import HttpSettings, JsonClient

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"ok": True}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("NO_PROXY", raising=False)
    client = JsonClient("m", f"https://localhost:{server.server_address[1]}", HttpSettings(retries=0))
    try:
        assert client.get("/health") == {"ok": True}
    finally:
        client.close()
        server.shutdown()
        server.server_close()
