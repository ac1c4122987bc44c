"""Cookbook: the ensemble as an OpenAI-compatible endpoint, from the `openai` client, curl and LangChain.

Start a server (it loads the members once, then serves concurrent requests):

    safe-ensemble serve --models qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct --method safe --port 8000

and open http://127.0.0.1:8000/ to watch the ensemble at work: the answer streams in, tokens
chosen by fusion are highlighted, and every decision (candidates, each member's probability, the
fused score, the choice, whether sharpening fired) is listed beside it.

Any OpenAI client then works with ``base_url="http://127.0.0.1:8000/v1"``, any API key, and
``model="safe-ensemble"`` (the name ``GET /v1/models`` lists; ``--served-model-name`` changes it).
From the shell:

    curl -N http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{
      "model": "safe-ensemble", "stream": true, "max_tokens": 32,
      "messages": [{"role": "user", "content": "What is 17 + 25?"}]}'

Each streamed ``chat.completion.chunk`` carries one extra field, ``ensemble``: ``source``
("ensemble" when fusion chose this text over the drafter's token), ``position`` and the
``decisions`` made since the previous chunk; the final chunk adds ``stats``. OpenAI clients keep
unknown fields in ``model_extra``, so nothing breaks; send ``"ensemble_events": false`` to leave
the decisions out.

This script runs the three clients below. With ``--base-url`` it talks to a running server;
without, it starts one in-process on a free loopback port (that is how CI runs it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import openai
from langchain_openai import ChatOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # in-process mode from a source checkout too

MEMBERS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
QUESTION = "What is 17 + 25? Answer briefly."


def server_root(url: str) -> str:
    """The server's root: `serve` prints its OpenAI base_url (``.../v1``); the clients below add ``/v1``."""
    url = url.rstrip("/")
    return url.removesuffix("/v1").rstrip("/")


def served_model(base_url: str) -> str:
    """The model id the server answers to (``GET /v1/models``): ``<method>-ensemble`` unless
    ``--served-model-name`` named it, so ``serve --method adafuse`` needs no ``--model`` here."""
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="not-needed").models.list().data[0].id


def api_error(err: openai.APIError) -> str:
    """One readable line for a request the server refused or could not finish."""
    if isinstance(err, openai.APIStatusError):
        detail = err.body.get("message") if isinstance(err.body, dict) else None
        return f"HTTP {err.status_code}: {detail or err.message}"
    return f"{type(err).__name__}: {err.message}"


def with_openai(base_url: str, model: str, max_tokens: int) -> None:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="not-needed")

    # One answer at once; the ensemble's statistics ride along in `model_extra`.
    completion = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=max_tokens, temperature=0)
    stats = completion.model_extra["ensemble"]["stats"]
    print(f"[openai] {completion.choices[0].message.content!r}")
    print(f"[openai] finish={completion.choices[0].finish_reason} usage={completion.usage.total_tokens} tokens, "
          f"ensemble rate {stats['ensemble_rate']:.0%}")

    # Streamed: text arrives chunk by chunk; [brackets] mark text fusion chose over the drafter's token.
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True})
    decisions = 0
    print("[openai stream] ", end="")
    for chunk in stream:
        extension = (chunk.model_extra or {}).get("ensemble") or {}
        decisions += len(extension.get("decisions", []))
        if chunk.choices and chunk.choices[0].delta.content:
            text = chunk.choices[0].delta.content
            print(f"[{text}]" if extension.get("source") == "ensemble" else text, end="", flush=True)
        if chunk.usage:
            print(f"\n[openai stream] {chunk.usage.completion_tokens} tokens, {decisions} ensemble decisions")


def error_message(body: str) -> str:
    """The message of an OpenAI-shaped error body (``{"error": {"message": ...}}``), else the body itself."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.strip()[:300]


def with_curl(base_url: str, model: str, max_tokens: int) -> None:
    if shutil.which("curl") is None:
        print("[curl] curl is not installed; skipped")
        return
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "ensemble_events": False,
            "messages": [{"role": "user", "content": QUESTION}]}
    # -w: the HTTP status on a last line of its own (a 429 or 503 body has no `data:` lines)
    done = subprocess.run(["curl", "-sS", "-N", "-w", "\n%{http_code}", f"{base_url}/v1/chat/completions",
                           "-H", "Content-Type: application/json", "-d", json.dumps(body)],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        print(f"[curl] failed: {done.stderr.strip()}")
        return
    output, _, status = done.stdout.rpartition("\n")
    if status != "200":
        print(f"[curl] HTTP {status}: {error_message(output)}")
        return
    events = [line[6:] for line in output.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    if errors := [c["error"] for c in chunks if "error" in c]:  # the status line was sent: reported in-stream
        print(f"[curl] the stream ended with an error: {errors[0].get('message')}")
        return
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    print(f"[curl] {len(events)} SSE events, last {events[-1]!r}: {text!r}")


def with_langchain(base_url: str, model: str, max_tokens: int) -> None:
    llm = ChatOpenAI(model=model, base_url=f"{base_url}/v1", api_key="not-needed", max_tokens=max_tokens,
                     temperature=0, max_retries=0)
    reply = llm.invoke(QUESTION)
    print(f"[langchain] {reply.content!r} usage={reply.usage_metadata}")
    print("[langchain stream] ", end="")
    for chunk in llm.stream(QUESTION):
        print(chunk.content, end="", flush=True)
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="a running server: its root or the base_url `serve` prints "
                                           "(a trailing /v1 is dropped; default: start one here)")
    parser.add_argument("--model", help="the model id to send (default: the one GET /v1/models lists)")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    with ExitStack() as stack:
        base_url = server_root(args.base_url) if args.base_url else None
        if base_url is None:
            from shared_engine import EnsembleEngine
            from shared_engine.server import create_app
            from shared_engine.server.background import serve_in_background

            app = create_app(EnsembleEngine(MEMBERS, method="safe"), model_name=args.model)
            base_url = stack.enter_context(serve_in_background(app))
        try:
            model = args.model or served_model(base_url)
        except openai.APIConnectionError:  # a traceback of httpx's and openai's frames said only this
            sys.exit(f"no server answers at {base_url}: start one with 'safe-ensemble serve ...' "
                     "or leave out --base-url")
        except openai.APIError as err:  # e.g. a 401 (the server has --api-key) or a 404 (not this server)
            sys.exit(f"GET {base_url}/v1/models failed: {api_error(err)}")
        except (IndexError, AttributeError, TypeError):  # a 200 with no model list (an empty one, a web page)
            sys.exit(f"GET {base_url}/v1/models names no model: not a safe-ensemble (OpenAI-compatible) server; "
                     "pass --model, or check --base-url")
        if args.base_url is None:
            print(f"serving {model} at {base_url}/v1 (page: {base_url}/)")
        for name, client in (("openai", with_openai), ("curl", with_curl), ("langchain", with_langchain)):
            try:
                client(base_url, model, args.max_tokens)
            except openai.APIError as err:  # e.g. a 429 (busy, after the client's retries), a 503 (shutting down)
                print(f"\n[{name}] {api_error(err)}")


if __name__ == "__main__":
    main()
