"""A vLLM or SGLang worker built only from the published ``smg-grpc-proto``
stubs, which records what each Generate request carries as the published
code reads it.

Used by ``e2e/tests/test_backend_interop.py`` to prove that what Iris's
gateway sends a vLLM or SGLang worker decodes, with the published stubs
and the published servicer helpers that run without an engine
(``smg_grpc_servicer.mm_shm.tensor_payload_bytes`` for the pixel
payload, ``smg_grpc_servicer.vllm.mm_keys`` for vLLM's batches and media
hashes, and those helpers in the steps of the servicer's
``_build_preprocessed_mm_inputs`` to cut each batch into its items:
``servicer_items``), to what the gateway meant. Run as::

    python backend_recorder.py {vllm|sglang} RECORD [--tensors]

With ``--tensors`` an SGLang record also holds every tensor of
``mm_inputs`` whole (shape, dtype, bytes in base64). It serves the protocol's service on 127.0.0.1 at a free port, prints
``listening PORT`` once bound, and appends one JSON line per Generate to
RECORD. Every Generate is answered with the same canned tokens
(``ANSWER``), one stream chunk and the completion when streaming.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import hashlib
import json
import sys
import threading

from smg_env import grpc, to_dict
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sg
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sg_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as vl
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as vl_grpc
from smg_grpc_servicer.mm_shm import tensor_payload_bytes
from smg_grpc_servicer.vllm import mm_keys

# The tokens every answer carries (ids the tiny model's tokenizer decodes).
ANSWER = [72, 101, 108, 108, 111]


def int64_values(data: bytes) -> list:
    return [int.from_bytes(data[i:i + 8], "little", signed=True) for i in range(0, len(data), 8)]


def tensor_record(raw: bytes, shape, dtype: str) -> dict:
    return {"sha256": hashlib.sha256(raw).hexdigest(), "shape": list(shape), "dtype": dtype,
            "bytes": len(raw)}


# Bytes per element of the wire dtypes.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "uint32": 4, "uint8": 1}


def row_slices(raw: bytes, shape: list, dtype: str, rows: list) -> list:
    """``raw`` (row-major, ``shape``) cut along dimension 0 into runs of
    ``rows`` rows each, as ``(bytes, shape)``."""
    row = DTYPE_BYTES[dtype]
    for d in shape[1:]:
        row *= d
    out, at = [], 0
    for n in rows:
        out.append((raw[at * row:(at + n) * row], [n, *shape[1:]]))
        at += n
    return out


def servicer_items(request) -> dict:
    """The items every batch splits into, read by the rules of the published
    servicer's ``VllmEngineServicer._build_preprocessed_mm_inputs`` (vLLM
    itself, which it hands them to, cannot be installed without a GPU
    build of torch, so this mirrors it step by step with the published
    ``mm_keys`` helpers): tensors keyed by ``modality_key`` (video pixels
    as ``pixel_values_videos``), the primary one under
    ``primary_encoder_key``; a key carried by two batches is refused; a key
    in ``batched_keys`` is cut along dimension 0, one row per placeholder
    range; a key in ``flat_keys`` by the flattened sizes tensor it names;
    any other key is shared by every item. Returns ``{"error": ...}`` where
    the servicer raises, else per modality its fields and per item each
    tensor's digest and shape."""
    seen, modalities = set(), {}
    for batch in mm_keys.mm_batches(request):
        modality = mm_keys.modality_name(batch)
        is_video = modality == "video"
        tensors = {}
        if batch.HasField("pixel_values"):
            primary = mm_keys.modality_key(mm_keys.primary_encoder_key(batch), is_video)
            tensors[primary] = batch.pixel_values
        for key, td in batch.model_specific_tensors.items():
            tensors[mm_keys.modality_key(key, is_video)] = td
        shared = tensors.keys() & seen
        if shared:
            return {"error": f"multimodal batches carry the same tensor keys {sorted(shared)}"}
        seen |= tensors.keys()
        count = len(batch.mm_placeholders)
        batched = {mm_keys.modality_key(k, is_video) for k in batch.batched_keys}
        flat = {mm_keys.modality_key(k, is_video): mm_keys.modality_key(v, is_video)
                for k, v in batch.flat_keys.items()}
        fields, items = {}, [{} for _ in range(count)]
        for key, td in tensors.items():
            raw, shape = tensor_payload_bytes(td), list(td.shape)
            if key in batched:
                fields[key] = "batched"
                rows = [1] * shape[0]
            elif key in flat:
                fields[key] = f"flat:{flat[key]}"
                if flat[key] not in tensors:
                    return {"error": f"{key}: sizes tensor {flat[key]} missing"}
                rows = int64_values(tensor_payload_bytes(tensors[flat[key]]))
                if sum(rows) != shape[0]:
                    return {"error": f"{key}: sizes {rows} do not add up to {shape[0]}"}
            else:
                fields[key] = "shared"
                continue
            if len(rows) != count:
                return {"error": f"{key}: {len(rows)} items for {count} placeholder ranges"}
            for item, (data, item_shape) in zip(items, row_slices(raw, shape, td.dtype, rows)):
                if fields[key] == "batched":
                    item_shape = item_shape[1:]
                item[key] = {"sha256": hashlib.sha256(data).hexdigest(), "shape": item_shape,
                             "values": int64_values(data) if td.dtype == "int64" else None}
        modalities[modality] = {"fields": fields, "items": items,
                                "hashes": list(batch.mm_hashes),
                                "keep_on_cpu": sorted(batch.keep_on_cpu_keys)}
    return {"error": None, "modalities": modalities}


def vllm_record(request) -> dict:
    """What the published vLLM servicer's engine-free helpers read."""
    batches = mm_keys.mm_batches(request)
    images = []
    for batch in batches:
        pixels = batch.pixel_values
        grid = batch.model_specific_tensors.get("image_grid_thw")
        images.append({
            "pixels": tensor_record(tensor_payload_bytes(pixels), pixels.shape, pixels.dtype),
            "lane": pixels.WhichOneof("payload"),
            "grid": int64_values(tensor_payload_bytes(grid)) if grid is not None else None,
            "placeholders": [[p.offset, p.length] for p in batch.mm_placeholders],
            "im_token_id": batch.im_token_id if batch.HasField("im_token_id") else None,
            "modality": mm_keys.modality_name(batch),
            "encoder_key": mm_keys.primary_encoder_key(batch),
        })
    return {
        "input_ids": list(request.tokenized.input_ids),
        "sampling": to_dict(request.sampling_params),
        "stream": request.stream,
        "images": images,
        "mm_hashes": mm_keys.mm_identity_hashes(batches),
        "missing_pixels": len(mm_keys.batches_missing_pixels(batches)),
        "media_twice": mm_keys.describes_media_twice(request),
        "servicer": servicer_items(request),
    }


def sglang_tensors(mm) -> dict:
    """The batch's tensors as the published servicer's ``_parse_mm_inputs``
    gives them to the model: ``pixel_values`` (the item's ``feature``) and
    each model-specific tensor (its attributes), whole."""
    tensors = {"pixel_values": mm.pixel_values, **mm.model_specific_tensors}
    return {key: {"shape": list(td.shape), "dtype": td.dtype,
                  "base64": base64.b64encode(bytes(td.data)).decode()}
            for key, td in tensors.items()}


def sglang_record(request, full: bool = False) -> dict:
    """What the published SGLang servicer reads (``_parse_mm_inputs``:
    ``pixel_values``, ``model_specific_tensors``, ``mm_placeholders``,
    ``im_token_id``); every tensor whole when ``full``."""
    images = []
    if request.HasField("mm_inputs") and request.mm_inputs.HasField("pixel_values"):
        mm = request.mm_inputs
        grid = mm.model_specific_tensors.get("image_grid_thw")
        images.append({
            "pixels": tensor_record(bytes(mm.pixel_values.data), mm.pixel_values.shape,
                                    mm.pixel_values.dtype),
            "grid": int64_values(bytes(grid.data)) if grid is not None else None,
            "placeholders": [[p.offset, p.length] for p in mm.mm_placeholders],
            "im_token_id": mm.im_token_id if mm.HasField("im_token_id") else None,
        })
        if full:
            images[-1]["tensors"] = sglang_tensors(mm)
    return {
        "input_ids": list(request.tokenized.input_ids),
        "sampling": to_dict(request.sampling_params),
        "stream": request.stream,
        "images": images,
    }


class Recorder:
    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()

    def write(self, record: dict):
        with self.lock, open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


class Vllm(vl_grpc.VllmEngineServicer):
    def __init__(self, recorder: Recorder):
        self.recorder = recorder

    def HealthCheck(self, request, context):
        return vl.HealthCheckResponse(healthy=True, message="recorder")

    def GetServerInfo(self, request, context):
        return vl.GetServerInfoResponse(server_type="vllm-grpc", uptime_seconds=1.0)

    def Abort(self, request, context):
        return vl.AbortResponse()

    def Generate(self, request, context):
        self.recorder.write({"protocol": "vllm", **vllm_record(request)})
        prompt = len(request.tokenized.input_ids)
        if request.stream:
            yield vl.GenerateResponse(chunk=vl.GenerateStreamChunk(
                token_ids=ANSWER, prompt_tokens=prompt, completion_tokens=len(ANSWER)))
        yield vl.GenerateResponse(complete=vl.GenerateComplete(
            output_ids=ANSWER, finish_reason="length", prompt_tokens=prompt,
            completion_tokens=len(ANSWER)))


class Sglang(sg_grpc.SglangSchedulerServicer):
    def __init__(self, recorder: Recorder, full: bool = False):
        self.recorder = recorder
        self.full = full

    def HealthCheck(self, request, context):
        return sg.HealthCheckResponse(healthy=True, message="recorder")

    def GetServerInfo(self, request, context):
        return sg.GetServerInfoResponse(server_type="sglang-grpc", uptime_seconds=1.0)

    def Abort(self, request, context):
        return sg.AbortResponse(success=True)

    def Generate(self, request, context):
        self.recorder.write({"protocol": "sglang", **sglang_record(request, self.full)})
        prompt = len(request.tokenized.input_ids)
        rid = request.request_id
        if request.stream:
            yield sg.GenerateResponse(request_id=rid, chunk=sg.GenerateStreamChunk(
                token_ids=ANSWER, prompt_tokens=prompt, completion_tokens=len(ANSWER)))
        yield sg.GenerateResponse(request_id=rid, complete=sg.GenerateComplete(
            output_ids=ANSWER, finish_reason="length", prompt_tokens=prompt,
            completion_tokens=len(ANSWER)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("protocol", choices=["vllm", "sglang"])
    parser.add_argument("record")
    parser.add_argument("--tensors", action="store_true",
                        help="record SGLang's multimodal tensors whole")
    args = parser.parse_args()
    recorder = Recorder(args.record)
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8),
                         options=[("grpc.max_receive_message_length", 256 << 20)])
    if args.protocol == "vllm":
        vl_grpc.add_VllmEngineServicer_to_server(Vllm(recorder), server)
    else:
        sg_grpc.add_SglangSchedulerServicer_to_server(Sglang(recorder, args.tensors), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening {port}", flush=True)
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
