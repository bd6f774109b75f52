"""A vLLM or SGLang client built only from the published ``smg-grpc-proto`` stubs.

Used by ``crates/engine/tests/interop.rs`` to prove that ``iris-engine
--protocol vllm`` and ``--protocol sglang`` answer peers generated from the
published definitions. The test starts real engines (aggregated, prefill,
decode) of one protocol, then runs::

    python engine_client.py PROTOCOL CONFIG_JSON

The flow is the same for every protocol; only building a request and
reading PD parameters differ, in one small class per protocol
(``PROTOCOLS``). The script calls HealthCheck, GetModelInfo, GetServerInfo,
GetLoads, GetTokenizer, Abort, an aggregated streaming Generate with an
image (for vLLM also with the pixels in a ``/dev/shm`` file), a PD Generate (SGLang: both legs at once with the bootstrap room;
vLLM: prefill asked for a remote decode, then decode with what the prefill
answered), and a Generate the engine must refuse. It prints ONE JSON object
with everything it received; the Rust test judges it. Every call has a
deadline.
"""

import base64
import concurrent.futures
import hashlib
import json
import os
import struct
import sys

from smg_env import (
    common_pb2,
    grpc,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    to_dict,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
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


def grid_bytes(grid):
    return struct.pack("<%dq" % len(grid), *grid)


class Vllm:
    """vllm.grpc.engine.VllmEngine."""

    pb = vllm_engine_pb2
    stub = vllm_engine_pb2_grpc.VllmEngineStub

    @classmethod
    def request(cls, cfg, request_id, pixels):
        pb = cls.pb
        req = pb.GenerateRequest(
            request_id=request_id,
            tokenized=pb.TokenizedInput(input_ids=cfg["prompt"], original_text="<interop>"),
            sampling_params=pb.SamplingParams(
                max_tokens=cfg["max_new_tokens"], ignore_eos=True
            ),
            stream=True,
        )
        if pixels is not None:
            mm = req.mm_inputs
            mm.pixel_values.CopyFrom(
                pb.TensorData(shape=[len(pixels) // 4, 1], dtype="float32", inline=pixels)
            )
            grid = cfg["grid_thw"]
            mm.model_specific_tensors["image_grid_thw"].CopyFrom(
                pb.TensorData(shape=[1, len(grid)], dtype="int64", inline=grid_bytes(grid))
            )
            mm.im_token_id = cfg["placeholder_token_id"]
            mm.mm_placeholders.append(pb.PlaceholderRange(**cfg["placeholder"]))
            mm.mm_hashes.append(hashlib.sha256(pixels).hexdigest())
            mm.modality = common_pb2.IMAGE
        return req

    @classmethod
    def refused(cls, cfg):
        """A request naming a field the engine cannot honour."""
        req = cls.request(cfg, "interop-refused", None)
        req.sampling_params.prompt_logprobs = 1
        return req

    @classmethod
    def lanes(cls, cfg, agg, pixels, timeout):
        """The image again, its pixels in a /dev/shm file the engine reads
        and unlinks."""
        name = "iris-tensor-%d-interop" % os.getpid()
        path = os.path.join("/dev/shm", name)
        with open(path, "wb") as f:
            f.write(pixels)
        req = cls.request(cfg, "interop-shm", pixels)
        tensor = req.mm_inputs.pixel_values
        tensor.shm.CopyFrom(
            common_pb2.ShmHandle(name=name, offset=0, nbytes=len(pixels), owner_id="interop")
        )
        call = collect(agg.Generate(req, timeout=timeout))
        call["file_left"] = os.path.exists(path)
        return {"shm": call}

    @classmethod
    def abort(cls, request_id):
        return cls.pb.AbortRequest(request_ids=[request_id])

    @classmethod
    def pd(cls, cfg, stubs, pixels, timeout):
        """Prefill first (asked for a remote decode), then decode with its answer."""
        to_prefill = cls.request(cfg, "interop-pd", pixels)
        to_prefill.kv_transfer_params_json = json.dumps({"do_remote_decode": True})
        prefill = collect(stubs["prefill"].Generate(to_prefill, timeout=timeout))
        complete = prefill["responses"][-1]["complete"] if prefill["responses"] else {}
        to_decode = cls.request(cfg, "interop-pd", None)
        to_decode.kv_transfer_params_json = complete.get("kv_transfer_params_json", "")
        decode = collect(stubs["decode"].Generate(to_decode, timeout=timeout))
        return {"prefill": prefill, "decode": decode}


class Sglang:
    """sglang.grpc.scheduler.SglangScheduler."""

    pb = sglang_scheduler_pb2
    stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub

    @classmethod
    def request(cls, cfg, request_id, pixels):
        pb = cls.pb
        req = pb.GenerateRequest(
            request_id=request_id,
            tokenized=pb.TokenizedInput(input_ids=cfg["prompt"], original_text="<interop>"),
            sampling_params=pb.SamplingParams(
                max_new_tokens=cfg["max_new_tokens"], ignore_eos=True
            ),
            logprob_start_len=-1,
            stream=True,
        )
        if pixels is not None:
            mm = req.mm_inputs
            mm.pixel_values.CopyFrom(
                pb.TensorData(data=pixels, shape=[len(pixels) // 4, 1], dtype="float32")
            )
            grid = cfg["grid_thw"]
            mm.model_specific_tensors["image_grid_thw"].CopyFrom(
                pb.TensorData(data=grid_bytes(grid), shape=[1, len(grid)], dtype="int64")
            )
            mm.im_token_id = cfg["placeholder_token_id"]
            mm.mm_placeholders.append(pb.PlaceholderRange(**cfg["placeholder"]))
            mm.modalities.append("image")
        return req

    @classmethod
    def refused(cls, cfg):
        req = cls.request(cfg, "interop-refused", None)
        req.mm_inputs.image_urls.append("http://example.invalid/a.png")
        return req

    @classmethod
    def lanes(cls, cfg, agg, pixels, timeout):
        """SGLang's TensorData carries its bytes inline only."""
        return {}

    @classmethod
    def abort(cls, request_id):
        return cls.pb.AbortRequest(request_id=request_id, reason="interop")

    @classmethod
    def pd(cls, cfg, stubs, pixels, timeout):
        """Both legs at once, with the prefill's bootstrap server and room."""
        params = cls.pb.DisaggregatedParams(
            bootstrap_host=cfg["prefill_data"]["host"],
            bootstrap_port=cfg["prefill_data"]["port"],
            bootstrap_room=cfg["kv_room"],
        )
        to_prefill = cls.request(cfg, "interop-pd", pixels)
        to_prefill.disaggregated_params.CopyFrom(params)
        to_decode = cls.request(cfg, "interop-pd", None)
        to_decode.disaggregated_params.CopyFrom(params)
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            decode = pool.submit(
                lambda: collect(stubs["decode"].Generate(to_decode, timeout=timeout))
            )
            prefill = pool.submit(
                lambda: collect(stubs["prefill"].Generate(to_prefill, timeout=timeout))
            )
            return {
                "prefill": prefill.result(timeout=timeout + 5),
                "decode": decode.result(timeout=timeout + 5),
            }


PROTOCOLS = {"vllm": Vllm, "sglang": Sglang}


def main():
    protocol = PROTOCOLS[sys.argv[1]]
    cfg = json.loads(sys.argv[2])
    pb = protocol.pb
    timeout = cfg.get("timeout_s", 30)
    pixels = base64.b64decode(cfg["pixels_b64"])
    channels = {
        role: grpc.insecure_channel(cfg[role]) for role in ("aggregated", "prefill", "decode")
    }
    stubs = {role: protocol.stub(ch) for role, ch in channels.items()}
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
    out["model_info"] = to_dict(agg.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout), True)
    out["server_info"] = {
        role: to_dict(stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout), True)
        for role, stub in stubs.items()
    }
    out["loads"] = to_dict(agg.GetLoads(pb.GetLoadsRequest(include=["core"]), timeout=timeout), True)
    data = bytearray()
    shas = []
    for chunk in agg.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=timeout):
        data.extend(chunk.data)
        shas.append(chunk.sha256)
    out["tokenizer"] = {
        "sha256_last_chunk": shas[-1] if shas else None,
        "sha256_of_data": hashlib.sha256(bytes(data)).hexdigest(),
    }
    out["aggregated"] = collect(
        agg.Generate(protocol.request(cfg, "interop-agg", pixels), timeout=timeout)
    )
    out["lanes"] = protocol.lanes(cfg, agg, pixels, timeout)
    out["pd"] = protocol.pd(cfg, stubs, pixels, timeout)
    out["refused"] = collect(agg.Generate(protocol.refused(cfg), timeout=timeout))
    out["abort_unknown"] = to_dict(agg.Abort(protocol.abort("interop-none"), timeout=timeout), True)
    for channel in channels.values():
        channel.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
