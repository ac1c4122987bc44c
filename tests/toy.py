"""Tiny, self-contained test fixtures: two tokenizers trained at test time and random tiny models.

Nothing here downloads anything. Every builder is cached with ``functools.lru_cache`` so that it
runs once per test process; building everything takes well under five seconds on a laptop CPU.

- ``byte_level_tokenizer()``: a GPT-2/Qwen-style byte-level BPE. Its corpus mentions "Sofia" a
  lot, so ``" Sofia"`` is ONE token (``"ĠSofia"``). Has a ChatML chat template.
- ``metaspace_tokenizer()``: a Llama/Mistral-style SentencePiece BPE (Metaspace ``▁`` with
  ``prepend_scheme="first"``, byte fallback ``<0x00>``..``<0xFF>``, BOS added by the post
  processor, no chat template). Its corpus never contains "Sofia" but has many "So..." and
  "...fia..." words, so ``" Sofia"`` is split into several tokens.
- ``tiny_llama``, ``tiny_gpt2``, ``tiny_sliding``: random-init float32 eval-mode models sized to
  a tokenizer (``tiny_sliding`` is a Gemma-3 text model whose first layer uses a sliding window
  of ``SLIDING_WINDOW`` tokens and whose second layer is full attention; default sdpa attention,
  as the real zoo models load).
- ``toy_member(name, tokenizer, arch, seed)``: an ``HFMember`` over one of the above.
"""

from __future__ import annotations

import copy
import gc
import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from shared_engine.members import HFMember, register_member, unregister_member
from shared_engine.members.chat import normalize_messages
from shared_engine.members.hf import compute_thread

BYTE_LEVEL_VOCAB = 900
METASPACE_VOCAB = 700  # includes the 256 byte-fallback pieces and 4 special tokens
SLIDING_WINDOW = 8

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# ----------------------------------------------------------------------------- corpora

_NAMES_A = ["Sofia", "Sofia", "Sofia", "Maria", "Tom", "Alex", "Nina", "Omar", "Lena"]
_PLACES = ["Paris", "the park", "the station", "Berlin", "the office", "school", "the lake"]
_VERBS = ["walked to", "drove to", "looked at", "talked about", "wrote about", "visited"]
_THINGS = ["apples", "books", "coffee", "the river", "a letter", "the answer", "numbers"]

_CODE_A = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * 2)\n",
    "if x == 3:\n    y = [1, 2, 3]\nelse:\n    y = {}\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    "result = compute(data['key'], 42)  # note: 3.14\n",
    "while n > 0:\n    n -= 1\n",
]


def _corpus_byte_level() -> list[str]:
    rng = random.Random(1234)
    lines = []
    for _ in range(300):
        name, place = rng.choice(_NAMES_A), rng.choice(_PLACES)
        verb, thing = rng.choice(_VERBS), rng.choice(_THINGS)
        n, m = rng.randint(0, 999), rng.randint(0, 99)
        template = rng.randrange(6)
        if template == 0:
            lines.append(f"Hello Sofia! {name} {verb} {place} at {n % 24}:{m:02d}.")
        elif template == 1:
            lines.append(f"{name} said: \"I {verb} {place} with Sofia,\" and smiled.\n")
        elif template == 2:
            lines.append(f"On day {n}, {name} counted {m} {thing}; Sofia counted {n + m}.")
        elif template == 3:
            lines.append(f"Q: What is {n} + {m}?\nA: {n + m}.\n")
        elif template == 4:
            lines.append(f"- {name} ({m} years) likes {thing}, and so does Sofia.\n\n")
        else:
            lines.append(rng.choice(_CODE_A))
    return lines


_SO_WORDS = ["So", "Some", "Song", "Soon", "Sort", "Soup", "Solo", "Sock", "Sold", "Soft"]
_FIA_WORDS = ["mafia", "fiasco", "fiat", "fiance", "fiat", "fiasco"]
_NAMES_B = ["Maria", "Anna", "Peter", "Jonas", "Clara", "Hugo"]


def _corpus_metaspace() -> list[str]:
    # One sentence per item and no newlines: like SentencePiece training, nothing merges with
    # "\n" (it stays a single piece from the initial alphabet).
    rng = random.Random(4321)
    lines = []
    for _ in range(400):
        so, fia, name = rng.choice(_SO_WORDS), rng.choice(_FIA_WORDS), rng.choice(_NAMES_B)
        place, thing = rng.choice(_PLACES), rng.choice(_THINGS)
        n = rng.randint(0, 99)
        template = rng.randrange(5)
        if template == 0:
            lines.append(f"{so} {name} went to {place} and the {fia} was over.")
        elif template == 1:
            lines.append(f"The {fia} of {n} {thing} made {name} sad. {so} it goes.")
        elif template == 2:
            lines.append(f"{so}, {name} asked: where is the {fia}? It is in {place}.")
        elif template == 3:
            lines.append(f"x = {n} * {n % 7} + {so.lower()}_{fia}(y)")
        else:
            lines.append(f"Hello {name}. {so} many {thing} in {place}, said the {fia}.")
    return lines


# ----------------------------------------------------------------------------- tokenizers


def _bpe_state(tokenizer: Tokenizer) -> tuple[dict[str, int], list]:
    model = json.loads(tokenizer.to_str())["model"]
    return model["vocab"], [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]


@cache
def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """GPT-2/Qwen-style byte-level BPE with ``<s>``, ``</s>``, ``<pad>`` and a ChatML template."""
    specials = ["<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BYTE_LEVEL_VOCAB, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus_byte_level(), trainer=trainer)
    # The ChatML markers are added (special) tokens, like Qwen's <|im_start|> / <|im_end|>.
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = CHATML_TEMPLATE
    return fast


@cache
def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """Llama/Mistral-style SentencePiece BPE: ``▁`` spaces prepended to the first word, byte
    fallback, ``<s>`` added in front by the post processor, no chat template."""
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    metaspace = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.pre_tokenizer = metaspace
    trainer = trainers.BpeTrainer(vocab_size=METASPACE_VOCAB - 256, min_frequency=2, special_tokens=[],
                                  initial_alphabet=["\n", "▁"], show_progress=False)
    trainer_tok.train_from_iterator(_corpus_metaspace(), trainer=trainer)
    learned, merges = _bpe_state(trainer_tok)

    # Llama's layout: specials, then the 256 byte pieces, then the learned pieces.
    vocab: dict[str, int] = {}
    for piece in specials + [f"<0x{b:02X}>" for b in range(256)]:
        vocab[piece] = len(vocab)
    for piece, _ in sorted(learned.items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    tok.pre_tokenizer = metaspace
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")


TOKENIZERS = {"byte_level": byte_level_tokenizer, "metaspace": metaspace_tokenizer}

# ----------------------------------------------------------------------------- models


def _special_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    return dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)


def _finish(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    model = model.to(torch.float32).eval()
    for key, value in _special_ids(tokenizer).items():
        setattr(model.generation_config, key, value)
    return model


# A larger init than the default 0.02 makes the random models' next-token distributions peaked,
# so greedy decoding has no near-ties that float noise could flip.
_INIT_RANGE = 0.3


@cache
def tiny_llama(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, initializer_range=_INIT_RANGE,
                         tie_word_embeddings=False, **_special_ids(tokenizer))
    torch.manual_seed(seed)
    return _finish(LlamaForCausalLM(config), tokenizer)


@cache
def tiny_gpt2(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=512,
                        initializer_range=_INIT_RANGE, **_special_ids(tokenizer))
    torch.manual_seed(seed)
    return _finish(GPT2LMHeadModel(config), tokenizer)


@cache
def tiny_sliding(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Gemma3ForCausalLM:
    """Gemma-3 text model: layer 0 sliding window (``SLIDING_WINDOW``), layer 1 full attention."""
    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=8, max_position_embeddings=512, sliding_window=SLIDING_WINDOW,
                              layer_types=["sliding_attention", "full_attention"],
                              initializer_range=_INIT_RANGE,
                              **_special_ids(tokenizer))
    torch.manual_seed(seed)
    return _finish(Gemma3ForCausalLM(config), tokenizer)


ARCHS = {"llama": tiny_llama, "gpt2": tiny_gpt2, "sliding": tiny_sliding}


def toy_member(name: str, tokenizer: str = "byte_level", arch: str = "llama", seed: int = 0) -> HFMember:
    """An ``HFMember`` over a tiny random model; ``tokenizer`` in TOKENIZERS, ``arch`` in ARCHS.

    Cached per (name, tokenizer, arch, seed) however the arguments are passed. Members that differ
    only by ``name`` share one model object (models are read-only here); vary ``seed`` to get a
    different model."""
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown toy tokenizer {tokenizer!r}; use one of {sorted(TOKENIZERS)}")
    if arch not in ARCHS:
        raise ValueError(f"unknown toy arch {arch!r}; use one of {sorted(ARCHS)}")
    return _toy_member(name, tokenizer, arch, seed)


@cache
def _toy_member(name: str, tokenizer: str, arch: str, seed: int) -> HFMember:
    tok = TOKENIZERS[tokenizer]()
    return HFMember(name, ARCHS[arch](tok, seed), tok)


def settle(members: list[HFMember]) -> None:
    """Wait for the jobs a cancelled request left on the members' compute threads (running or still
    queued: a thread takes its jobs in order, so an empty job pushed through returns after them),
    then collect. Waiting on a member's lock instead misses a job still queued behind it."""
    for member in members:
        compute_thread(member.devices).submit(lambda: None).result()
    gc.collect()


@contextmanager
def registered_members(members: list) -> Iterator[list[str]]:
    """The members under names ``load_member`` resolves (LangChain's ``models`` takes names only),
    removed afterwards."""
    for member in members:
        register_member(member)
    try:
        yield [m.name for m in members]
    finally:
        for member in members:
            unregister_member(member.name)


def memorise(model: PreTrainedModel, prompt: list[int], answer: list[int], steps: int = 300) -> None:
    """Train ``model`` until it writes ``answer`` (ids, its EOS included) after ``prompt`` (loss < 0.01, at
    most ``steps`` steps; only the answer is scored): a toy member whose greedy answer is known."""
    ids = torch.tensor([prompt + answer])
    labels = ids.clone()
    labels[0, :len(prompt)] = -100
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    model.eval()


def fitted_member(name: str, tokenizer: str, conversation: str | list[dict[str, str]], steps: int = 30) -> HFMember:
    """A tiny model trained a few steps on ``conversation`` (a prompt or messages) as its own chat
    template renders it: a real model that fits that text far better than a random one of its size."""
    return _fitted_member(name, tokenizer, json.dumps(conversation), steps)


@cache
def _fitted_member(name: str, tokenizer: str, conversation_json: str, steps: int) -> HFMember:
    tok = TOKENIZERS[tokenizer]()
    base = tiny_llama(tok, 11) if tokenizer == "byte_level" else tiny_gpt2(tok, 11)
    model = copy.deepcopy(base).train()
    member = HFMember(name, model, tok)
    ids = torch.tensor([member.prompt_ids(normalize_messages(json.loads(conversation_json)))])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    torch.manual_seed(0)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return HFMember(name, model, tok)


def save_toy_folders(root: Path, prefix: str) -> list[Path]:
    """Two toy members (byte-level and metaspace tokenizers) saved as Hugging Face folders under ``root``,
    as a user's local models are: what scripts and the CLI read by path."""
    folders = []
    for suffix, tokenizer, seed in (("a", "byte_level", 0), ("b", "metaspace", 1)):
        member = toy_member(f"{prefix}-{suffix}", tokenizer, "llama", seed)
        member.model.save_pretrained(root / member.name)
        member.tokenizer.save_pretrained(root / member.name)
        folders.append(root / member.name)
    return folders
