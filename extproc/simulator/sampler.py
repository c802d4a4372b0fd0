"""Deterministic "sampling": which token comes next and when a request finishes.

The same request always yields the same tokens, streamed or not, so a gateway test can compare the two
paths and a load run is reproducible. The stop rules follow vLLM's (v1 scheduler `check_stop` plus the
output processor's stop strings), in vLLM's order:

1. the length cap (``max_tokens``, or the context filling up) finishes with "length";
2. the tokenizer's own EOS finishes with "stop" and no stop reason;
3. a token in ``stop_token_ids`` finishes with "stop" and that token as the stop reason; vLLM adds the
   generation config's other EOS ids to every request's ``stop_token_ids`` (unless ``ignore_eos``),
   which is how Llama 3's ``<|end_of_text|>`` ends up reported as the matched token;
4. a stop string in the text finishes with "stop" and the string as the stop reason, even when the
   token also hit the length cap (vLLM's detokenizer overrides the engine's reason).

While fewer than ``min_tokens`` tokens are out, EOS and stop tokens are never drawn (vLLM masks them).

A request that asks for logprobs gets each token's entry from `logprobs.Ranking`, which makes every draw
a sample of a ranked distribution without changing which tokens are drawn.
"""

from __future__ import annotations

import hashlib
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from smg_grpc_proto.generated import vllm_engine_pb2

from extproc.simulator.logprobs import PUNCTUATION_RATE, Ranking, TokenLogprob
from extproc.simulator.model import ModelSpec
from extproc.simulator.vocab import PlausibleVocab

if TYPE_CHECKING:
    from extproc.simulator.planned import OutputPlan

# Natural answer lengths (words before EOS): short enough to keep tests fast, long enough to stream.
NATURAL_LENGTH = (8, 48)
_REDRAWS = 32
# vLLM's threshold below which a temperature means greedy sampling.
GREEDY_EPS = 1e-5
# vLLM's default --max-logprobs: the most alternatives a request may ask for, per token.
MAX_LOGPROBS = 20


@dataclass(frozen=True)
class GenerationParams:
    """A request's sampling parameters, validated and resolved against the model."""

    prompt_len: int
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stop_token_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    seed: int
    # Alternatives to rank per output token: None asks for no logprobs, 0 for the token's own only.
    top_logprobs: int | None = None
    greedy: bool = False  # temperature 0: the likeliest token every step
    # A scripted text or a constraint's output (planned.py) said instead of plausible words, then EOS.
    plan: OutputPlan | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Step:
    """One generated token and, on the last one, why generation finished."""

    token_id: int
    finish_reason: str | None = None
    matched_token_id: int | None = None
    matched_stop_str: str | None = None
    logprob: TokenLogprob | None = None  # when the request asked for logprobs


def prompt_seed(prompt_ids: Sequence[int]) -> int:
    """A seed stable across processes (unlike `hash()` of a str) for requests without one."""
    digest = hashlib.blake2b(array("I", prompt_ids).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def resolve_params(
    params: vllm_engine_pb2.SamplingParams, spec: ModelSpec, prompt_ids: Sequence[int]
) -> GenerationParams:
    """Check a request as vLLM's input processor does; a ValueError is the client's fault."""
    prompt_len = len(prompt_ids)
    if prompt_len == 0:
        raise ValueError("The decoder prompt cannot be empty")
    if prompt_len > spec.max_model_len:
        raise ValueError(
            f"The decoder prompt (length {prompt_len}) is longer than the maximum model length "
            f"of {spec.max_model_len}."
        )
    max_id = max(prompt_ids)
    if max_id > spec.max_token_id:
        raise ValueError(f"Token id {max_id} is out of vocabulary")
    if params.HasField("max_tokens"):
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {params.max_tokens}.")
        max_tokens = params.max_tokens
    else:
        # vLLM's default: whatever room the context has left.
        max_tokens = max(spec.max_model_len - prompt_len, 1)
    if params.HasField("max_tokens") and params.min_tokens > params.max_tokens:
        raise ValueError(
            f"min_tokens must be less than or equal to max_tokens={params.max_tokens}, "
            f"got {params.min_tokens}."
        )
    stop_ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        stop_ids.update(spec.extra_stop_ids)
    top_logprobs = params.logprobs if params.HasField("logprobs") else None
    check_logprobs("logprobs", "sample", top_logprobs, spec)
    check_logprobs("prompt_logprobs", "prompt", requested_prompt_logprobs(params), spec)
    return GenerationParams(
        prompt_len=prompt_len,
        max_tokens=max_tokens,
        min_tokens=params.min_tokens,
        ignore_eos=params.ignore_eos,
        stop_token_ids=frozenset(stop_ids),
        stop_strings=tuple(s for s in params.stop if s),
        seed=params.seed if params.HasField("seed") else prompt_seed(prompt_ids),
        top_logprobs=top_logprobs,
        greedy=params.HasField("temperature") and params.temperature < GREEDY_EPS,
    )


def requested_prompt_logprobs(params: vllm_engine_pb2.SamplingParams) -> int | None:
    return params.prompt_logprobs if params.HasField("prompt_logprobs") else None


def check_logprobs(name: str, kind: str, count: int | None, spec: ModelSpec) -> None:
    """vLLM's limits: -1 means the whole vocabulary, and no more than max_logprobs (20) per token."""
    if count is None:
        return
    if count < -1:
        raise ValueError(f"{name} must be non-negative or -1, got {count}.")
    wanted = spec.vocab_size if count == -1 else count
    if wanted > MAX_LOGPROBS:
        raise ValueError(
            f"Requested {kind} logprobs of {wanted}, which is greater than max allowed: {MAX_LOGPROBS}"
        )


class TokenSampler:
    """Yields a request's tokens one step at a time; pure, so it is unit-testable without gRPC."""

    def __init__(self, params: GenerationParams, spec: ModelSpec, vocab: PlausibleVocab) -> None:
        self._params = params
        self._spec = spec
        self._vocab = vocab
        self._rng = random.Random(params.seed)
        self._natural_length = self._rng.randint(*NATURAL_LENGTH)
        self._eos = spec.emitted_eos_id
        self._count = 0
        self._text = ""  # the output's tail, as long as the longest stop string needs
        self._keep = max((len(stop) for stop in params.stop_strings), default=0)
        self._last_was_punctuation = True  # no punctuation as the very first token
        self._ranking = Ranking(vocab) if params.top_logprobs is not None else None
        self._planned = params.plan.tokens(params.seed) if params.plan is not None else None
        self.finished = False

    def next_step(self) -> Step:
        if self.finished:
            raise RuntimeError("the request has already finished")
        index, punctuation = self._count, not self._last_was_punctuation
        token = self._draw()
        self._count += 1
        step = self._check_stop(token)
        self.finished = step.finish_reason is not None
        if self._ranking is not None:
            step = replace(step, logprob=self._logprob(token, index, punctuation))
        return step

    def _at_end(self, index: int) -> bool:
        natural = self._natural_length if self._planned is None else len(self._planned.tokens)
        return not self._params.ignore_eos and index >= max(natural, self._params.min_tokens)

    def _planned_at(self, index: int) -> int | None:
        planned = self._planned
        return planned.tokens[index] if planned is not None and index < len(planned.tokens) else None

    def _masked(self, index: int) -> bool:
        return index < self._params.min_tokens and bool(self._params.stop_token_ids)

    def _logprob(self, token: int, index: int, punctuation: bool) -> TokenLogprob:
        assert self._ranking is not None and self._params.top_logprobs is not None
        params = self._params
        stops = params.stop_token_ids if self._masked(index) else frozenset()
        eos = self._eos
        return self._ranking.step(
            token,
            (params.seed, index),
            params.top_logprobs,
            greedy=params.greedy,
            punctuation=punctuation and bool(self._vocab.punctuation_ids),
            excluded=lambda t: t == eos or t in stops,
            end_token=eos if self._at_end(index) else None,
        )

    def _draw(self) -> int:
        index = self._count
        if self._at_end(index):
            return self._eos
        planned = self._planned_at(index)
        if planned is not None:
            self._last_was_punctuation = False
            return planned
        masked = self._masked(index)
        token = self._draw_text_token()
        for _ in range(_REDRAWS):
            if not masked or token not in self._params.stop_token_ids:
                break
            token = self._draw_text_token()
        else:
            # Every redraw was a stop token: take the first id that is not one, if any.
            token = next((i for i in self._vocab.word_ids if i not in self._params.stop_token_ids), token)
        self._last_was_punctuation = token in self._vocab.punctuation_ids
        return token

    def _draw_text_token(self) -> int:
        vocab = self._vocab
        if vocab.punctuation_ids and not self._last_was_punctuation and self._rng.random() < PUNCTUATION_RATE:
            return self._rng.choice(vocab.punctuation_ids)
        return self._rng.choice(vocab.word_ids)

    def _check_stop(self, token: int) -> Step:
        params = self._params
        finish: Step | None = None
        if self._count >= params.max_tokens or params.prompt_len + self._count >= self._spec.max_model_len:
            finish = Step(token, "length")
        elif self._count >= params.min_tokens:
            if not params.ignore_eos and token == self._spec.tokenizer_eos_id:
                return Step(token, "stop")
            if token in params.stop_token_ids:
                return Step(token, "stop", matched_token_id=token)
        matched = self._match_stop_string(token)
        if matched is not None:
            return Step(token, "stop", matched_stop_str=matched)
        return finish or Step(token)

    def _match_stop_string(self, token: int) -> str | None:
        index = self._count - 1
        if self._planned is not None and index < len(self._planned.pieces):
            piece = self._planned.pieces[index]
        else:
            piece = self._vocab.text.get(token, "")
        if not self._params.stop_strings or not piece:
            return None
        self._text += piece
        if self._count <= self._params.min_tokens:
            return None
        for stop in self._params.stop_strings:
            # Only a match that the new piece completes counts (older text was checked before).
            start = max(0, len(self._text) - len(piece) - len(stop) + 1)
            if self._text.find(stop, start) != -1:
                return stop
        self._text = self._text[-self._keep :]
        return None
