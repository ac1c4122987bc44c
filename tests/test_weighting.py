"""weighting.py on hand-made numbers: PackLLM-sim weights, content spans, span log-probabilities,
the mixture-weight EM and the drafter_confidence choice."""

from __future__ import annotations

import math

import pytest
import torch

from shared_engine.weighting import (
    TextFit,
    best_threshold,
    content_spans,
    fit_of,
    mixture_weights,
    packllm_weights,
    reference_losses,
    segment_logprobs,
    token_nlls,
    tokens_inside,
)


def test_packllm_weights_are_a_softmax_of_minus_loss_over_temperature() -> None:
    weights = packllm_weights([1.0, 2.0], temperature=1.0)
    assert weights[0] == pytest.approx(1 / (1 + math.exp(-1)))
    assert sum(weights) == pytest.approx(1.0)
    assert packllm_weights([1.0, 2.0], temperature=0.5)[0] == pytest.approx(1 / (1 + math.exp(-2)))
    assert packllm_weights([3.0, 3.0]) == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError):
        packllm_weights([1.0, 2.0], temperature=0.0)
    with pytest.raises(ValueError):
        packllm_weights([1.0, math.nan])
    # a member that gave a prompt token no probability (+inf loss) weighs nothing; it failed the request
    assert packllm_weights([1.0, math.inf]) == [1.0, 0.0]
    with pytest.raises(ValueError):
        packllm_weights([math.inf, math.inf])


def test_reference_losses_compare_the_same_bytes_per_reference_token() -> None:
    # Both spell 12 bytes; the reference needs 4 tokens (3 bytes each), the other 6 tokens.
    ref, other = TextFit(nll=6.0, num_bytes=12, num_tokens=4), TextFit(nll=3.0, num_bytes=12, num_tokens=6)
    assert reference_losses([ref, other]) == pytest.approx([1.5, 0.75])  # nats per reference token
    # Per own token the other would look 3x better than the reference instead of 2x: not comparable.
    with pytest.raises(ValueError):
        reference_losses([ref, TextFit(0.0, 0, 0)])


def test_token_nlls_reads_each_row_at_its_token() -> None:
    rows = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]))
    assert token_nlls(rows, [1, 2]).tolist() == pytest.approx([-math.log(0.25), -math.log(0.8)])
    with pytest.raises(ValueError):
        token_nlls(rows, [1])


def test_content_spans_and_tokens_inside_skip_template_markup() -> None:
    rendered = b"<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
    spans = content_spans(rendered, ["  Hello there ", "missing"])
    assert spans == [(17, 28)]
    pieces = [b"<|im_start|>", b"user", b"\n", b"Hello", b" there", b"<|im_end|>", b"\n", b"<|im_start|>",
              b"assistant", b"\n"]
    lengths = [len(p) for p in pieces]
    assert tokens_inside(pieces, spans) == [3, 4]
    # a token that carries the space before the content ("User: Hello", SentencePiece's "▁Hello") counts
    plain = [b"User", b":", b" Hello", b" there", b"\n"]
    assert tokens_inside(plain, content_spans(b"".join(plain), ["Hello there"])) == [2, 3]
    # drafter='auto' keeps its measured rule: wholly inside, so that " Hello" is left out (the first word
    # scored too flips SQuAD's choice from Qwen to Gemma-3-270m: auto_weights.answer_tokens)
    assert tokens_inside(plain, content_spans(b"".join(plain), ["Hello there"]), whole=True) == [3]
    nlls = torch.arange(1.0, 10.0)  # token i's NLL is i
    fit = fit_of(nlls, lengths, [3, 4])
    assert (fit.nll, fit.num_bytes, fit.num_tokens) == (7.0, 11, 2)
    assert fit_of(nlls, lengths, []) == TextFit(0.0, 0, 0)


def test_segment_logprobs_sum_each_member_between_shared_boundaries() -> None:
    # Text of 6 bytes. Member A: tokens ending at 2, 4, 6; member B: at 1, 4, 6. Shared: 0, 4, 6.
    spans = segment_logprobs([[2, 4, 6], [1, 4, 6]], [[-1.0, -2.0, -0.5], [-0.1, -0.2, -3.0]], [0, 4, 6])
    assert spans.flatten().tolist() == pytest.approx([-3.0, -0.3, -0.5, -3.0])
    with pytest.raises(ValueError):
        segment_logprobs([[2, 4, 6], [1, 4, 6]], [[-1.0, -2.0, -0.5], [-0.1, -0.2, -3.0]], [0, 2, 6])


def test_mixture_weights_reach_the_maximum_likelihood() -> None:
    # Two spans; p_A = (0.9, 0.1), p_B = (0.1, 0.9): by symmetry the optimum is 1/2, 1/2.
    spans = torch.log(torch.tensor([[0.9, 0.1], [0.1, 0.9]]))
    assert mixture_weights(spans).weights == pytest.approx([0.5, 0.5], abs=1e-6)
    # A always gives 0.8, B always 0.2: all weight on A.
    spans = torch.log(torch.tensor([[0.8, 0.2]] * 5))
    assert mixture_weights(spans).weights[0] == pytest.approx(1.0, abs=1e-4)
    # p_A = (1, 0.5), p_B = (0.5, 1) ... and one more span where only A is right:
    # L(w) = log(w + (1-w)/2) + log(w/2 + 1 - w) + log(0.6 w + 0.2 (1-w)); maximise numerically.
    spans = torch.log(torch.tensor([[1.0, 0.5], [0.5, 1.0], [0.6, 0.2]]))
    grid = torch.linspace(0, 1, 100001, dtype=torch.float64)
    total = (torch.log(grid + (1 - grid) / 2) + torch.log(grid / 2 + 1 - grid)
             + torch.log(0.6 * grid + 0.2 * (1 - grid)))
    fit = mixture_weights(spans)
    assert fit.weights[0] == pytest.approx(float(grid[torch.argmax(total)]), abs=1e-3)
    assert fit.log_likelihood == pytest.approx(float(total.max()), abs=1e-6)
    with pytest.raises(ValueError):
        mixture_weights(torch.zeros(0, 2))
    # A span only B can produce pulls weight to B; one neither can is ignored.
    spans = torch.tensor([[-math.inf, math.log(0.5)], [-math.inf, -math.inf], [math.log(0.5), math.log(0.5)]])
    assert mixture_weights(spans).weights == pytest.approx([0.0, 1.0], abs=1e-4)


def test_best_threshold_keeps_the_drafter_only_where_that_is_right_more_often() -> None:
    top = [0.95, 0.9, 0.8, 0.6, 0.4]
    drafter = [True, True, True, False, False]
    fused = [True, False, False, True, True]  # fusion breaks two confident positions, fixes two others
    best, accuracy = best_threshold(top, drafter, fused, grid=[0.5, 0.7, 0.9])
    assert best == 0.7
    assert accuracy == pytest.approx({"none": 0.6, "0.9": 0.8, "0.7": 1.0, "0.5": 0.8})
    # Fusion never hurts: keep the paper's rule (None).
    best, _ = best_threshold(top, [False] * 5, [True] * 5, grid=[0.5, 0.7, 0.9])
    assert best is None
