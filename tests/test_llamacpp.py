"""llama.cpp members on the real zoo GGUFs (xllamacpp): distributions against transformers, SAFE
end to end, the partial-UTF-8 workaround, and a real llama-server that dies mid-answer."""

from __future__ import annotations

import platform
import subprocess
import sys
import time

import httpx
import pytest
import torch

from shared_engine import EnsembleEngine
from shared_engine.errors import MemberError
from shared_engine.members import HFMember, load_member
from shared_engine.members.http import HttpSettings
from shared_engine.members.llamacpp import LlamaCppMember
from shared_engine.zoo import gguf_path
from tests.fixture_server import free_port

pytestmark = pytest.mark.zoo

QWEN, SMOL = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"
PROMPTS = ["What is the capital of France?",
           ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether?")]

# Tolerances, measured (4 prompts x 24 greedy tokens, 145 positions): top-1 agreement 0.973 (SmolLM2)
# and 0.986 (Qwen); |p_llama - p_transformers| on transformers' top-5 ids: mean 0.005 / 0.001,
# max 0.070 / 0.020. Both backends run the SAME weights (the zoo's transformers folder is the
# dequantized GGUF), so the differences come from llama.cpp's arithmetic (activations quantized to
# 8 bits inside the Q4 dot products, f16 KV cache); the few top-1 flips were near-ties. The bounds
# below leave about 2x headroom.
MIN_TOP1_AGREEMENT = 0.9
MAX_MEAN_PROB_DIFF = 0.02
MAX_PROB_DIFF = 0.15


@pytest.mark.parametrize("name", [SMOL, QWEN])
def test_llamacpp_topk_agrees_with_transformers(name: str) -> None:
    hf, ll = load_member(f"transformers:{name}", progress=False), load_member(f"llamacpp:{name}", progress=False)
    assert ll.capabilities.distribution == "top_k" and not ll.capabilities.block_scoring
    assert not ll.capabilities.computes_apart  # served in this process, on its cores: overlap auto stays off
    agree = total = 0
    diffs = []
    for question in PROMPTS:
        ids = hf.prompt_ids([{"role": "user", "content": question}])
        assert ll.prompt_ids([{"role": "user", "content": question}]) == ids
        answer = hf.model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                                   pad_token_id=0)[0, len(ids):].tolist()
        want = torch.softmax(hf.new_session().sync(ids + answer, len(ids)), -1)
        got = torch.softmax(ll.new_session().sync(ids + answer, len(ids)), -1)
        assert got.shape == want.shape
        agree += int((want.argmax(-1) == got.argmax(-1)).sum())
        total += want.shape[0]
        top5 = want.topk(5, dim=-1).indices
        diffs.append((want.gather(1, top5) - got.gather(1, top5)).abs())
    diff = torch.cat(diffs)
    assert agree / total >= MIN_TOP1_AGREEMENT
    assert float(diff.mean()) <= MAX_MEAN_PROB_DIFF and float(diff.max()) <= MAX_PROB_DIFF


def test_zoo_names_run_on_llamacpp_by_default_and_on_transformers_when_placed() -> None:
    (member,) = EnsembleEngine([SMOL], method="single").members
    assert isinstance(member, LlamaCppMember) and member is load_member(f"llamacpp:{SMOL}")
    (placed,) = EnsembleEngine([SMOL], method="single", dtype="float32").members
    assert isinstance(placed, HFMember) and placed is load_member(f"transformers:{SMOL}")


def test_safe_over_llamacpp_members_writes_valid_text() -> None:
    engine = EnsembleEngine([f"llamacpp:{QWEN}", f"llamacpp:{SMOL}"], method="safe")
    question = "What is 17 + 25? Answer briefly."
    result = engine.generate(question, max_new_tokens=32)
    assert "42" in result.text and result.finish_reason in ("eos", "length")
    # the same kind of answer as the transformers members give
    transformers = EnsembleEngine([f"transformers:{QWEN}", f"transformers:{SMOL}"], method="safe")
    assert "42" in transformers.generate(question, max_new_tokens=32).text
    # emoji and CJK: byte tokens, partial UTF-8 argmaxes, multi-token characters
    result = engine.generate("Write five food emojis and the Japanese word for cat.", max_new_tokens=40)
    assert result.text.strip() and "\ufffd" not in result.text
    events = list(engine.stream(PROMPTS[1], max_new_tokens=48))
    kinds = {e.type for e in events}
    assert {"token", "draft", "verify", "finish"} <= kinds
    finish = events[-1]
    assert "\ufffd" not in finish.text and finish.stats.tokens > 0


def test_a_partial_utf8_argmax_still_gets_its_distribution() -> None:
    """Qwen's next token here is b'\\xe2' (the first byte of a keycap emoji): llama.cpp returns NO
    probabilities for such a token unless it is banned via logit_bias, which leaves them raw."""
    ll = load_member(f"llamacpp:{QWEN}", progress=False)
    ids = ll.prompt_ids([{"role": "user", "content": "Write 5 different emojis about food, nothing else."}])
    ids += ll.tokenizer.encode("1\ufe0f")
    row = ll.new_session().sync(ids, len(ids))[-1]
    top = int(row.argmax())
    piece = ll.table.pieces[top]
    with pytest.raises(UnicodeDecodeError):
        piece.decode("utf-8")
    assert float(torch.softmax(row, -1)[top]) > 0.5


SERVER = """
import sys, time
import xllamacpp as xlc
p = xlc.CommonParams()
p.model.path, p.port, p.n_ctx, p.n_parallel = sys.argv[1], int(sys.argv[2]), 2048, 1
p.cpuparams.n_threads, p.warmup, p.verbosity = 1, False, -1
server = xlc.Server(p)
print("ready", flush=True)
time.sleep(3600)
"""


def start_server(gguf: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, gguf, str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("llama-server did not come up")


def test_a_llama_server_killed_mid_answer_gives_a_clear_error_and_the_engine_recovers() -> None:
    gguf, port = str(gguf_path(SMOL, progress=False)), free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(gguf, port)
    try:
        # tokenizer discovered from the model path /props reports (the GGUF itself)
        member = load_member(f"llamacpp:{url}", http=HttpSettings(timeout_s=10, retries=1, backoff_s=0.1))
        engine = EnsembleEngine([member], method="single")
        stream = engine.stream("Count from one to fifty in words.", max_new_tokens=100)
        assert next(e for e in stream if e.type == "token").text
        proc.kill()
        proc.wait()
        started = time.monotonic()
        with pytest.raises(MemberError) as err:
            for _ in stream:
                pass
        assert time.monotonic() - started < 60  # connection refused at once; the bound only catches a hang
        assert url in str(err.value) and member.name in str(err.value)
        proc = start_server(gguf, port)  # the same engine serves the next request
        result = engine.generate("What is 2 + 2?", max_new_tokens=12)
        assert result.text.strip() and result.stats.tokens > 0
    finally:
        proc.kill()
        proc.wait()


def test_the_langchain_and_llamaindex_adapters_take_member_specs() -> None:
    from langchain_ensemble import ChatEnsemble
    from llamaindex_ensemble import EnsembleLLM

    specs = [f"llamacpp:{QWEN}", f"llamacpp:{SMOL}"]
    assert "42" in ChatEnsemble(models=specs, max_tokens=24).invoke("What is 17 + 25? Answer briefly.").content
    assert "42" in EnsembleLLM(models=specs, max_tokens=24).complete("What is 17 + 25? Answer briefly.").text


def test_closing_the_last_engine_that_holds_a_member_frees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Members are shared by the engines that name them; close() releases this engine's hold, and
    the last release closes the member (here: stops its in-process llama.cpp server) and hands the
    freed heap back to the OS (each engine built its members in another thread, whose malloc arena
    glibc kept: RSS grew ~40 MB per create/generate/close cycle of one SmolLM2 member)."""
    from shared_engine import members as registry
    from shared_engine.members import load_member as registry_load

    trims: list[bool] = []
    trim = registry.return_freed_memory
    monkeypatch.setattr(registry, "return_freed_memory", lambda: trims.append(trim()) or True)

    spec = f"llamacpp:{SMOL}#{SMOL}"  # a registry key no other test's (never closed) engines hold
    first, second = (EnsembleEngine([spec], method="single", max_new_tokens=4) for _ in range(2))
    assert first.generate("Hi").text and second.generate("Hi").text
    member = first.members[0]
    assert second.members[0] is member and registry_load(spec) is member
    first.close()
    assert registry_load(spec) is member and second.generate("Hi").text  # still held by `second`
    assert trims == []
    second.close()
    assert trims == [sys.platform == "linux" and platform.libc_ver()[0] == "glibc"]
    # released: its HTTP client is closed and its in-process server handle dropped (the C++ server
    # stops once nothing else refers to it)
    assert member.client._client.is_closed and member.server._server is None
    third = EnsembleEngine([spec], method="single", max_new_tokens=4)
    assert third.generate("Hi").text and third.members[0] is not member  # loaded afresh
    third.close()


def test_two_concurrent_requests_each_keep_their_own_slot_and_prefix_cache() -> None:
    """Two requests at once on a two-slot server: every call of a request names its slot (the
    server answers from that slot), the calls overlap in time (no lock in front of the member),
    and after its first call each request's server work is only its new tokens (``prompt_n``): the
    other request never evicted its prefix cache."""
    import asyncio

    from shared_engine.members.llamacpp import LlamaCppMember
    from shared_engine.members.remote import load_tokenizer

    member = LlamaCppMember.from_gguf("smol-two-slots", gguf_path(SMOL, progress=False), load_tokenizer(SMOL),
                                      n_ctx=1024, slots=2)
    assert member.client.deadline_s is None  # its own server: no deadline (local_http)
    calls: list[tuple[int | None, float, float, list[dict]]] = []  # (slot sent, start, end, results)
    send = member.client.post

    def recording(path: str, body: dict, **options: object) -> object:
        started = time.monotonic()
        answer = send(path, body, **options)  # type: ignore[arg-type]
        calls.append((body.get("id_slot"), started, time.monotonic(), answer if isinstance(answer, list) else [answer]))
        return answer

    member.client.post = recording  # type: ignore[method-assign]
    try:
        engine = EnsembleEngine([member], method="single")

        async def both() -> list[str]:
            results = await asyncio.gather(*(engine.agenerate(p, max_new_tokens=16) for p in PROMPTS))
            return [r.text for r in results]

        together = asyncio.run(both())
        assert all(t.strip() for t in together)
        assert {slot for slot, *_ in calls} == {0, 1} and member.slots.leased == 0
        for slot in (0, 1):
            mine = [(results, start, end) for s, start, end, results in calls if s == slot]
            assert all(r["id_slot"] == slot for results, *_ in mine for r in results)
            # after the prompt, each call processed only the token it added (1), never the whole sequence
            assert [r["timings"]["prompt_n"] for results, *_ in mine[1:] for r in results] == [1] * (len(mine) - 1)
        spans = sorted((start, end) for _, start, end, _ in calls)
        assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))  # calls overlapped
    finally:
        member.close()


def test_a_server_with_embeddings_returns_every_prompt_tokens_hidden_state_and_still_completes() -> None:
    """``LocalLlamaServer(embeddings=True)``, as scripts/one_pass_rows.py uses it: ``/embeddings`` gives one
    hidden state per prompt token (a whole few-shot block in one batch), and completions keep their
    probabilities, so a member on that server scores as before."""
    from shared_engine.members.llamacpp import LocalLlamaServer
    from shared_engine.members.remote import load_tokenizer

    server = LocalLlamaServer(gguf_path(SMOL, progress=False), n_ctx=1024, threads=2, slots=1, embeddings=True)
    member = LlamaCppMember(SMOL, server.url, load_tokenizer(SMOL), server=server, context_window=1024)
    try:
        ids = member.server_tokenize(PROMPTS[1] * 16)
        assert len(ids) > 512  # more than llama.cpp's default physical batch
        hidden = member.client.post("/embeddings", {"content": ids, "id_slot": 0})[0]["embedding"]
        assert len(hidden) == len(ids) and {len(row) for row in hidden} == {576}  # SmolLM2-135M's width
        (row,) = member.score_at(ids[:40], [40], slot=0)
        assert len(row.ids) == member.top_k
    finally:
        member.close()


@pytest.mark.parametrize("name", [SMOL, QWEN, "gemma-3-270m"])
def test_a_llamacpp_members_tokenizer_needs_no_conversion_and_matches_the_converted_folder(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """load_tokenizer(zoo name) went through zoo.resolve: the full fp32 conversion of the weights
    (15-45 s, ~2 GB for Qwen, nothing printed) for a tokenizer. It reads the tokenizer folder and the
    GGUF header now, and gives what the converted folder gives."""
    from shared_engine import zoo
    from shared_engine.members.remote import LocalTokenizer, load_tokenizer

    converted = zoo.resolve(name, progress=False).path  # the reference (converted on an earlier run)
    def no_conversion(*args: object, **kwargs: object) -> None:
        raise AssertionError("a llama.cpp member's tokenizer converted the weights")

    monkeypatch.setattr(zoo, "resolve", no_conversion)
    monkeypatch.setattr(zoo, "_convert", no_conversion)
    fast = load_tokenizer(name)
    monkeypatch.undo()
    reference = load_tokenizer(str(converted))
    assert isinstance(fast, LocalTokenizer)
    assert (fast.vocab_size, fast.eos_ids, fast.context_window) == (
        reference.vocab_size, reference.eos_ids, reference.context_window)
    text = "Sofia walked to the café: 17 + 25 = 42.\n\tDone! 你好 🙂"
    assert fast.tokenizer(text)["input_ids"] == reference.tokenizer(text)["input_ids"]
    assert fast.tokenizer.chat_template == reference.tokenizer.chat_template
