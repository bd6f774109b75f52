"""A TokenSpeed client built only from the published ``smg-grpc-proto`` stubs.

Used by ``crates/engine/tests/interop.rs`` to prove that Iris's engine
answers a peer generated from the published definitions. The test starts
real ``iris-engine`` processes (aggregated, prefill, decode) and a stand-in
encoder data server, then runs::

    python smg_client.py CONFIG_JSON

CONFIG_JSON names the workers and the request to send (see ``main``). The
script calls HealthCheck, GetModelInfo, GetServerInfo, GetLoads,
GetTokenizer, Abort, an EPD Generate (prefill with ``encode_bootstrap_info``
and ``kv_bootstrap_info``, decode with the matching request, concurrently),
an aggregated Generate with pixels, a Generate the engine must refuse, and
the RPCs Iris does not implement. It prints ONE JSON object with everything
it received; the Rust test judges it. Every call has a deadline.
"""

import base64
import concurrent.futures
import hashlib
import json
import struct
import sys

from smg_env import (
    common_pb2,
    grpc,
    to_dict,
    tokenspeed_scheduler_pb2 as pb,
    tokenspeed_scheduler_pb2_grpc as pb_grpc,
)


def status_of(err):
    """The code name and message of a failed call."""
    return {"code": err.code().name, "details": err.details()}


def collect(stream):
    """Every response of a server stream, or the status it failed with."""
    responses = []
    try:
        for response in stream:
            responses.append(to_dict(response, defaults=True))
        return {"responses": responses, "error": None}
    except grpc.RpcError as err:
        return {"responses": responses, "error": status_of(err)}


def tensor_inline(shape, dtype, data):
    return pb.TensorData(shape=shape, dtype=dtype, inline=data)


def image_item(cfg, pixels):
    """One image the way a gateway sends it; ``pixels`` may be None."""
    grid = cfg["grid_thw"]
    item = pb.MultimodalItem(
        modality=common_pb2.IMAGE,
        content_hash=base64.b64decode(cfg["content_hash_b64"]),
        placeholders=[
            pb.PlaceholderRange(
                offset=cfg["placeholder"]["offset"],
                length=cfg["placeholder"]["length"],
            )
        ],
        placeholder_token_id=cfg["placeholder_token_id"],
    )
    item.model_specific_tensors["image_grid_thw"].CopyFrom(
        tensor_inline([1, len(grid)], "int64", struct.pack("<%dq" % len(grid), *grid))
    )
    if pixels is not None:
        # float32 patches: [patches, 4] for the test's 16-byte rows.
        item.encoder_input.CopyFrom(
            tensor_inline([len(pixels) // 16, 4], "float32", pixels)
        )
    return item


def generate_request(cfg, request_id, pixels):
    req = pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(
            input_ids=cfg["prompt"], original_text="<interop prompt>"
        ),
        sampling_params=pb.SamplingParams(
            temperature=0.0,
            max_new_tokens=cfg["max_new_tokens"],
            ignore_eos=True,
        ),
        stream=True,
    )
    req.mm_inputs.items.append(image_item(cfg, pixels))
    return req


def main():
    cfg = json.loads(sys.argv[1])
    timeout = cfg.get("timeout_s", 30)
    pixels = base64.b64decode(cfg["pixels_b64"])
    channels = {
        role: grpc.insecure_channel(cfg[role])
        for role in ("aggregated", "prefill", "decode")
    }
    stubs = {role: pb_grpc.TokenSpeedSchedulerStub(ch) for role, ch in channels.items()}
    for role, channel in channels.items():
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            sys.exit("the %s worker at %s did not accept a connection" % (role, cfg[role]))
    agg = stubs["aggregated"]
    out = {}

    out["health"] = {
        role: to_dict(stub.HealthCheck(pb.HealthCheckRequest(), timeout=timeout), True)
        for role, stub in stubs.items()
    }
    out["model_info"] = {
        role: to_dict(stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout), True)
        for role, stub in stubs.items()
    }
    out["server_info"] = {
        role: to_dict(stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout))
        for role, stub in stubs.items()
    }
    out["loads"] = to_dict(agg.GetLoads(pb.GetLoadsRequest(include=["core"]), timeout=timeout), True)

    data = bytearray()
    shas = []
    for chunk in agg.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=timeout):
        data.extend(chunk.data)
        shas.append(chunk.sha256)
    out["tokenizer"] = {
        "chunks": len(shas),
        "bytes": len(data),
        "sha256_last_chunk": shas[-1] if shas else None,
        "sha256_earlier_chunks": shas[:-1],
        "sha256_of_data": hashlib.sha256(bytes(data)).hexdigest(),
    }

    # EPD: the prefill gets the pixels AND the encoder's room; the room wins
    # (the embedding is collected from the encoder's data server). The decode
    # gets the same request without the encoder's room and without pixels.
    kv = pb.KvBootstrapInfo(
        bootstrap_host=cfg["prefill_data"]["host"],
        bootstrap_port=cfg["prefill_data"]["port"],
        bootstrap_room=cfg["kv_room"],
    )
    to_prefill = generate_request(cfg, "interop-epd", pixels)
    to_prefill.kv_bootstrap_info.CopyFrom(kv)
    to_prefill.data_parallel_rank = 0
    to_decode = pb.GenerateRequest()
    to_decode.CopyFrom(to_prefill)
    to_decode.mm_inputs.items[0].ClearField("encoder_input")
    to_prefill.encode_bootstrap_info.items.append(
        pb.EncodeItemBootstrapInfo(
            item_index=0,
            bootstrap_host=cfg["encoder_data"]["host"],
            bootstrap_port=cfg["encoder_data"]["port"],
            bootstrap_room=cfg["encode_room"],
        )
    )
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        decode = pool.submit(
            lambda: collect(stubs["decode"].Generate(to_decode, timeout=timeout))
        )
        prefill = pool.submit(
            lambda: collect(stubs["prefill"].Generate(to_prefill, timeout=timeout))
        )
        out["epd"] = {
            "prefill": prefill.result(timeout=timeout + 5),
            "decode": decode.result(timeout=timeout + 5),
        }

    out["aggregated"] = collect(
        agg.Generate(generate_request(cfg, "interop-agg", pixels), timeout=timeout)
    )

    # A KV room sent to an aggregated worker must be refused with a status.
    wrong = generate_request(cfg, "interop-wrong", pixels)
    wrong.kv_bootstrap_info.CopyFrom(kv)
    out["rejected"] = collect(agg.Generate(wrong, timeout=timeout))

    out["abort_unknown"] = to_dict(
        agg.Abort(pb.AbortRequest(request_id="interop-none", reason="test"), timeout=timeout),
        True,
    )

    unimplemented = {}
    calls = {
        "FlushCache": lambda: agg.FlushCache(common_pb2.FlushCacheRequest(), timeout=timeout),
        "StartProfile": lambda: agg.StartProfile(common_pb2.StartProfileRequest(), timeout=timeout),
        "StopProfile": lambda: agg.StopProfile(common_pb2.StopProfileRequest(), timeout=timeout),
        "SubscribeKvEvents": lambda: list(
            agg.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=timeout)
        ),
    }
    for name, call in calls.items():
        try:
            call()
            unimplemented[name] = {"code": "OK", "details": ""}
        except grpc.RpcError as err:
            unimplemented[name] = status_of(err)
    out["unimplemented"] = unimplemented

    for channel in channels.values():
        channel.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
