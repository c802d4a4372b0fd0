"""How a GetLoadsResponse of either protocol becomes the one load the router gets."""

from __future__ import annotations

from typing import Any

import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sglang_pb
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb

from extproc.engine_client import EngineLoad, load_from_reply, loads_by_rank, subscribe_method


def two_ranks(pb: Any) -> Any:
    """A GetLoadsResponse of two ranks listed out of order, rank 0's usage out of range."""
    return pb.GetLoadsResponse(
        dp_rank_count=2,
        loads=[
            pb.SchedulerLoad(
                dp_rank=1,
                num_running_reqs=2,
                num_waiting_reqs=4,
                token_usage=0.2,
                max_total_num_tokens=3000,
                max_running_requests=8,
                num_waiting_uncached_tokens=400,
            ),
            pb.SchedulerLoad(
                dp_rank=0,
                num_running_reqs=3,
                num_waiting_reqs=1,
                token_usage=1.5,
                max_total_num_tokens=1000,
                max_running_requests=6,
                num_waiting_uncached_tokens=100,
            ),
        ],
    )


# A report of nothing running, waiting or cached.
NOTHING = EngineLoad(running=0, waiting=0, kv_usage=0.0, max_running=0)


def fields(load: EngineLoad) -> tuple[int, int, float, int, int]:
    """A load's fields in order, for comparing with approximate usage."""
    return (load.running, load.waiting, load.kv_usage, load.max_running, load.waiting_uncached_tokens)


@pytest.mark.parametrize("pb", [vllm_pb, sglang_pb], ids=["vllm", "sglang"])
def test_ranks_add_up_and_kv_usage_is_the_share_of_all_kv_tokens(pb: Any) -> None:
    # (1.0 (clamped) * 1000 + 0.2 * 3000) / 4000 = 0.4
    assert fields(load_from_reply(two_ranks(pb))) == pytest.approx((5, 5, 0.4, 14, 500))


def test_unknown_capacities_average_the_ranks_usage() -> None:
    reply = vllm_pb.GetLoadsResponse(
        loads=[vllm_pb.SchedulerLoad(token_usage=0.25), vllm_pb.SchedulerLoad(token_usage=0.75)]
    )
    assert load_from_reply(reply) == EngineLoad(running=0, waiting=0, kv_usage=0.5, max_running=0)


def test_missing_fields_read_zero_and_usage_stays_a_fraction() -> None:
    assert load_from_reply(vllm_pb.GetLoadsResponse()) == NOTHING
    assert load_from_reply(sglang_pb.GetLoadsResponse()) == NOTHING
    odd = vllm_pb.GetLoadsResponse(
        loads=[vllm_pb.SchedulerLoad(num_running_reqs=-2, token_usage=float("nan"))]
    )
    assert load_from_reply(odd) == NOTHING
    over = vllm_pb.GetLoadsResponse(loads=[vllm_pb.SchedulerLoad(token_usage=1.5)])
    assert load_from_reply(over).kv_usage == 1.0


def test_sglang_aggregate_is_used_only_without_per_rank_loads() -> None:
    aggregate = sglang_pb.AggregateMetrics(total_running_reqs=7, total_waiting_reqs=2, avg_token_usage=0.4)
    assert load_from_reply(sglang_pb.GetLoadsResponse(aggregate=aggregate)) == EngineLoad(
        running=7, waiting=2, kv_usage=0.4, max_running=0
    )
    both = sglang_pb.GetLoadsResponse(
        aggregate=aggregate, loads=[sglang_pb.SchedulerLoad(num_running_reqs=1, max_running_requests=4)]
    )
    assert load_from_reply(both) == EngineLoad(running=1, waiting=0, kv_usage=0.0, max_running=4)


@pytest.mark.parametrize("pb", [vllm_pb, sglang_pb], ids=["vllm", "sglang"])
def test_each_rank_has_its_own_load(pb: Any) -> None:
    loads = loads_by_rank(two_ranks(pb))
    assert sorted(loads) == [0, 1]
    assert loads[0] == EngineLoad(
        running=3, waiting=1, kv_usage=1.0, max_running=6, waiting_uncached_tokens=100
    )
    assert fields(loads[1]) == pytest.approx((2, 4, 0.2, 8, 400))


def test_no_per_rank_loads_is_no_rank_load() -> None:
    aggregate = sglang_pb.AggregateMetrics(total_running_reqs=7, total_waiting_reqs=2, avg_token_usage=0.4)
    assert loads_by_rank(sglang_pb.GetLoadsResponse(aggregate=aggregate)) == {}
    assert loads_by_rank(vllm_pb.GetLoadsResponse()) == {}
    odd = vllm_pb.GetLoadsResponse(
        loads=[
            vllm_pb.SchedulerLoad(dp_rank=-1, num_running_reqs=5),
            vllm_pb.SchedulerLoad(num_running_reqs=-2),
        ]
    )
    assert loads_by_rank(odd) == {0: NOTHING}


def test_kv_events_are_subscribed_under_each_service_name() -> None:
    assert subscribe_method("vllm") == "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents"
    assert subscribe_method("sglang") == "/sglang.grpc.scheduler.SglangScheduler/SubscribeKvEvents"
