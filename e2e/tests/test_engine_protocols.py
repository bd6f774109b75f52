"""``iris-engine`` speaks the protocol its ``IRIS_ENGINE_PROTOCOL`` names.

A real engine started with the environment twin of ``--protocol`` answers
the published stubs of that protocol (vLLM's ``VllmEngine``, SGLang's
``SglangScheduler``) with the tokens a TokenSpeed engine gives for the same
prompt, and only that service: a client of another protocol gets
UNIMPLEMENTED, which is what tells a gateway which backend a worker is.
"""

from __future__ import annotations

import os

import grpc
import pytest
from conftest import ENGINE_LINE, STARTUP_TIMEOUT, binary, port_of
from smg_grpc_proto.generated import (
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    tokenspeed_scheduler_pb2,
    tokenspeed_scheduler_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

PROMPT = [641, 100, 101, 102, 642]
MAX_NEW = 9
TIMEOUT = 30


def start(processes, model_dir, protocol: str | None) -> str:
    """An aggregated engine; ``protocol`` goes in IRIS_ENGINE_PROTOCOL."""
    env = dict(os.environ)
    env.pop("IRIS_ENGINE_PROTOCOL", None)
    if protocol is not None:
        env["IRIS_ENGINE_PROTOCOL"] = protocol
    args = [binary("iris-engine"), "--host", "127.0.0.1", "--port", "0",
            "--model-path", model_dir]
    process = processes.spawn(f"engine-{protocol or 'default'}", args, env)
    match = process.wait_for_line(ENGINE_LINE, STARTUP_TIMEOUT)
    return f"127.0.0.1:{port_of(match.group(1))}"


def tokenspeed_tokens(channel) -> list[int]:
    pb = tokenspeed_scheduler_pb2
    stub = tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerStub(channel)
    req = pb.GenerateRequest(
        request_id="ts",
        tokenized=pb.TokenizedInput(input_ids=PROMPT),
        sampling_params=pb.SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True),
    )
    return [list(r.complete.output_ids) for r in stub.Generate(req, timeout=TIMEOUT)][-1]


def vllm_tokens(channel) -> list[int]:
    pb = vllm_engine_pb2
    stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
    assert stub.HealthCheck(pb.HealthCheckRequest(), timeout=TIMEOUT).healthy
    req = pb.GenerateRequest(
        request_id="vllm",
        tokenized=pb.TokenizedInput(input_ids=PROMPT),
        sampling_params=pb.SamplingParams(max_tokens=MAX_NEW, ignore_eos=True),
    )
    return [list(r.complete.output_ids) for r in stub.Generate(req, timeout=TIMEOUT)][-1]


def sglang_tokens(channel) -> list[int]:
    pb = sglang_scheduler_pb2
    stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(channel)
    assert stub.HealthCheck(pb.HealthCheckRequest(), timeout=TIMEOUT).healthy
    req = pb.GenerateRequest(
        request_id="sglang",
        tokenized=pb.TokenizedInput(input_ids=PROMPT),
        sampling_params=pb.SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True),
        logprob_start_len=-1,
    )
    return [list(r.complete.output_ids) for r in stub.Generate(req, timeout=TIMEOUT)][-1]


CLIENTS = {"vllm": vllm_tokens, "sglang": sglang_tokens}


@pytest.mark.parametrize("protocol", sorted(CLIENTS))
def test_the_env_twin_picks_the_service(processes, model_dir, protocol):
    with grpc.insecure_channel(start(processes, model_dir, None)) as ts_channel:
        want = tokenspeed_tokens(ts_channel)
    assert len(want) == MAX_NEW
    with grpc.insecure_channel(start(processes, model_dir, protocol)) as channel:
        assert CLIENTS[protocol](channel) == want
        # Only that service is served.
        with pytest.raises(grpc.RpcError) as refused:
            tokenspeed_tokens(channel)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        other = next(p for p in CLIENTS if p != protocol)
        with pytest.raises(grpc.RpcError) as refused:
            CLIENTS[other](channel)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
