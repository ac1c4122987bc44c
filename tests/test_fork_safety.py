"""A process forked after members loaded (multiprocessing's fork start method, a ``ProcessPoolExecutor``
such as LlamaIndex's ``IngestionPipeline.arun(num_workers=...)``, gunicorn's preload) inherits members
whose worker threads, HTTP connections and in-process llama.cpp servers stayed in the parent. Its first
call waited forever. Now an engine built from names or configs loads its members again in the child,
and a member object built in the parent fails at once, saying why. Every child here is bounded: a hang
fails the test instead of hanging the suite."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import shared_engine.members as registry
from shared_engine import EnsembleEngine
from shared_engine.errors import MemberError
from shared_engine.members import hf, llamacpp
from shared_engine.members.llamacpp import LlamaCppMember
from shared_engine.members.remote import LocalTokenizer
from tests import toy
from tests.fixture_server import LlamaCppLike, serve

CHILD_TIMEOUT_S = 60.0


def _in_forked_child(target: Callable[[], Any]) -> Any:
    """``target()``'s value (or the error it raised, as text) in a forked child, within CHILD_TIMEOUT_S."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def run() -> None:
        try:
            results.put(("ok", target()))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            results.put(("error", f"{type(exc).__name__}: {exc}"))

    child = context.Process(target=run)
    started = time.monotonic()
    child.start()
    child.join(CHILD_TIMEOUT_S)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"the forked child hung (killed after {CHILD_TIMEOUT_S:g} s)")
    assert child.exitcode == 0, f"the forked child died (exit code {child.exitcode})"
    return (*results.get(timeout=5), time.monotonic() - started)


class InProcessServerStandIn:
    """What a LlamaCppMember reads of the in-process server it runs on (``LocalLlamaServer``), counting stops."""

    def __init__(self, url: str, slots: int) -> None:
        self.url, self.slots, self.gguf, self.stops = url, slots, Path(__file__), 0

    def close(self) -> None:
        self.stops += 1


@contextmanager
def stand_in_member() -> Iterator[Callable[..., LlamaCppMember]]:
    """Makes LlamaCppMembers connected to a llama.cpp stand-in served by a thread of this process
    (a forked child's connections reach it through the listening socket it inherits); ``in_process``:
    as if this process ran that server (an ``InProcessServerStandIn``)."""
    member = toy.toy_member("llama-byte", "byte_level", "llama")
    word = member.table.encode_fragment(" Sofia")[0]
    server = LlamaCppLike(lambda prompt: [(word, -0.1), (word + 1, -2.5)], slots=2)
    with serve(server) as (url, _):
        def make(in_process: bool = False) -> LlamaCppMember:
            tokenizer = LocalTokenizer(member.tokenizer, member.table.vocab_size, frozenset(member.table.eos_ids), 512)
            return LlamaCppMember("toy-llamacpp", url, tokenizer, check_tokenizer=False, pin_slots=True,
                                  context_window=512,
                                  server=InProcessServerStandIn(url, 2) if in_process else None)  # type: ignore[arg-type]
        yield make


def _after_a_call(engine: EnsembleEngine) -> None:
    """Answer once here, then let the member's worker thread go idle: that idle worker, which a forked
    child does not have, is what its calls were queued for."""
    assert engine.generate("Hello", max_new_tokens=2).text
    time.sleep(0.2)


def test_an_engine_built_from_names_loads_its_members_again_in_a_forked_child(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with stand_in_member() as make:
        built: list[LlamaCppMember] = []

        def build(config: Any, progress: bool) -> LlamaCppMember:
            built.append(make())
            return built[-1]

        monkeypatch.setattr(registry, "_build", build)
        engine = EnsembleEngine(["llamacpp:http://127.0.0.1:1"], method="single")
        try:
            _after_a_call(engine)
            parent_text = engine.generate("Hello", max_new_tokens=3).text

            def in_child() -> tuple[str, bool, int]:
                text = engine.generate("Hello", max_new_tokens=3).text
                member = engine.members[0]
                engine.close()  # lets go of the child's member, never of the parent's
                return text, member is built[0], getattr(member, "pid", 0)

            status, value, _ = _in_forked_child(in_child)
            assert status == "ok", value
            text, same_member, pid = value
            assert text == parent_text and not same_member and pid != os.getpid()
            assert engine.generate("Hello", max_new_tokens=3).text == parent_text  # the parent's is untouched
        finally:
            engine.close()


def test_a_member_object_from_before_the_fork_fails_at_once_in_the_child() -> None:
    with stand_in_member() as make:
        member = make()
        engine = EnsembleEngine([member], method="single")
        try:
            _after_a_call(engine)
            status, message, took = _in_forked_child(lambda: engine.generate("Hello", max_new_tokens=3).text)
            assert status == "error" and MemberError.__name__ in message, message
            assert "forked" in message and "'spawn'" in message and took < CHILD_TIMEOUT_S / 2
            member.close()  # in the parent: stops as usual
        finally:
            engine.close()


@pytest.mark.zoo
def test_a_forked_child_runs_and_closes_an_in_process_llama_cpp_member() -> None:
    # the child can stop no in-process server: the parent's waited forever for threads the child lacks,
    # its own aborted the child (std::system_error: No such process)
    engine = EnsembleEngine(["smollm2-135m-instruct"], method="single")
    try:
        parent_text = engine.generate("Say hi", max_new_tokens=4).text

        def in_child() -> str:
            text = engine.generate("Say hi", max_new_tokens=4).text
            engine.close()
            other = EnsembleEngine(["smollm2-135m-instruct"], method="single")
            other.generate("Say hi", max_new_tokens=2)
            other.close()
            return text

        status, value, _ = _in_forked_child(in_child)
        assert (status, value) == ("ok", parent_text)
        assert engine.generate("Say hi", max_new_tokens=4).text == parent_text
    finally:
        engine.close()


def test_a_process_forked_while_servers_ran_keeps_its_in_process_member_for_the_next_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # there llama.cpp can stop no in-process server: closing the member at its last release stopped
    # nothing, and each engine built after it started one more server (480 MiB and 12 threads each with
    # SmolLM2, in every worker of LlamaIndex's arun(num_workers=...))
    spec = "llamacpp:http://127.0.0.1:1"
    with stand_in_member() as make:
        built: list[LlamaCppMember] = []

        def build(config: Any, progress: bool) -> LlamaCppMember:
            built.append(make(in_process=True))
            return built[-1]

        monkeypatch.setattr(registry, "_build", build)
        monkeypatch.setattr(llamacpp, "_SERVING", Counter({-1: 1}))  # a server of the process it was forked from
        try:
            for _ in range(3):
                engine = EnsembleEngine([spec], method="single")
                assert engine.generate("Hello", max_new_tokens=2).text
                engine.close()
            assert len(built) == 1 and built[0].server.stops == 0
        finally:
            monkeypatch.setattr(llamacpp, "_SERVING", Counter())  # a process that stops its servers: freed
            registry.acquire_member(spec)
            assert registry.release_member(spec)
        assert built[0].server.stops == 1


def test_a_child_forked_while_another_thread_computed_on_a_transformers_member_answers() -> None:
    # the child kept the member and the lock that thread held at the fork: its first forward waited forever
    member = toy.toy_member("toy-a", "byte_level", "llama")
    started, release = threading.Event(), threading.Event()

    def forward() -> None:
        started.set()
        release.wait(CHILD_TIMEOUT_S)

    def making_a_compute_thread() -> None:  # as compute_thread() does
        with hf._COMPUTE_THREADS_LOCK:
            started.set()
            release.wait(CHILD_TIMEOUT_S)

    with toy.registered_members([member]) as names:
        engine = EnsembleEngine(names, method="single")
        try:
            expected = engine.generate("Hello", max_new_tokens=3).text
            for busy in (lambda: asyncio.run(member.run(forward)), making_a_compute_thread):
                started.clear()
                release.clear()
                thread = threading.Thread(target=busy)
                thread.start()
                try:
                    assert started.wait(10)
                    status, value, _ = _in_forked_child(lambda: engine.generate("Hello", max_new_tokens=3).text)
                finally:
                    release.set()
                    thread.join()
                assert (status, value) == ("ok", expected)
            assert engine.generate("Hello", max_new_tokens=3).text == expected
        finally:
            engine.close()


_FORKED_EXITS = """
import atexit, json, os, signal, sys, time
out, setup, child, hows, timeout_s = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), float(sys.argv[5])
exec(setup)


def mark(name):
    atexit.register(lambda: open(os.path.join(out, f"{name}-{os.getpid()}"), "w").close())


mark("before-fork")
children = []
for how in hows:
    pid = os.fork()
    if pid == 0:
        mark("after-fork")
        exec(child)
        print("child wrote", end="")  # flushed at its exit
        if how == "exit3":
            sys.exit(3)
        if how == "raise":
            raise RuntimeError("uncaught: exit status 1")
        break  # "return": the end of the script
    children.append((pid, how))
else:
    statuses = {}
    for pid, how in children:
        deadline = time.monotonic() + timeout_s
        while not (waited := os.waitpid(pid, os.WNOHANG))[0]:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.1)
        status = waited[1]
        statuses[how] = ("hung" if not waited[0] else os.WEXITSTATUS(status) if os.WIFEXITED(status)
                         else f"signal {os.WTERMSIG(status)}")
    print("\\nSTATUSES", json.dumps({"statuses": statuses, "pids": [p for p, _ in children]}), flush=True)
    os._exit(0)
"""
"""os.fork() children that end through the interpreter's teardown, as gunicorn's workers do (see
``_exits_of_forked_children``)."""


def _exits_of_forked_children(setup: str, child: str, out: Path, hows: list[str]) -> dict[str, Any]:
    """How os.fork() children end through the interpreter's teardown (``exit3``: ``sys.exit(3)``,
    ``raise``: an uncaught error, ``return``: the end of the script), after ``setup`` ran in the parent
    and ``child`` in each: ``statuses`` (an exit status, ``signal N`` or ``hung``: killed after
    CHILD_TIMEOUT_S), the atexit handlers each ran (``marks``) and what they printed."""
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", _FORKED_EXITS, str(out), setup, child, json.dumps(hows),
                           str(CHILD_TIMEOUT_S)], capture_output=True, text=True, cwd=root,
                          env={**os.environ, "PYTHONPATH": root}, timeout=len(hows) * CHILD_TIMEOUT_S + 120)
    line = next((x for x in done.stdout.splitlines() if x.startswith("STATUSES ")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-4000:]
    report: dict[str, Any] = json.loads(line.removeprefix("STATUSES "))
    names = os.listdir(out)
    report["marks"] = {pid: sorted(n.removesuffix(f"-{pid}") for n in names if n.endswith(f"-{pid}"))
                       for pid in report["pids"]}
    report["stdout"] = done.stdout
    return report


def test_a_forked_child_of_a_process_whose_servers_ran_ends_with_its_own_exit_status(tmp_path: Path) -> None:
    # such a child ends with _exit(status) once Python has finished (glibc's on_exit): the status
    # sys.exit gave, 1 after an uncaught error, every atexit handler run (registered before the fork
    # and after it) and stdout flushed
    setup = "import shared_engine.members.llamacpp as L; L._SERVING[-1] = 1  # as if a server had run"
    report = _exits_of_forked_children(setup, "pass", tmp_path, ["exit3", "raise", "return"])
    assert report["statuses"] == {"exit3": 3, "raise": 1, "return": 0}
    assert all(marks == ["after-fork", "before-fork"] for marks in report["marks"].values()), report["marks"]
    assert report["stdout"].count("child wrote") == 3


@pytest.mark.zoo
def test_a_forked_child_ends_through_interpreter_teardown_after_an_in_process_llama_cpp_member(
        tmp_path: Path) -> None:
    # gunicorn's workers end with sys.exit: the child aborted (std::system_error), crashed or hung there
    setup = ("from shared_engine import EnsembleEngine\n"
             "engine = EnsembleEngine(['smollm2-135m-instruct'], method='single')\n"
             "engine.generate('Say hi', max_new_tokens=2)")
    child = "engine.generate('Say hi', max_new_tokens=2); engine.close() if how == 'exit3' else None"
    report = _exits_of_forked_children(setup, child, tmp_path, ["exit3", "raise", "return"])
    assert report["statuses"] == {"exit3": 3, "raise": 1, "return": 0}
    assert all(marks == ["after-fork", "before-fork"] for marks in report["marks"].values()), report["marks"]


@pytest.mark.zoo
def test_a_forked_child_starts_one_in_process_server_however_many_engines_it_builds() -> None:
    engine = EnsembleEngine(["smollm2-135m-instruct"], method="single")
    try:
        engine.generate("Say hi", max_new_tokens=2)

        def in_child() -> int:
            for _ in range(3):
                other = EnsembleEngine(["smollm2-135m-instruct"], method="single")
                other.generate("Say hi", max_new_tokens=2)
                other.close()
            return llamacpp._SERVING[os.getpid()]  # the servers this child started

        assert _in_forked_child(in_child)[:2] == ("ok", 1)
    finally:
        engine.close()


def test_a_forked_child_keeps_answer_fits_of_its_own(tmp_path: Path) -> None:
    """``fit_cache`` (drafter='auto'): a child forked while another thread of the parent held the fits'
    lock waited on it forever; it inherited the parent's SQLite connection (SQLite forbids its use across
    a fork) and fits keyed by member ids that its reloaded members may reuse. The child starts them anew."""
    from shared_engine.weighting import TextFit

    members = [toy.toy_member("toy-a", "byte_level"), toy.toy_member("toy-b", "metaspace", seed=1)]
    engine = EnsembleEngine(members, fit_cache=str(tmp_path / "fits.sqlite"))
    fits = engine._answer_fits
    try:
        fits.put(members[0], 0, [1, 2, 3], TextFit(1.0, 3, 3))
        parents = fits._connection(create=True)
        assert parents is not None and fits.get(members[0], 0, [1, 2, 3]) is not None

        def in_child() -> tuple[bool, bool]:
            kept = any(key[0] == id(members[0]) for key in fits._fits)
            fits.put(members[1], 0, [4], TextFit(2.0, 1, 1))  # takes the lock (and the file, if kept on disk)
            return not kept, fits._db is not parents

        with fits._lock:  # as if another thread were reading a fit at the fork
            status, value, _ = _in_forked_child(in_child)
        assert (status, value) == ("ok", (True, True))
        assert fits.get(members[0], 0, [1, 2, 3]) is not None  # the parent's stay
    finally:
        engine.close()
