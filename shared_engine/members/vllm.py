"""vLLM members over the OpenAI-compatible ``POST /v1/completions`` (plus ``/tokenize``).

- Token-id prompts (``prompt: [int, ...]``) and ``return_tokens_as_token_ids: true`` always: with
  string keys, distinct byte tokens that decode to the same "\ufffd" collide and entries vanish.
- Scoring a block in ONE request: ``prompt_logprobs: k`` gives the top-k at every prompt position
  (entry ``i`` is the distribution that predicted ``prompt[i]``; entry 0 is null; each entry also
  carries the actual token with its true rank, so entries with ``rank > k`` are dropped), and
  ``max_tokens: 1, logprobs: k`` gives the distribution after the last id ("bonus" row).
- Caveat (vLLM source): any request with ``prompt_logprobs`` skips the prefix cache, so a scoring
  call re-prefills the whole sequence (one batched forward; ``prefix_cache=False``). A plain next-token
  request (drafting) sends no ``prompt_logprobs`` and does hit the prefix cache.
- ``logprobs`` are the model's raw distribution by default (``--logprobs-mode raw_logprobs``); start
  the server with ``--max-logprobs`` >= the member's ``top_k`` (default cap 20).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import MemberError
from .http import HttpSettings
from .remote import DEFAULT_TOP_K, MemberTokenizer, RemoteMember
from .topk import TopK

TOKEN_ID_PREFIX = "token_id:"
LOGPROBS_CAP = re.compile(r"logprobs of \d+, which is greater than max allowed: (\d+)")
"""vLLM's refusal of more logprobs than its ``--max-logprobs`` (``_validate_logprobs``, sample and prompt)."""


def served_model(client_answer: Any) -> tuple[str, str | None, int | None]:
    """(served name, model root path, context window) from a ``GET /v1/models`` answer.

    The window is ``max_model_len - 1``: vLLM refuses a request whose prompt plus ``max_tokens`` passes
    ``max_model_len`` (``serving_engine._validate_input``; with no ``max_tokens``, a prompt of
    ``max_model_len`` ids), and every request here asks one new token (the scoring call's bonus row),
    while the engine fills the window up to its last id: a prompt of ``max_model_len`` ids was an HTTP 400
    in the last round of an answer that filled the window, not a finish on "length"."""
    first = client_answer["data"][0]
    length = first.get("max_model_len")
    return str(first["id"]), first.get("root"), int(length) - 1 if length and int(length) > 1 else None


class VLLMMember(RemoteMember):
    """A model served by ``vllm serve`` (see the module docstring)."""

    backend = "vllm"

    def __init__(self, name: str, url: str, tokenizer: MemberTokenizer, *, model: str,
                 top_k: int = DEFAULT_TOP_K, context_window: int | None = None,
                 http: HttpSettings | None = None, check_tokenizer: bool = True) -> None:
        self.model = model
        super().__init__(name, url, tokenizer, top_k=top_k, context_window=context_window, http=http,
                         check_tokenizer=check_tokenizer)

    def wire_capabilities(self) -> dict[str, bool]:
        return {"block_scoring": True, "prefix_cache": False, "token_id_prompts": True}

    def server_tokenize(self, text: str) -> list[int]:
        answer = self.client.post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})
        try:
            return [int(t) for t in answer["tokens"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise self.malformed("/tokenize", answer) from exc

    def score_request(self, ids: list[int], first_row: int) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0,
                                "logprobs": self.top_k, "return_tokens_as_token_ids": True}
        if first_row < len(ids):
            body["prompt_logprobs"] = self.top_k
        return body

    def score(self, ids: list[int], first_row: int) -> list[TopK]:
        try:
            answer = self.client.post("/v1/completions", self.score_request(ids, first_row))
        except MemberError as exc:
            capped = self.logprobs_cap_error(exc)
            if capped is None:
                raise
            raise capped from exc
        return self.parse_score(answer, ids, first_row)

    def logprobs_cap_error(self, exc: MemberError) -> MemberError | None:
        """What to do about a server started with ``--max-logprobs`` below this member's ``top_k``
        (vLLM's HTTP 400 "Requested sample logprobs of 20, which is greater than max allowed: 5" on
        every scoring call: the server's ``/v1/models`` does not say its cap, so it shows only here);
        None for any other error."""
        cap = LOGPROBS_CAP.search(exc.reason)
        if cap is None:
            return None
        return self.client.error(
            f"the server returns at most {cap.group(1)} logprobs, fewer than this member's top_k "
            f"{self.top_k}: restart vLLM with --max-logprobs {self.top_k} (or more), or give the member "
            f"top_k={cap.group(1)} or less (MemberConfig's top_k; load_member(..., top_k=N)) ({exc.reason})")

    def parse_score(self, answer: Any, ids: list[int], first_row: int) -> list[TopK]:
        try:
            choice = answer["choices"][0]
            entries = []
            if first_row < len(ids):
                prompt_lp = choice["prompt_logprobs"]
                if len(prompt_lp) != len(ids):
                    raise ValueError(f"{len(prompt_lp)} prompt_logprobs for {len(ids)} prompt ids")
                for position in range(first_row, len(ids)):
                    kept = {int(t): float(v["logprob"]) for t, v in prompt_lp[position].items()
                            if int(v.get("rank", 1)) <= self.top_k}
                    entries.append(TopK(list(kept), list(kept.values())))
            bonus = choice["logprobs"]["top_logprobs"][0]
            kept = {_token_id(key): float(value) for key, value in bonus.items()}
            entries.append(TopK(list(kept), list(kept.values())))
            return entries
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise self.malformed("/v1/completions", exc) from exc


def _token_id(key: str) -> int:
    if not key.startswith(TOKEN_ID_PREFIX):
        raise ValueError(f"top_logprobs key {key!r} is not 'token_id:N' (return_tokens_as_token_ids ignored?)")
    return int(key[len(TOKEN_ID_PREFIX):])
