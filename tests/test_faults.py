"""Faults of a remote member mid-answer, on a real llama.cpp server (issue: reliability, part 4).

The verifier is a real ``llama-server`` (xllamacpp, SmolLM2 GGUF) reached through a loopback proxy
that forwards every request unchanged until the test switches it to a fault: stall (answers after
the member's deadline), malformed JSON, a wrong-vocabulary distribution (every id past the
vocabulary), or the server process killed. Each fault must end the request within its deadline
with a ``MemberError`` naming the member and the URL, leave the engine serving, and, with
``on_member_failure="degrade"``, let the answer finish on the remaining member and say so.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from shared_engine import EnsembleEngine, MemberError
from shared_engine.members import load_member
from shared_engine.members.http import HttpSettings
from shared_engine.zoo import gguf_path
from tests.fixture_server import free_port, serve
from tests.test_llamacpp import start_server

pytestmark = pytest.mark.zoo
SMOL = "smollm2-135m-instruct"
DEADLINE = HttpSettings(timeout_s=3.0, connect_timeout_s=1.0, retries=1, backoff_s=0.1)
PROMPT = "Count from one to thirty in words, separated by commas."


def _poison_ids(value: Any, shift: int) -> Any:
    if isinstance(value, dict):
        return {k: (v + shift if k == "id" and isinstance(v, int) else _poison_ids(v, shift)) for k, v in value.items()}
    if isinstance(value, list):
        return [_poison_ids(v, shift) for v in value]
    return value


@pytest.fixture(scope="module")
def llama_server():  # noqa: ANN201
    port = free_port()
    proc = start_server(str(gguf_path(SMOL, progress=False)), port)
    yield proc, f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


@pytest.fixture
def proxy(llama_server):  # noqa: ANN001, ANN201
    """(URL, mode): forwards to the real server while ``mode["fault"]`` is None."""
    _, upstream = llama_server
    mode: dict[str, str | None] = {"fault": None}

    def handle(method: str, path: str, body: Any) -> tuple[int, bytes]:
        fault = mode["fault"]
        if fault == "stall":
            time.sleep(DEADLINE.timeout_s + 1.5)
        answer = httpx.request(method, upstream + path, json=body, timeout=60)
        if fault == "malformed":
            return 200, answer.content[: len(answer.content) // 2]
        if fault == "wrong_vocab" and path == "/completion":
            return 200, json.dumps(_poison_ids(answer.json(), 1_000_000)).encode()
        return answer.status_code, answer.content

    with serve(handle) as (url, _):
        yield url, mode


def _engine(url: str, method: str = "safe", **options: Any) -> EnsembleEngine:
    drafter = load_member(f"llamacpp:{SMOL}")
    verifier = load_member(f"llamacpp:{url}", http=DEADLINE)
    # the paper's rule: the verifier is asked every round (SAFE's default gate would let the sure
    # drafter skip most of its calls, and the fault would have nothing to hit)
    options.setdefault("drafter_confidence", None)
    return EnsembleEngine([drafter, verifier], method=method, max_new_tokens=60, **options)


@pytest.mark.parametrize("fault", ["stall", "malformed", "wrong_vocab"])
def test_a_fault_mid_answer_fails_in_time_naming_the_member_and_the_engine_goes_on(proxy, fault: str) -> None:  # noqa: ANN001
    url, mode = proxy
    engine = _engine(url)
    baseline = engine.generate(PROMPT).text
    stream = engine.stream(PROMPT)
    assert next(e for e in stream if e.type == "token").text
    mode["fault"] = fault
    started = time.monotonic()
    with pytest.raises(MemberError) as err:
        for _ in stream:
            pass
    elapsed = time.monotonic() - started
    # two attempts at most (retries=1) of a 3 s deadline each, plus backoff: never a hang. The bound
    # leaves room for two fully busy cores and stays below the proxy's 60 s upstream timeout.
    assert elapsed < 40, elapsed
    assert url in str(err.value) and err.value.url == url
    mode["fault"] = None
    assert engine.live_requests == 0
    assert engine.generate(PROMPT).text == baseline  # the same engine serves the next request


@pytest.mark.parametrize("method", ["safe", "adafuse"])
def test_degrade_finishes_on_the_remaining_member_and_says_so(proxy, method: str) -> None:  # noqa: ANN001
    url, mode = proxy
    engine = _engine(url, method, on_member_failure="degrade")
    events = []
    for event in engine.stream(PROMPT):
        events.append(event)
        if event.type == "token" and mode["fault"] is None:
            mode["fault"] = "malformed"
    mode["fault"] = None
    finish = events[-1]
    assert finish.type == "finish" and finish.reason in {"eos", "length", "stop"}
    assert list(finish.failed_members) == [engine.labels[1]]
    assert url in finish.failed_members[engine.labels[1]]
    assert "".join(e.text for e in events if e.type == "token") == finish.text
    assert finish.text.strip() and "\ufffd" not in finish.text
    assert finish.stats.forward_passes == {engine.labels[0]: finish.stats.forward_passes[engine.labels[0]]}


def test_a_killed_drafter_server_hands_drafting_to_the_next_member() -> None:
    port = free_port()
    proc = start_server(str(gguf_path(SMOL, progress=False)), port)
    url = f"http://127.0.0.1:{port}"
    try:
        drafter = load_member(f"llamacpp:{url}", http=DEADLINE)
        engine = EnsembleEngine([drafter, load_member(f"llamacpp:{SMOL}")], method="safe",
                                max_new_tokens=40, on_member_failure="degrade")
        events = []
        for event in engine.stream(PROMPT):
            events.append(event)
            if event.type == "token" and proc.poll() is None:
                proc.kill()
                proc.wait()
        finish = events[-1]
        assert finish.type == "finish" and list(finish.failed_members) == [engine.labels[0]]
        assert finish.text.startswith(events[0].text if events[0].type == "token" else "")
        assert finish.stats.tokens > 2 and "".join(e.text for e in events if e.type == "token") == finish.text
    finally:
        proc.kill()
        proc.wait()


def test_a_member_error_survives_pickle_and_copy() -> None:
    """A process pool's worker that raised it died as BrokenProcessPool (unpickling called
    ``__init__`` with the message alone), and ``copy.copy`` raised a TypeError."""
    import copy
    import pickle

    err = MemberError("qwen", "http://127.0.0.1:8080", "POST /completion timed out")
    for again in (pickle.loads(pickle.dumps(err)), copy.copy(err)):
        assert type(again) is MemberError and str(again) == str(err)
        assert (again.member, again.url, again.reason) == (err.member, err.url, err.reason)
