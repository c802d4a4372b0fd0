"""Cache-affinity routing through the real stack: the engines' KV events feed the router, so requests
sharing a long prefix land on the engine that holds it, and the hit shows as cached tokens."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import openai
import pytest

from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack

# ~700 tokens of shared system prompt: dozens of 16-token blocks on whichever engine serves it first.
SYSTEM = "You are a meticulous assistant. " + " ".join(
    f"Rule {i}: answer precisely and cite item {i}." for i in range(60)
)


def ask(client: openai.OpenAI, stack: Stack, question: str) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(
        model=stack.model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=4,
    )


def unrelated(i: int) -> list[dict[str, str]]:
    """A prompt of ~130 tokens sharing nothing with SYSTEM or another `i`'s."""
    words = " ".join(f"w{i}x{k}" for k in range(60))
    return [{"role": "user", "content": f"Unrelated {i}: {words}"}]


def serve_every_engine(client: openai.OpenAI, stack: Stack) -> list[int]:
    """One request per engine, each sharing nothing with SYSTEM or the others, so that every engine has
    served and holds something, as in a pool that has run a while. A new engine is fresh (its misses
    count at `fresh_cache_weight`, 0.25): each takes one of these, and none is fresh after. Returns the
    engine that took `unrelated(i)`, for each `i`."""
    before = counts(stack)
    took = []
    for i in range(len(before)):
        asked = counts(stack)
        client.chat.completions.create(model=stack.model, messages=unrelated(i), max_tokens=4)
        took.append(engine_that_took(stack, asked))
        time.sleep(0.5)  # its Stored events reach the router
    assert landed(stack, before) == [1] * len(before), "each fresh engine takes one request"
    return took


def the_engine_asked_first(client: openai.OpenAI, stack: Stack) -> int:
    """One request on SYSTEM: the engine that took it, once its Stored events have reached the router."""
    before = counts(stack)
    ask(client, stack, "Question zero?")
    holder = engine_that_took(stack, before)
    time.sleep(0.5)
    return holder


def a_holder_of_the_prompt(client: openai.OpenAI, stack: Stack) -> int:
    """Every engine serves once (none is fresh after), then the engine that takes a request on SYSTEM."""
    serve_every_engine(client, stack)
    return the_engine_asked_first(client, stack)


def counts(stack: Stack) -> list[int]:
    return [e.stats.generate_requests for e in stack.engines.engines]


def landed(stack: Stack, before: list[int]) -> list[int]:
    """Requests each engine received since `before` (a `counts` taken earlier)."""
    return [a - b for a, b in zip(counts(stack), before, strict=True)]


def engine_that_took(stack: Stack, before: list[int]) -> int:
    """The first engine that received a request since `before`."""
    return next(i for i, n in enumerate(landed(stack, before)) if n > 0)


def wait_for_a_request(stack: Stack, before: list[int], timeout_s: float = 5.0) -> None:
    """Until some engine has received a request since `before` (one sent from another thread)."""
    deadline = time.monotonic() + timeout_s
    while counts(stack) == before and time.monotonic() < deadline:
        time.sleep(0.02)


def ask_while_the_holder_prefills(
    client: openai.OpenAI, stack: Stack, tail: str, after_s: float
) -> tuple[int, list[int], openai.types.chat.ChatCompletion]:
    """Every engine serves once, one takes SYSTEM (the holder); a request on SYSTEM with `tail` goes to
    the holder, and `after_s` after it reached the engine a question on SYSTEM is asked while the tail
    is still prefilling. Returns the holder, where the question landed and its reply."""
    holder = a_holder_of_the_prompt(client, stack)
    busy = threading.Thread(target=ask, args=(client, stack, "Summarize this. " + tail))
    before = counts(stack)
    busy.start()
    wait_for_a_request(stack, before)
    assert counts(stack)[holder] == before[holder] + 1, "the long tail went to the prefix holder"
    time.sleep(after_s)
    before = counts(stack)
    reply = ask(client, stack, "Question one?")
    arrived = landed(stack, before)
    busy.join()
    return holder, arrived, reply


def test_shared_prefix_follows_the_engine_that_holds_it(stack: Stack) -> None:
    client = stack.openai()
    before = counts(stack)
    first = ask(client, stack, "Question zero?")
    holder = engine_that_took(stack, before)
    assert first.usage.prompt_tokens > 600
    time.sleep(0.5)  # the engine's Stored events reach the router on its KV-event stream

    replies = []
    for i in range(1, 7):
        before = counts(stack)
        replies.append(ask(client, stack, f"Question {i}?"))
        arrived = landed(stack, before)
        assert arrived[holder] == 1, f"request {i} went to engine {arrived.index(1)}, not the prefix holder"
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in replies]
    # The shared system prompt is served from the holder's prefix cache: whole blocks of it.
    assert all(c >= 600 for c in cached), cached


def test_round_robin_ignores_the_prefix(tmp_path: Path) -> None:
    # The control: without cache affinity the same requests alternate between the engines.
    with local_stack(FreePorts(), tmp_path, routing_policy="round_robin") as rr:
        client = rr.openai()
        for i in range(6):
            ask(client, rr, f"Question {i}?")
        assert counts(rr) == [3, 3]


# One shared prefix of ~700 tokens; a cold tail of ~800 more; a slow prefill so the tail's is still under
# way when the next request is routed.
LONG_TAIL = " ".join(f"Appendix {i}: the figures of table {i} stand as printed." for i in range(80))
SLOW_PREFILL = SimOptions(prefill_ms_per_token=2.0)


@pytest.mark.parametrize(
    "routing_config,joins_the_holder",
    [(None, True), ('{"uncached_weight": 1}', False)],
    ids=["default", "uncached_counted_once"],
)
def test_a_prefix_group_stays_on_its_holder_while_it_prefills_other_work(
    tmp_path: Path, routing_config: str | None, joins_the_holder: bool
) -> None:
    # The holder of a shared prefix is busy prefilling a long uncached tail for another request. A
    # follow-up sharing the prefix would wait for that (~800 tokens) there, or prefill the whole prefix
    # again (~700) on the idle engine. By default (uncached_weight 3) the prefix's saved work counts
    # three times, so the group stays where its cache is; counted once, the follow-up spreads it to the other
    # engine, which is what issue 13's suite measured losing to SMG cache_aware. Both engines have served
    # before (a fresh one would take the follow-up at either weight).
    with local_stack(FreePorts(), tmp_path, sim=SLOW_PREFILL, routing_config=routing_config) as s:
        client = s.openai()
        holder, arrived, _ = ask_while_the_holder_prefills(client, s, LONG_TAIL, after_s=0.0)
        assert arrived[holder] == (1 if joins_the_holder else 0), arrived


# ~2,500 tokens of tail (14 a sentence): at 1 ms a token its prefill runs ~2.5 s, and it outweighs
# three times SYSTEM's tokens.
VERY_LONG_TAIL = " ".join(f"Annex {i}: the counts of sheet {i} stand as filed." for i in range(180))


@pytest.mark.parametrize(
    "routing_config,stays",
    [('{"prefill_progress": true}', True), (None, False)],
    ids=["prefill_progress", "default"],
)
def test_a_holder_halfway_through_a_long_prefill_keeps_its_prefix_group(
    tmp_path: Path, routing_config: str | None, stays: bool
) -> None:
    # SYSTEM's holder learned its prefill speed from SYSTEM's own first prefill (~700 tokens). It then
    # takes a request on SYSTEM with a ~2,500-token tail. 1.2 s into that prefill a question on SYSTEM
    # arrives: counted whole, the holder's backlog (~2,500) outweighs prefilling SYSTEM again on the
    # idle engine (3 x ~700), and it goes there; with `prefill_progress` the backlog reads ~1,400 left
    # at the measured speed (~1,000 tokens/s), and the question stays with its cached prefix.
    slow = SimOptions(prefill_ms_per_token=1.0)
    with local_stack(FreePorts(), tmp_path, sim=slow, routing_config=routing_config) as s:
        client = s.openai()
        holder, arrived, reply = ask_while_the_holder_prefills(client, s, VERY_LONG_TAIL, after_s=1.2)
        assert arrived[holder] == (1 if stays else 0), arrived
        cached = reply.usage.prompt_tokens_details.cached_tokens or 0
        assert (cached >= 600) == stays, cached


@pytest.mark.parametrize(
    "routing_config,joins_the_first",
    [('{"book_cold_spread": 1}', True), (None, False)],
    ids=["one_engine", "default_two_of_two"],
)
def test_a_burst_of_a_new_prefix_waits_for_the_engine_prefilling_it(
    tmp_path: Path, routing_config: str | None, joins_the_first: bool
) -> None:
    # A prefix no engine holds yet (a cold start, a new shared prompt) arrives twice in quick succession:
    # the second request is routed while the first engine is still prefilling it (~1.4 s here), before any
    # Stored event. With cold booking on one engine (`book_cold_spread` 1, the share 0.5 of two) the
    # router counts the prefix on that engine and the second joins it; by default a new prefix starts on
    # at least two engines, so here, as without cold booking, the prefix looks cold everywhere and the
    # second goes to the idle engine, prefilling it again. Both engines have served before: a fresh
    # engine would take the second either way.
    with local_stack(FreePorts(), tmp_path, sim=SLOW_PREFILL, routing_config=routing_config) as s:
        client = s.openai()
        serve_every_engine(client, s)
        before = counts(s)
        first = threading.Thread(target=ask, args=(client, s, "Question zero?"))
        first.start()
        wait_for_a_request(s, before)
        holder = engine_that_took(s, before)

        before = counts(s)
        second = ask(client, s, "Question one?")
        arrived = landed(s, before)
        first.join()
        assert arrived[holder] == (1 if joins_the_first else 0), arrived
        # Joined, it waited for the first prefill and then read the prefix from the cache.
        cached = second.usage.prompt_tokens_details.cached_tokens or 0
        assert (cached >= 600) == joins_the_first, cached


@pytest.mark.parametrize(
    "config",
    ['{"book_cold_s": 2, "book_cold_spread": 2, "book_cold_spread_share": 0}', None],
    ids=["two_engines", "default_half_the_pool"],
)
def test_cold_booking_spreads_a_burst_over_as_many_engines_as_asked(
    tmp_path: Path, config: str | None
) -> None:
    # A burst of a new prefix is spread over two engines before its bookings count (`book_cold_spread`
    # 2, or by default half of three engines rounded up). The first request goes to one engine; the
    # second, routed while that one is still prefilling, goes to another (one booked engine is not yet
    # two); the third joins one of the two, not the third engine, which holds nothing. Counted from the
    # first booking (one engine of two: the test above) the second would join the first. Every engine
    # has served before: a fresh one would take the third.
    with local_stack(FreePorts(), tmp_path, engines=3, sim=SLOW_PREFILL, routing_config=config) as s:
        client = s.openai()
        serve_every_engine(client, s)
        burst = []
        took = []
        for i in range(3):
            before = counts(s)
            burst.append(threading.Thread(target=ask, args=(client, s, f"Question {i}?")))
            burst[-1].start()
            wait_for_a_request(s, before)
            took.append(engine_that_took(s, before))
        for t in burst:
            t.join()
        assert took[1] != took[0], f"the second request joined the first's engine: {took}"
        assert took[2] in took[:2], f"the third went to an engine holding nothing of the prefix: {took}"


def ask_as(
    client: openai.OpenAI, stack: Stack, user: str, history: list[str]
) -> openai.types.chat.ChatCompletion:
    """Session `user`'s next request: the shared system prompt, then its turns so far."""
    messages = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(history):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return client.chat.completions.create(model=stack.model, messages=messages, max_tokens=4, user=user)


@pytest.mark.parametrize(
    "routing_config,follows",
    [('{"book_cold_s": 0}', True), ('{"book_cold_s": 0, "book_session_s": 0}', False)],
    ids=["session_booking", "session_booking_off"],
)
def test_a_session_turn_sent_during_its_previous_turn_follows_it(
    tmp_path: Path, routing_config: str | None, follows: bool
) -> None:
    # A session's next turn arrives while its first is still prefilling (~1.4 s here), before any Stored
    # event: turns that do not wait for the answer (an agent's parallel calls, a client on a clock).
    # With session booking (the default) the router counts the first turn's prompt on its engine for this
    # session, and the next turn joins it and reads the prompt from the cache; without, the prompt looks
    # cold everywhere and the turn goes to the idle engine, prefilling it again. That another
    # session does not see the booking is a Rust test (`a_session_turn_follows_its_previous_turn_before_
    # its_events`). Both engines have served before. Cold booking (on by default) is off in both runs: the
    # first turn's prompt is cold, and its cold booking would send any request with it there too.
    with local_stack(FreePorts(), tmp_path, sim=SLOW_PREFILL, routing_config=routing_config) as s:
        client = s.openai()
        serve_every_engine(client, s)
        before = counts(s)
        first = threading.Thread(target=ask_as, args=(client, s, "session-a", ["Question zero?"]))
        first.start()
        wait_for_a_request(s, before)
        holder = engine_that_took(s, before)

        before = counts(s)
        second = ask_as(client, s, "session-a", ["Question zero?", "Thinking.", "And one more?"])
        arrived = landed(s, before)
        first.join()
        assert arrived[holder] == (1 if follows else 0), arrived
        cached = second.usage.prompt_tokens_details.cached_tokens or 0
        assert (cached >= 600) == follows, cached


@pytest.mark.parametrize(
    "routing_config,spreads",
    [('{"resident_session_tokens": 100000}', True), (None, False)],
    ids=["resident_sessions", "default"],
)
def test_a_new_session_starts_where_fewer_sessions_reside(
    tmp_path: Path, routing_config: str | None, spreads: bool
) -> None:
    # Session A's two requests make it resident on its engine; between them and after, nothing is in
    # flight anywhere. Session B's first request shares A's ~700-token system prompt. By default it
    # joins A's engine for the cached prefix; priced per resident session (here more than any prefix),
    # it starts on the other engine and prefills the prompt there. A's next turn follows its history
    # either way.
    with local_stack(FreePorts(), tmp_path, routing_config=routing_config) as s:
        client = s.openai()
        before = counts(s)
        a = ["Task A: list the rules."]
        reply = ask_as(client, s, "session-a", a)
        home = engine_that_took(s, before)
        time.sleep(0.5)  # its Stored events reach the router
        a += [reply.choices[0].message.content or "", "Now the first three."]
        before = counts(s)
        reply = ask_as(client, s, "session-a", a)
        assert landed(s, before)[home] == 1, "A's second turn left its history"
        time.sleep(0.5)

        before = counts(s)
        b = ask_as(client, s, "session-b", ["Task B: count the rules."])
        arrived = landed(s, before)
        cached = b.usage.prompt_tokens_details.cached_tokens or 0
        assert arrived[home] == (0 if spreads else 1), arrived
        assert (cached >= 600) != spreads, cached

        a += [reply.choices[0].message.content or "", "And the last one."]
        before = counts(s)
        third = ask_as(client, s, "session-a", a)
        assert landed(s, before)[home] == 1, "A's third turn left its history"
        assert (third.usage.prompt_tokens_details.cached_tokens or 0) >= 600


@pytest.mark.parametrize(
    "routing_config,copies",
    [('{"fresh_cache_weight": 0}', True), (None, False)],
    ids=["fresh_cache_weight_0", "default"],
)
def test_a_fresh_engine_takes_a_shared_prompt_from_its_holder(
    tmp_path: Path, routing_config: str | None, copies: bool
) -> None:
    # Two engines, neither used. The first request lands on one and its Stored events reach the router.
    # The next request shares its ~700-token system prompt. By default (a fresh engine's misses at 0.25,
    # ~175 tokens against ~30 uncached on the idle holder) it joins the holder for the cached prefix;
    # priced at 0 it goes to the engine nobody used yet, which prefills the prompt (and holds it for
    # what comes after). Once both hold something, the prompt's requests go to a holder either way.
    with local_stack(FreePorts(), tmp_path, routing_config=routing_config) as s:
        client = s.openai()
        holder = the_engine_asked_first(client, s)

        before = counts(s)
        second = ask(client, s, "Question one?")
        arrived = landed(s, before)
        cached = second.usage.prompt_tokens_details.cached_tokens or 0
        assert arrived[holder] == (0 if copies else 1), arrived
        assert (cached >= 600) != copies, cached
        time.sleep(0.5)

        for i in range(2, 5):
            third = ask(client, s, f"Question {i}?")
            assert (third.usage.prompt_tokens_details.cached_tokens or 0) >= 600, f"request {i} missed"


@pytest.mark.parametrize("probe,copies", [("hi", True), (f"hi {SYSTEM[:200]}", False)], ids=["short", "long"])
def test_an_engine_that_served_only_a_short_probe_is_still_fresh(
    tmp_path: Path, probe: str, copies: bool
) -> None:
    # A readiness probe shorter than a block (~11 tokens of "hi" in the chat template) caches no full
    # block, so its engine publishes no event: it is as new as before and stays fresh. A longer probe
    # caches blocks there, and its events say so. At the fresh weight 0 the first SYSTEM request goes to
    # a fresh engine, and the second goes to the other engine if that one is still fresh (a copy), else
    # joins the first's idle engine for the cached prompt.
    with local_stack(FreePorts(), tmp_path, routing_config='{"fresh_cache_weight": 0}') as s:
        client = s.openai()
        client.chat.completions.create(
            model=s.model, messages=[{"role": "user", "content": probe}], max_tokens=2
        )
        time.sleep(0.5)  # any Stored events reach the router

        holder = the_engine_asked_first(client, s)
        before = counts(s)
        ask(client, s, "Question one?")
        arrived = landed(s, before)
        assert arrived[holder] == (0 if copies else 1), arrived


@pytest.mark.parametrize(
    "routing_config,copies",
    [('{"underused_share": 0.5, "demand_window_s": 60}', True), (None, False)],
    ids=["underused_share", "default"],
)
def test_an_underused_engine_takes_a_new_session_and_a_follow_up_keeps_its_history(
    tmp_path: Path, routing_config: str | None, copies: bool
) -> None:
    # Both engines serve once; then every request shares SYSTEM (~700 tokens), and its holder takes
    # them: the other engine is sent nothing more. Until the mean over the window reaches 2 requests
    # nothing counts as underused. By session B's request the holder was sent 5 and the other 1, under
    # half the mean of 3. Session A's second turn follows its history (its first went to the holder a
    # moment ago); session B's first request, new, goes to the underused engine with the setting, which
    # prefills SYSTEM there, and by default to the holder for the cached prompt.
    with local_stack(FreePorts(), tmp_path, routing_config=routing_config) as s:
        client = s.openai()
        holder = a_holder_of_the_prompt(client, s)
        before = counts(s)
        a = ["Task A: list the rules."]
        reply = ask_as(client, s, "session-a", a)
        ask(client, s, "Question one?")
        assert landed(s, before)[holder] == 2, "the holder keeps the prompt until the imbalance shows"
        time.sleep(0.5)

        a += [reply.choices[0].message.content or "", "Now the first three."]
        before = counts(s)
        follow_up = ask_as(client, s, "session-a", a)
        assert landed(s, before)[holder] == 1, "A's second turn left its history"
        assert (follow_up.usage.prompt_tokens_details.cached_tokens or 0) >= 600

        before = counts(s)
        b = ask_as(client, s, "session-b", ["Task B: count the rules."])
        assert landed(s, before)[holder] == (0 if copies else 1)
        assert ((b.usage.prompt_tokens_details.cached_tokens or 0) >= 600) != copies


# Answers that decode for seconds: a 20 ms step, hundreds of tokens.
SLOW_DECODE = SimOptions(itl_ms=20.0)


@pytest.mark.parametrize(
    "routing_config,stays",
    [('{"spill_abs": 2, "spill_counts": "requests"}', False), ('{"spill_abs": 2}', True)],
    ids=["gate_counts_requests", "default_gate_counts_prefilling"],
)
def test_a_prompt_joins_its_holder_while_the_holder_only_decodes(
    tmp_path: Path, routing_config: str, stays: bool
) -> None:
    # The holder of the ~700-token system prompt streams three long answers on it, each past its first
    # token; the other engine is idle. A fourth request on the prompt: a spill gate (slack 2) counting
    # every request skips the holder (3 > 0 + 2), so the idle engine prefills the prompt again;
    # counting only requests still waiting for a first token (the default), the holder has none and
    # keeps the request, which hits its cache.
    with local_stack(FreePorts(), tmp_path, sim=SLOW_DECODE, routing_config=routing_config) as s:
        client = s.openai()
        holder = a_holder_of_the_prompt(client, s)

        streams = []
        try:
            before = counts(s)
            for i in range(3):
                stream = client.chat.completions.create(
                    model=s.model,
                    messages=[
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"Essay {i}?"},
                    ],
                    max_tokens=400,
                    stream=True,
                    extra_body={"ignore_eos": True},
                )
                next(iter(stream))  # the first token is out: the answer only decodes now
                streams.append(stream)
            assert landed(s, before)[holder] == 3, "the long answers went to the prompt's holder"

            before = counts(s)
            reply = ask(client, s, "Question four?")
            arrived = landed(s, before)
            cached = reply.usage.prompt_tokens_details.cached_tokens or 0
            assert arrived[holder] == (1 if stays else 0), arrived
            assert (cached >= 600) == stays, cached
        finally:
            for stream in streams:
                stream.close()


@pytest.mark.parametrize(
    "routing_config,moves",
    [('{"busy_miss_weight": 3, "demand_window_s": 60}', True), (None, False)],
    ids=["busy_miss_weight", "default"],
)
def test_a_new_prompt_leaves_a_busy_holder_and_its_hits_stay(
    tmp_path: Path, routing_config: str | None, moves: bool
) -> None:
    # Each engine serves one unrelated prompt; then SYSTEM's holder takes five hits on it: lately it was
    # sent 7 requests and the other engine 1. The other engine then decodes a long answer on the prompt
    # it holds (one request on it, past its first token), the holder has none. A new prompt cached
    # nowhere waits 3 x its tokens on either, plus 16 for the request on the other engine: by default
    # the holder takes it, where it would delay the hits that keep coming. With `busy_miss_weight` 3
    # the holder, sent over 1.5x the mean, weighs the miss 3 x 0.56 more and the other engine takes it;
    # a question on SYSTEM still goes to its holder.
    with local_stack(FreePorts(), tmp_path, sim=SLOW_DECODE, routing_config=routing_config) as s:
        client = s.openai()
        took = serve_every_engine(client, s)
        holder = the_engine_asked_first(client, s)
        before = counts(s)
        for i in range(5):
            ask(client, s, f"Question {i}?")
        assert landed(s, before)[holder] == 5, "the hits stay on the holder"

        other = 1 - holder
        before = counts(s)
        stream = client.chat.completions.create(
            model=s.model,
            messages=unrelated(took.index(other)),
            max_tokens=400,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        try:
            next(iter(stream))  # the first token is out: the answer only decodes now
            assert landed(s, before)[other] == 1, "the long answer went to the holder of its prompt"

            before = counts(s)
            client.chat.completions.create(model=s.model, messages=unrelated(7), max_tokens=4)
            assert landed(s, before)[holder] == (0 if moves else 1)

            before = counts(s)
            reply = ask(client, s, "Question five?")
            assert landed(s, before)[holder] == 1, "a hit stays on its holder"
            assert (reply.usage.prompt_tokens_details.cached_tokens or 0) >= 600
        finally:
            stream.close()
