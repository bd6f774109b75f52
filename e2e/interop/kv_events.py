"""Subscribes to a worker's KV cache events with the published stubs.

Used by ``crates/engine/tests/prefix_cache.rs`` to prove that the
``SubscribeKvEvents`` stream of ``iris-engine`` decodes with the stubs
generated from the published ``smg-grpc-proto`` definitions::

    python kv_events.py ADDRESS PROTOCOL START_SEQUENCE BATCHES

PROTOCOL is ``tokenspeed``, ``vllm`` or ``sglang``. It reads BATCHES
batches (bounded in time) and prints ONE JSON object: ``{"batches": [...]}``
with each batch as protobuf's JSON mapping (int64 values as strings), or
``{"code": ..., "details": ...}`` when the call fails. The Rust test judges
it.
"""

import json
import sys

from smg_env import (
    common_pb2,
    grpc,
    json_format,
    sglang_scheduler_pb2_grpc,
    tokenspeed_scheduler_pb2_grpc,
    vllm_engine_pb2_grpc,
)

STUBS = {
    "tokenspeed": tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerStub,
    "vllm": vllm_engine_pb2_grpc.VllmEngineStub,
    "sglang": sglang_scheduler_pb2_grpc.SglangSchedulerStub,
}


def main():
    address, protocol, start, wanted = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with grpc.insecure_channel(address) as channel:
        stub = STUBS[protocol](channel)
        request = common_pb2.SubscribeKvEventsRequest(start_sequence_number=start)
        batches = []
        try:
            for batch in stub.SubscribeKvEvents(request, timeout=20):
                batches.append(json_format.MessageToDict(batch))
                if len(batches) >= wanted:
                    break
        except grpc.RpcError as error:
            print(json.dumps({"code": error.code().name, "details": error.details()}))
            return
    print(json.dumps({"batches": batches}))


if __name__ == "__main__":
    main()
