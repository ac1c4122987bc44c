"""Load benchmark for ``safe-ensemble serve``: N concurrent streaming clients, as serving engines
are measured.

    python scripts/load_bench.py --models qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct \\
        --method safe --levels 1,2,4,8 --requests-per-client 2 --max-tokens 32 --out docs/load
    python scripts/load_bench.py --toy --levels 1,2 --out /tmp/load     # tiny random members, seconds
    python scripts/load_bench.py --method single --out docs/load/llamacpp-single
    python scripts/load_bench.py --backend transformers --out /tmp/load-hf    # transformers members

The server runs as its own process (``python -m shared_engine.cli serve`` on a free loopback port),
so its peak RSS is measured alone and the clients' CPU time is not the server's. For each level N,
N clients each send ``--requests-per-client`` streamed chat completions one after the other
(greedy, ``stream_options.include_usage``) and the level's wall time runs from the first request
to the last answer. Reported per level: requests/s and completion tokens/s, p50/p95/p99 time to
first text and total latency, the server's peak RSS during the level, and what went wrong:
``rejected_429`` (the server's admission control said busy; not retried) is counted apart from
``errors`` (any other failure: a non-200, an in-stream error, a stream without ``[DONE]`` or usage,
a transport error or timeout), with the distinct error messages, and the members' forward passes
(scoring requests, for server members) per completion token, read from the finish stats. Greedy
answers must not depend on the load: ``inconsistent_prompts`` lists prompts whose answers differed
between requests (``divergent_answers`` shows them, by level). ``tokens_per_s_at_4_over_1`` is how
throughput grows from one client to four (levels 1 and 4 both run).

Zoo names run as in-process llama.cpp members by default, as on every other surface
(``--backend transformers`` for transformers members; ``serve --backend``; a ``llamacpp:NAME`` spec in
``--models`` does the same per member); their servers get one slot per
request the server admits (``--max-active``), so concurrent requests are batched by llama.cpp.

Writes ``load.json`` and ``load.png`` into ``--out`` (default ``./load-bench``, ignored by git: a
smoke run does not overwrite the runs kept under ``docs/load``, each written with its ``--out``).
Percentiles over few requests are coarse (linear interpolation between the samples); the JSON keeps
the sample count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = "qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct"
PROMPTS = [
    "What is 17 + 25? Answer briefly.",
    "Name three primary colors.",
    "Write a Python function that reverses a string.",
    "Explain in one sentence what a hash table is.",
    "Give a synonym for 'happy'.",
    "What is the capital of France?",
    "List two prime numbers greater than 10.",
    "Translate 'good morning' into Spanish.",
]


# ----------------------------------------------------------------------------- results


class RequestResult(BaseModel):
    prompt: int
    outcome: Literal["ok", "rejected", "error"]
    ttft_s: float | None = None
    latency_s: float
    completion_tokens: int = 0
    forward_passes: dict[str, int] = {}  # per member label, from the finish stats
    text: str = ""
    error: str | None = None
    level: int = 0


class Percentiles(BaseModel):
    n: int
    p50: float | None
    p95: float | None
    p99: float | None
    mean: float | None

    @classmethod
    def of(cls, values: list[float]) -> Percentiles:
        if not values:
            return cls(n=0, p50=None, p95=None, p99=None, mean=None)
        p50, p95, p99 = (round(float(v), 4) for v in np.percentile(values, [50, 95, 99]))
        return cls(n=len(values), p50=p50, p95=p95, p99=p99, mean=round(float(np.mean(values)), 4))


class LevelResult(BaseModel):
    clients: int
    requests: int
    completed: int
    rejected_429: int
    errors: int
    error_messages: list[str]
    wall_s: float
    requests_per_s: float
    tokens_per_s: float
    completion_tokens: int
    ttft_s: Percentiles
    latency_s: Percentiles
    peak_rss_mib: float | None
    forward_passes_per_token: dict[str, float] = {}


class BenchConfig(BaseModel):
    models: list[str]
    toy: bool
    backend: str = "llamacpp"
    method: str
    levels: list[int]
    requests_per_client: int
    max_tokens: int
    max_active: int
    max_waiting: int
    serve_args: list[str]


class BenchResult(BaseModel):
    config: BenchConfig
    machine: dict[str, Any]
    server_startup_s: float
    server_idle_rss_mib: float | None
    server_peak_rss_mib: float | None  # VmHWM: the lifetime peak, loading included
    levels: list[LevelResult]
    inconsistent_prompts: list[str]
    divergent_answers: list[dict[str, Any]] = []  # the answers of inconsistent prompts: prompt, level, text
    tokens_per_s_at_4_over_1: float | None = None


# ----------------------------------------------------------------------------- the server process


def _proc_status_mib(pid: int, field: str) -> float | None:
    """``VmRSS`` / ``VmHWM`` of a process from /proc, in MiB (None where /proc is not there)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class RssSampler:
    """The highest RSS of a process seen while active (sampled every ``interval_s`` in a thread)."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.peak: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = _proc_status_mib(self.pid, "VmRSS")
            if rss is not None:
                self.peak = rss if self.peak is None else max(self.peak, rss)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def write_toy_members(folder: Path) -> list[str]:
    """Two tiny random members with different tokenizers (tests/toy.py) saved as HF folders."""
    sys.path.insert(0, str(ROOT))
    from tests.toy import toy_member

    paths = []
    for name, member in (("toy-a", toy_member("a", "byte_level", "llama", 1)),
                         ("toy-b", toy_member("b", "metaspace", "gpt2", 2))):
        member.model.save_pretrained(folder / name)
        member.tokenizer.save_pretrained(folder / name)
        paths.append(str(folder / name))
    return paths


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def running_server(models: list[str], config: BenchConfig, log_path: Path, startup_timeout_s: float
                   ) -> Iterator[tuple[str, subprocess.Popen[bytes], float]]:
    """``safe-ensemble serve`` in a child process; yields (base URL, process, startup seconds)."""
    port = _free_port()
    command = [sys.executable, "-m", "shared_engine.cli", "serve", "--models", ",".join(models),
               "--method", config.method, "--backend", config.backend, "--port", str(port),
               "--max-new-tokens", str(config.max_tokens),
               "--max-active", str(config.max_active), "--max-waiting", str(config.max_waiting),
               *config.serve_args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + startup_timeout_s
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"the server exited with {server.returncode}:\n{log_path.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not come up in {startup_timeout_s:.0f} s (log: {log_path})")
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            yield url, server, time.perf_counter() - started
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


# ----------------------------------------------------------------------------- the clients


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: int, max_tokens: int
                      ) -> RequestResult:
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "stream_options": {"include_usage": True}, "ensemble_events": True,  # for the finish stats
            "messages": [{"role": "user", "content": PROMPTS[prompt]}]}
    started = time.perf_counter()

    def done(outcome: Literal["ok", "rejected", "error"], **fields: Any) -> RequestResult:
        return RequestResult(prompt=prompt, outcome=outcome, latency_s=time.perf_counter() - started, **fields)

    ttft, parts, tokens, finished, forwards = None, [], None, False, {}
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                try:
                    message = response.json()["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    message = response.text[:200]
                outcome: Literal["rejected", "error"] = "rejected" if response.status_code == 429 else "error"
                return done(outcome, error=f"HTTP {response.status_code}: {message}")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    finished = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return done("error", error=f"in-stream error: {chunk['error'].get('message')}")
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if stats := (chunk.get("ensemble") or {}).get("stats"):
                    forwards = stats.get("forward_passes") or {}
                for choice in chunk.get("choices") or []:
                    if content := choice["delta"].get("content"):
                        ttft = ttft if ttft is not None else time.perf_counter() - started
                        parts.append(content)
    except (httpx.HTTPError, json.JSONDecodeError) as err:
        return done("error", error=f"{type(err).__name__}: {err}")
    if not finished or tokens is None:
        return done("error", error="the stream ended without " + ("[DONE]" if not finished else "a usage chunk"))
    return done("ok", ttft_s=ttft, completion_tokens=tokens, forward_passes=forwards, text="".join(parts))


async def run_level(url: str, model: str, clients: int, config: BenchConfig, timeout_s: float,
                    pid: int) -> tuple[LevelResult, list[RequestResult]]:
    """``clients`` concurrent clients, each sending its requests one after the other."""
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:

        async def client_loop(index: int) -> list[RequestResult]:
            return [await one_request(client, url, model, (index * config.requests_per_client + j) % len(PROMPTS),
                                      config.max_tokens)
                    for j in range(config.requests_per_client)]

        with RssSampler(pid) as rss:
            started = time.perf_counter()
            per_client = await asyncio.gather(*(client_loop(i) for i in range(clients)))
            wall = time.perf_counter() - started
    results = [r.model_copy(update={"level": clients}) for rs in per_client for r in rs]
    ok = [r for r in results if r.outcome == "ok"]
    tokens = sum(r.completion_tokens for r in ok)
    forwards: dict[str, int] = {}
    for r in ok:
        for label, n in r.forward_passes.items():
            forwards[label] = forwards.get(label, 0) + n
    level = LevelResult(
        clients=clients, requests=len(results), completed=len(ok),
        rejected_429=sum(r.outcome == "rejected" for r in results),
        errors=sum(r.outcome == "error" for r in results),
        error_messages=sorted({r.error for r in results if r.outcome == "error" and r.error}),
        wall_s=round(wall, 3), requests_per_s=round(len(ok) / wall, 4), tokens_per_s=round(tokens / wall, 3),
        completion_tokens=tokens, ttft_s=Percentiles.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        latency_s=Percentiles.of([r.latency_s for r in ok]),
        peak_rss_mib=round(rss.peak, 1) if rss.peak is not None else None,
        forward_passes_per_token={label: round(n / tokens, 3) for label, n in forwards.items()} if tokens else {})
    return level, results


def inconsistent(results: list[RequestResult]) -> list[str]:
    """Prompts whose greedy answers differed between requests (they must not depend on load)."""
    answers: dict[int, set[str]] = {}
    for r in results:
        if r.outcome == "ok":
            answers.setdefault(r.prompt, set()).add(r.text)
    return [PROMPTS[p] for p, texts in sorted(answers.items()) if len(texts) > 1]


def divergent(results: list[RequestResult]) -> list[dict[str, Any]]:
    """Every answer to the prompts ``inconsistent`` lists, with its level (to see where they split)."""
    split = set(inconsistent(results))
    return [{"prompt": PROMPTS[r.prompt], "level": r.level, "text": r.text}
            for r in sorted(results, key=lambda r: (r.prompt, r.level))
            if r.outcome == "ok" and PROMPTS[r.prompt] in split]


def throughput_ratio(levels: list[LevelResult], high: int = 4, low: int = 1) -> float | None:
    """tokens/s at ``high`` clients over tokens/s at ``low`` (None unless both levels ran)."""
    by_clients = {lv.clients: lv.tokens_per_s for lv in levels}
    if high not in by_clients or not by_clients.get(low):
        return None
    return round(by_clients[high] / by_clients[low], 3)


def summary(result: BenchResult) -> str:
    """The lines that answer "does throughput grow with clients, and do answers stay the same"."""
    lines = [f"N={lv.clients}: {lv.tokens_per_s:.2f} tok/s, forward passes per token "
             + (", ".join(f"{m} {v:.2f}" for m, v in lv.forward_passes_per_token.items()) or "–")
             for lv in result.levels]
    ratio = result.tokens_per_s_at_4_over_1
    shown = ratio if ratio is not None else "– (levels 1 and 4 not both run)"
    lines.append(f"tokens_per_s_at_4 / tokens_per_s_at_1 = {shown}")
    lines.append("greedy answers matched across levels: " + (
        "yes" if not result.inconsistent_prompts else f"NO, {len(result.inconsistent_prompts)} prompt(s) differ: "
        + "; ".join(result.inconsistent_prompts)))
    errors = sum(lv.errors for lv in result.levels)
    lines.append(f"errors: {errors}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the report


def plot(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = result.levels
    n = [lv.clients for lv in levels]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), dpi=80)
    ax = axes[0][0]
    ax.plot(n, [lv.tokens_per_s for lv in levels], "o-", label="tokens/s")
    ax.set_ylabel("completion tokens/s")
    twin = ax.twinx()
    twin.plot(n, [lv.requests_per_s for lv in levels], "s--", color="tab:orange", label="requests/s")
    twin.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    twin.set_ylim(bottom=0)
    ax.set_title("throughput")
    ax.legend(loc="upper left", fontsize=8)
    twin.legend(loc="lower right", fontsize=8)
    for ax, key, title in ((axes[0][1], "ttft_s", "time to first token (s)"),
                           (axes[1][0], "latency_s", "total latency (s)")):
        for q, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
            ax.plot(n, [getattr(getattr(lv, key), q) or np.nan for lv in levels], style, label=q)
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    ax = axes[1][1]
    ax.plot(n, [lv.peak_rss_mib or np.nan for lv in levels], "o-", color="tab:green")
    ax.set_ylim(bottom=0)
    ax.set_title("server peak RSS during the level (MiB)")
    errors = " · ".join(f"N={lv.clients}: {lv.completed} ok, {lv.errors} errors, {lv.rejected_429} × 429"
                        for lv in levels)
    fig.text(0.5, 0.005, errors, ha="center", fontsize=8)
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(x) for x in n])
        ax.set_xlabel("concurrent streaming clients")
        ax.grid(alpha=0.3)
    c = result.config
    fig.suptitle(f"safe-ensemble serve · {c.method} · {c.backend} · {' + '.join(Path(m).name for m in c.models)} · "
                 f"max_tokens={c.max_tokens}, {c.requests_per_client} req/client, max_active={c.max_active}",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.025, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def table(result: BenchResult) -> str:
    """The results as a Markdown table (printed, and pasted into docs/speed.md)."""
    rows = ["| clients | requests | ok | 429 | errors | req/s | tok/s | TTFT p50 / p95 / p99 (s) "
            "| latency p50 / p95 / p99 (s) | peak RSS (MiB) |",
            "|---:|---:|---:|---:|---:|---:|---:|---|---|---:|"]

    def ps(p: Percentiles) -> str:
        return " / ".join("–" if v is None else f"{v:.2f}" for v in (p.p50, p.p95, p.p99))

    for lv in result.levels:
        rows.append(f"| {lv.clients} | {lv.requests} | {lv.completed} | {lv.rejected_429} | {lv.errors} "
                    f"| {lv.requests_per_s:.3f} | {lv.tokens_per_s:.2f} | {ps(lv.ttft_s)} | {ps(lv.latency_s)} "
                    f"| {lv.peak_rss_mib if lv.peak_rss_mib is not None else '–'} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------- main


def _levels(value: str) -> list[int]:
    """``--levels``: comma-separated numbers of clients (``1,`` or ``a`` was a ValueError traceback)."""
    try:
        return [int(x) for x in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of numbers, e.g. 1,2,4") from None


def _server_default_max_active() -> int:
    sys.path.insert(0, str(ROOT))
    from shared_engine.options import DEFAULT_MAX_ACTIVE

    return DEFAULT_MAX_ACTIVE


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated zoo names or HF folders")
    parser.add_argument("--toy", action="store_true", help="two tiny random members instead (seconds, for CI)")
    parser.add_argument("--backend", choices=["transformers", "llamacpp"], default=None,
                        help="how the server runs zoo names without a backend prefix (serve --backend; default "
                             "llamacpp, as everywhere else; --toy members are transformers folders)")
    parser.add_argument("--method", default="safe")
    parser.add_argument("--levels", type=_levels, default="1,2,4,8", help="numbers of concurrent clients")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-active", type=int, default=_server_default_max_active(),
                        help="the server's --max-active (default: the server's own default)")
    parser.add_argument("--max-waiting", type=int, default=16, help="the server's --max-waiting")
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="extra argument for `serve` (repeatable), e.g. --serve-arg=--threshold=0.5")
    parser.add_argument("--warmup", type=int, default=1, help="requests before the first level (not counted)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=Path("load-bench"),
                        help="folder for load.json and load.png (default: ./load-bench, ignored by git; the "
                             "measurements kept in the repository are written with --out docs/load/...)")
    parser.add_argument("--replot", type=Path, metavar="LOAD_JSON",
                        help="only redraw the plot and the table of an earlier run's load.json (into --out)")
    args = parser.parse_args(argv)
    if min(args.levels) < 1 or args.requests_per_client < 1 or args.max_tokens < 1:
        parser.error("levels, --requests-per-client and --max-tokens must be >= 1")
    if args.toy and args.backend not in (None, "transformers"):
        parser.error("--toy members are transformers folders: drop --backend")
    if args.backend is None:
        args.backend = "transformers" if args.toy else "llamacpp"
    return args


def main(argv: list[str] | None = None) -> BenchResult:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        result = BenchResult.model_validate_json(args.replot.read_text())
        plot(result, args.out / "load.png")
        print(table(result))
        print(summary(result))
        return result
    with tempfile.TemporaryDirectory(prefix="load-bench-") as tmp:
        models = write_toy_members(Path(tmp)) if args.toy else args.models.split(",")
        config = BenchConfig(models=models if not args.toy else ["toy-a", "toy-b"], toy=args.toy,
                             backend=args.backend, method=args.method, levels=args.levels,
                             requests_per_client=args.requests_per_client,
                             max_tokens=args.max_tokens, max_active=args.max_active, max_waiting=args.max_waiting,
                             serve_args=args.serve_arg)
        machine = {"cpus": os.cpu_count(), "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
                   "python": sys.version.split()[0]}
        log_path = Path(tmp) / "server.log"
        with running_server(models, config, log_path, args.startup_timeout) as (url, server, startup_s):
            model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
            print(f"server up in {startup_s:.1f} s at {url} serving `{model}`", file=sys.stderr, flush=True)
            idle_rss = _proc_status_mib(server.pid, "VmRSS")
            for i in range(args.warmup):
                warm = asyncio.run(_warmup(url, model, i, args.max_tokens, args.timeout))
                if warm.outcome != "ok":
                    raise RuntimeError(f"the warm-up request failed: {warm.error}")
            levels, everything = [], []
            for clients in args.levels:
                level, results = asyncio.run(run_level(url, model, clients, config, args.timeout, server.pid))
                print(f"N={clients}: {level.completed}/{level.requests} ok, {level.rejected_429} x 429, "
                      f"{level.errors} errors, {level.requests_per_s:.3f} req/s, {level.tokens_per_s:.2f} tok/s, "
                      f"TTFT p50 {level.ttft_s.p50} s, latency p50 {level.latency_s.p50} s",
                      file=sys.stderr, flush=True)
                levels.append(level)
                everything += results
            peak = _proc_status_mib(server.pid, "VmHWM")
        result = BenchResult(config=config, machine=machine, server_startup_s=round(startup_s, 2),
                             server_idle_rss_mib=round(idle_rss, 1) if idle_rss else None,
                             server_peak_rss_mib=round(peak, 1) if peak else None,
                             levels=levels, inconsistent_prompts=inconsistent(everything),
                             divergent_answers=divergent(everything), tokens_per_s_at_4_over_1=throughput_ratio(levels))
    (args.out / "load.json").write_text(result.model_dump_json(indent=2) + "\n")
    plot(result, args.out / "load.png")
    print(table(result))
    print(summary(result))
    print(f"wrote {args.out / 'load.json'} and {args.out / 'load.png'}", file=sys.stderr)
    return result


async def _warmup(url: str, model: str, prompt: int, max_tokens: int, timeout_s: float) -> RequestResult:
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        return await one_request(client, url, model, prompt % len(PROMPTS), max_tokens)


if __name__ == "__main__":
    main()
