"""A TokenSpeed worker built only from the published ``smg-grpc-proto`` stubs.

Used by ``crates/engine/tests/interop.rs`` to prove that Iris's generated
clients speak the published contract. Run as::

    python smg_server.py REQUEST_LOG [--max-seconds N]

It serves ``TokenSpeedScheduler`` and ``TokenSpeedEncoder`` on 127.0.0.1 at
a free port, prints ``listening PORT`` on stdout once bound, and appends
every request it receives to REQUEST_LOG as one JSON line
``{"rpc": NAME, "request": DICT}`` (the proto3 JSON mapping with proto field
names: 64-bit integers as strings, bytes as base64, enums by name).

Its answers are canned: every field the published messages have is set to
a distinctive non-default value, including fields Iris does not declare
(those must be skipped by Iris's decoders). The Rust test holds a copy of
these values and compares what it decoded against them, so a change here
must be mirrored there. A Generate whose request_id is ``reject-me`` is
refused with RESOURCE_EXHAUSTED to carry a status across. The server stops
by itself after ``--max-seconds`` (default 300).
"""

import argparse
import concurrent.futures
import hashlib
import json
import sys
import threading

from smg_env import (
    common_pb2,
    grpc,
    to_dict,
    tokenspeed_encoder_pb2 as enc,
    tokenspeed_encoder_pb2_grpc as enc_grpc,
    tokenspeed_scheduler_pb2 as pb,
    tokenspeed_scheduler_pb2_grpc as pb_grpc,
)

# Tokenizer bundle served in three chunks; sha256 on the last only.
TOKENIZER_CHUNKS = [b"PK\x03\x04smg-interop-", b"\x00\xff\x10tokenizer-", b"bundle-end"]


class RequestLog:
    """Appends one JSON line per request, flushed before the answer."""

    def __init__(self, path):
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, rpc, request):
        line = json.dumps({"rpc": rpc, "request": to_dict(request)})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


def logprobs(ids, values):
    return pb.OutputLogProbs(
        token_logprobs=values,
        token_ids=ids,
        top_logprobs=[
            pb.TopLogProbs(values=[v, v - 2.0], token_ids=[i, i + 1])
            for i, v in zip(ids, values)
        ],
    )


def generate_responses(request_id):
    """Two chunks and two completions (one per matched_stop variant)."""
    chunk1 = pb.GenerateStreamChunk(
        token_ids=[101, 202],
        prompt_tokens=7,
        completion_tokens=2,
        cached_tokens=3,
        output_logprobs=logprobs([101, 202], [-0.5, -1.25]),
        index=1,
        weight_version="w-chunk",
    )
    chunk2 = pb.GenerateStreamChunk(
        token_ids=[3000000001],
        prompt_tokens=3000000002,
        completion_tokens=3,
        cached_tokens=4,
        output_logprobs=logprobs([3000000001], [-0.125]),
        index=2,
        weight_version="w-chunk-2",
    )
    complete1 = pb.GenerateComplete(
        output_ids=[101, 202, 3000000001],
        finish_reason="stop",
        prompt_tokens=7,
        completion_tokens=3,
        cached_tokens=5,
        output_logprobs=logprobs([101, 202, 3000000001], [-0.5, -1.25, -0.125]),
        matched_token_id=3000000007,
        index=1,
        spec_accepted_tokens=6,
        spec_draft_tokens=8,
        weight_version="w-complete",
    )
    complete2 = pb.GenerateComplete(
        output_ids=[55],
        finish_reason="length",
        prompt_tokens=9,
        completion_tokens=1,
        cached_tokens=6,
        output_logprobs=logprobs([55], [-3.75]),
        matched_stop_str="</smg-stop>",
        index=2,
        spec_accepted_tokens=1,
        spec_draft_tokens=2,
        weight_version="w-complete-2",
    )
    yield pb.GenerateResponse(request_id=request_id, chunk=chunk1)
    yield pb.GenerateResponse(request_id=request_id, chunk=chunk2)
    yield pb.GenerateResponse(request_id=request_id, complete=complete1)
    yield pb.GenerateResponse(request_id=request_id, complete=complete2)


def model_info(call_number):
    """Every field 1-18 set. From the second call on supports_vision is
    false, so the two bool fields are told apart on the wire."""
    return pb.GetModelInfoResponse(
        model_path="/models/smg-interop",
        tokenizer_path="/models/smg-interop/tokenizer",
        served_model_name="smg-interop-served",
        model_type="qwen2_5_vl",
        architectures=["Qwen2_5_VLForConditionalGeneration", "SmgProbe"],
        max_context_length=131072,
        max_req_input_len=131000,
        vocab_size=152064,
        eos_token_ids=[151645, 151643, -1],
        pad_token_id=-2,
        bos_token_id=151644,
        weight_version="2026-01-interop",
        default_sampling_params_json='{"temperature":0.7,"top_p":0.8}',
        supports_vision=call_number == 1,
        supports_multimodal=True,
        supported_modalities=[common_pb2.IMAGE, common_pb2.VIDEO, common_pb2.AUDIO],
        model_dtype="bfloat16",
        multimodal_encoder_dtype="float16",
    )


def server_info():
    info = pb.GetServerInfoResponse(
        active_requests=-4,
        is_paused=True,
        uptime_seconds=1234.5625,
        max_total_num_tokens=262144,
        tokenspeed_version="smg-interop 0.4.28",
        constrained_decoding="always",
    )
    info.server_args.update(
        {"role": "smg-probe", "port": 30001, "flags": [True, "x", None, 1.5], "nested": {"k": "v"}}
    )
    info.scheduler_info.update({"queue": "fifo", "depth": 3})
    info.start_time.seconds = 1767225600
    info.start_time.nanos = 123456789
    return info


def loads():
    def load(rank, base):
        return pb.SchedulerLoad(
            dp_rank=rank,
            num_running_reqs=base + 1,
            num_waiting_reqs=base + 2,
            num_total_reqs=base + 3,
            num_used_tokens=base + 4,
            max_total_num_tokens=base + 5,
            max_running_requests=base + 6,
            token_usage=0.25 + rank,
            gen_throughput=512.5 + rank,
            cache_hit_rate=0.125 + rank,
            utilization=0.75 + rank,
            num_waiting_uncached_tokens=base + 14,
            active_token_usage=0.0625,
            memory=pb.MemoryMetrics(weight_gb=1.5, kv_cache_gb=2.5, graph_gb=0.5, token_capacity=9),
            queues=pb.QueueMetrics(waiting=1, grammar=2, paused=3, retracted=4),
        )

    return pb.GetLoadsResponse(
        timestamp="2026-01-01T00:00:00.123Z",
        version="smg-interop-loads",
        dp_rank_count=2,
        loads=[load(0, 10), load(1, 20)],
        aggregate=pb.AggregateMetrics(
            total_running_reqs=32,
            total_waiting_reqs=34,
            total_reqs=66,
            avg_token_usage=0.75,
            avg_throughput=1025.0,
            avg_utilization=1.25,
        ),
    )


class Scheduler(pb_grpc.TokenSpeedSchedulerServicer):
    """TokenSpeedScheduler with canned answers; FlushCache, the profile RPCs
    and SubscribeKvEvents keep the generated UNIMPLEMENTED behaviour."""

    def __init__(self, log):
        self._log = log
        self._model_info_calls = 0
        self._lock = threading.Lock()

    def Generate(self, request, context):
        self._log.write("Generate", request)
        if request.request_id == "reject-me":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "smg-server: queue full for reject-me")
        yield from generate_responses(request.request_id)

    def HealthCheck(self, request, context):
        self._log.write("HealthCheck", request)
        return pb.HealthCheckResponse(healthy=True, message="smg-server: healthy")

    def Abort(self, request, context):
        self._log.write("Abort", request)
        return pb.AbortResponse(
            success=True,
            message="smg-server aborted %s (%s)" % (request.request_id, request.reason),
        )

    def GetModelInfo(self, request, context):
        self._log.write("GetModelInfo", request)
        with self._lock:
            self._model_info_calls += 1
            call = self._model_info_calls
        return model_info(call)

    def GetServerInfo(self, request, context):
        self._log.write("GetServerInfo", request)
        return server_info()

    def GetLoads(self, request, context):
        self._log.write("GetLoads", request)
        return loads()

    def GetTokenizer(self, request, context):
        self._log.write("GetTokenizer", request)
        sha = hashlib.sha256(b"".join(TOKENIZER_CHUNKS)).hexdigest()
        for i, data in enumerate(TOKENIZER_CHUNKS):
            last = i == len(TOKENIZER_CHUNKS) - 1
            yield common_pb2.GetTokenizerChunk(data=data, sha256=sha if last else "")


class Encoder(enc_grpc.TokenSpeedEncoderServicer):
    def __init__(self, log):
        self._log = log

    def Encode(self, request, context):
        self._log.write("Encode", request)
        return enc.EncodeResponse(accepted=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request_log")
    parser.add_argument("--max-seconds", type=float, default=300.0)
    args = parser.parse_args()

    log = RequestLog(args.request_log)
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=8),
        options=[("grpc.so_reuseport", 0)],
    )
    pb_grpc.add_TokenSpeedSchedulerServicer_to_server(Scheduler(log), server)
    enc_grpc.add_TokenSpeedEncoderServicer_to_server(Encoder(log), server)
    port = server.add_insecure_port("127.0.0.1:0")
    if port == 0:
        sys.exit("smg-server: could not bind a port on 127.0.0.1")
    server.start()
    print("listening %d" % port, flush=True)
    server.wait_for_termination(timeout=args.max_seconds)
    server.stop(grace=None)


if __name__ == "__main__":
    main()
