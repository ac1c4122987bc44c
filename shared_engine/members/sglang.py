"""SGLang members over the native ``POST /generate`` (plus ``/tokenize``).

Scoring a block is ONE request that also reuses the radix prefix cache:
``input_ids = ids, return_logprob, top_logprobs_num = k, logprob_start_len = first_row - 1,
max_new_tokens = 1``. SGLang computes logits from position ``s = logprob_start_len`` on; the answer's
``meta_info.input_top_logprobs`` is ``[None, dist@s, ..., dist@len-2]`` (``dist@i`` predicts
``ids[i+1]``) and ``output_top_logprobs[0]`` is the distribution after the last id. Older versions
differ in the leading ``None``, so rows are aligned **from the end** and the ids in
``input_token_logprobs`` are checked against the prompt. Each logprob item is
``[logprob, token_id, text_or_null]``. The prefix cache keeps ``ids[:s]``, so only the block is computed.

Start the server with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` so output logprobs are not temperature-scaled
(requests here use ``temperature: 0`` anyway).

The context window comes from the server (``served_context_window``), as vLLM's does: the tokenizer
folder only knows the model's ``max_position_embeddings``, not a ``--context-length`` the server was
started with.
"""

from __future__ import annotations

from typing import Any

from ..errors import MemberError
from .http import JsonClient
from .remote import RemoteMember
from .topk import TopK


def served_context_window(client: JsonClient) -> int | None:
    """The window the engine may fill on this server, from its ``GET /v1/models``; None where the
    server does not say (then the member falls back to the tokenizer folder's ``max_position_embeddings``,
    else 2048).

    SGLang's ``python/sglang/srt/entrypoints/http_server.py`` answers ``/v1/models`` with
    ``ModelCard(id=served_model_name, root=served_model_name,
    max_model_len=tokenizer_manager.model_config.context_len)``: the context length in effect, the
    model's own or ``--context-length``. ``max_model_len`` was added by sgl-project/sglang PR #4809
    ("Include context length in /v1/models response", 2025-03); older servers answer without it.
    ``/get_model_info`` names no length in any version read (``model_path``, ``tokenizer_path``,
    ``is_generation``, ``preferred_sampling_params``, ``weight_version``).

    The window is ``context_len - 2``: SGLang's tokenizer manager refuses a request when
    ``input tokens + max_new_tokens >= context_len`` ("Requested token count exceeds the model's
    maximum context length"), so with the ``max_new_tokens = 1`` every request here asks (the scoring
    call's bonus row) a prompt may hold ``context_len - 2`` ids, and the engine fills the window up to
    its last id (a window of ``context_len - 1`` was an HTTP 400 in the last round of an answer that
    filled it, not a finish on "length")."""
    try:
        answer = client.get("/v1/models")
    except MemberError as exc:  # a route the server lacks (or refuses): the fallback, as before
        if exc.status is None or not 400 <= exc.status < 500:
            raise
        return None
    try:
        length = answer["data"][0].get("max_model_len")
        return int(length) - 2 if length and int(length) > 2 else None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return None


class SGLangMember(RemoteMember):
    """A model served by ``python -m sglang.launch_server`` (see the module docstring)."""

    backend = "sglang"

    def wire_capabilities(self) -> dict[str, bool]:
        return {"block_scoring": True, "prefix_cache": True, "token_id_prompts": True}

    def server_tokenize(self, text: str) -> list[int]:
        answer = self.client.post("/tokenize", {"prompt": text, "add_special_tokens": False})
        try:
            return [int(t) for t in answer["tokens"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise self.malformed("/tokenize", answer) from exc

    def score_request(self, ids: list[int], first_row: int) -> dict[str, Any]:
        return {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                "return_logprob": True, "logprob_start_len": first_row - 1, "top_logprobs_num": self.top_k}

    def score(self, ids: list[int], first_row: int) -> list[TopK]:
        answer = self.client.post("/generate", self.score_request(ids, first_row))
        return self.parse_score(answer, ids, first_row)

    def parse_score(self, answer: Any, ids: list[int], first_row: int) -> list[TopK]:
        self.raise_if_aborted(answer)
        try:
            meta = answer["meta_info"]
            need = len(ids) - first_row
            rows = list(meta["input_top_logprobs"])[len(meta["input_top_logprobs"]) - need:] if need else []
            if need:
                got = [int(item[1]) for item in meta["input_token_logprobs"][-need:]]
                if len(rows) != need or got != ids[first_row:]:
                    raise ValueError(f"input logprobs do not line up with the prompt (ids {got[:5]}...)")
            rows.append(meta["output_top_logprobs"][0])
            return [TopK([int(item[1]) for item in row], [float(item[0]) for item in row]) for row in rows]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise self.malformed("/generate", exc) from exc

    def raise_if_aborted(self, answer: Any) -> None:
        """The server's own reason where it aborted the request: SGLang answers an abort without a
        ``status_code`` (a scheduler that died, a request aborted by the server or an admin) with HTTP 200,
        empty logprob lists and ``meta_info.finish_reason = {"type": "abort", "message": ...}``; read as
        rows, that was a confusing "unexpected shape" error."""
        meta = answer.get("meta_info") if isinstance(answer, dict) else None
        reason = meta.get("finish_reason") if isinstance(meta, dict) else None
        if isinstance(reason, dict) and reason.get("type") == "abort":
            message = reason.get("message") or "no reason given"
            raise self.client.error(f"the server aborted the request: {message}")
