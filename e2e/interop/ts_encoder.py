"""The published TokenSpeed encode servicer, on a stub engine, as an Iris
encode worker (e2e/tests/test_ts_encoder.py).

Runs ``TokenSpeedEncoderServicer`` from PyPI ``smg-grpc-servicer`` 0.14.1
with its own receive code (``mm_shm.py`` for inline and shm payloads,
``mm_rdma.py``'s NIXL puller for remote ones, on when the environment has
``SMG_MM_PIXEL_RDMA=1``), and the published scheduler servicer as its
discovery surface (HealthCheck, GetModelInfo, GetServerInfo with
``scheduler_info.shm_namespace_id``; Generate refused, as TokenSpeed's
encode-role server does). torch and the TokenSpeed engine package are the
stand-ins of ``ts_stubs.py``. Run as::

    python ts_encoder.py --log RECORD.jsonl [--host 127.0.0.1] [--hidden 16]

It prints ``ts-encoder listening grpc=HOST:PORT data=HOST:PORT`` once both
servers are bound. The stub engine takes what the servicer hands to the
scheduler (the pickled ``EncodeRequest``), keeps each item's decoded tensor
and appends one JSON line per item to RECORD: the room, the payload lane
the Encode carried (``inline``, ``shm`` or ``remote``), the tensor's dtype
and shape as decoded, the SHA-256 of its bytes and the number of
placeholder tokens. Its embedding, ``[tokens, hidden]`` float32 derived from
SHA-256 of the pixel bytes, is served to prefill workers by Iris's data
service (``iris.data.v1.IrisData/FetchEmbedding``, proto/iris_data.proto)
on the data port, so ``iris-engine`` prefill workers run the request to
its end. The process stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import pickle
import signal
import sys
import threading
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ts_stubs  # noqa: E402

ts_stubs.install()

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402
from smg_grpc_proto.generated import (  # noqa: E402
    tokenspeed_encoder_pb2_grpc,
    tokenspeed_scheduler_pb2,
    tokenspeed_scheduler_pb2_grpc,
)
from smg_grpc_servicer.tokenspeed.encoder_servicer import TokenSpeedEncoderServicer  # noqa: E402
from smg_grpc_servicer.tokenspeed.servicer import TokenSpeedSchedulerServicer  # noqa: E402

# The published server's message bound (256 MiB) for both servers.
MAX_MESSAGE = 256 * 1024 * 1024
GRPC_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE)]
# How long a FetchEmbedding waits for its room when the request says 0.
DEFAULT_WAIT_S = 10.0


def iris_data_messages():
    """``FetchRequest`` and ``FetchEmbeddingResponse`` of proto/iris_data.proto,
    built on the published ``TensorData`` (no generated module needed)."""
    pool = descriptor_pool.Default()
    name = "iris_data_harness.proto"
    try:
        pool.FindFileByName(name)
    except KeyError:
        f = descriptor_pb2.FileDescriptorProto(
            name=name, package="iris.data.v1", syntax="proto3",
            dependency=[tokenspeed_scheduler_pb2.DESCRIPTOR.name])
        F = descriptor_pb2.FieldDescriptorProto
        req = f.message_type.add(name="FetchRequest")
        req.field.add(name="room", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
        req.field.add(name="wait_ms", number=2, type=F.TYPE_UINT32, label=F.LABEL_OPTIONAL)
        req.field.add(name="requester", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        resp = f.message_type.add(name="FetchEmbeddingResponse")
        resp.field.add(name="embedding", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                       type_name=".tokenspeed.grpc.scheduler.TensorData")
        resp.field.add(name="content_hash", number=2, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL)
        resp.field.add(name="num_tokens", number=3, type=F.TYPE_UINT32, label=F.LABEL_OPTIONAL)
        pool.Add(f)
    get = lambda n: message_factory.GetMessageClass(pool.FindMessageTypeByName(n))  # noqa: E731
    return get("iris.data.v1.FetchRequest"), get("iris.data.v1.FetchEmbeddingResponse")


def embedding_of(pixels: bytes, tokens: int, hidden: int) -> bytes:
    """``[tokens, hidden]`` float32 in [-1, 1), a function of the pixel bytes."""
    seed = hashlib.sha256(pixels).digest()
    need = tokens * hidden * 4
    stream = b"".join(hashlib.sha256(seed + i.to_bytes(4, "little")).digest()
                      for i in range((need + 31) // 32))
    words = np.frombuffer(stream[:need], dtype="<u4")
    return ((words >> 8).astype(np.float32) / (1 << 23) - 1.0).astype("<f4").tobytes()


class Rooms:
    """Embeddings by room, for the data service; thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ready: dict[int, tuple[bytes, int, bytes]] = {}
        self._waiters: dict[int, list] = {}

    def put(self, room: int, entry):
        with self._lock:
            self._ready[room] = entry
            waiters = self._waiters.pop(room, [])
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    async def take(self, room: int, wait_s: float):
        loop, event = asyncio.get_running_loop(), asyncio.Event()
        with self._lock:
            if room in self._ready:
                return self._ready.pop(room)
            self._waiters.setdefault(room, []).append((loop, event))
        try:
            await asyncio.wait_for(event.wait(), wait_s)
        except asyncio.TimeoutError:
            return None
        with self._lock:
            return self._ready.pop(room, None)


class StubEngine:
    """What the servicer drives: ``AsyncLLM``'s attributes it reads, and the
    scheduler input channel its Encode sends the pickled request on."""

    def __init__(self, record: Path, hidden: int, rooms: Rooms):
        # A bfloat16 vision model: floats are cast to it on arrival (the
        # servicer's `cast_to`), a no-op for the gateway's default bfloat16.
        hf_config = types.SimpleNamespace(model_type="qwen2_vl",
                                          architectures=["Qwen2VLForConditionalGeneration"])
        self.model_config = types.SimpleNamespace(dtype=ts_stubs.bfloat16, hf_config=hf_config,
                                                  is_multimodal=True, vocab_size=1024,
                                                  context_len=4096)
        self.gracefully_exit = False
        self.rid_to_state: dict = {}
        self.context_len = 4096
        self.max_req_input_len = 4096
        self.last_receive_tstamp = 0.0
        self.engine_core_client = types.SimpleNamespace(
            send_to_scheduler=types.SimpleNamespace(send=self._receive))
        self.lanes: dict[int, str] = {}
        self._record = open(record, "a", encoding="utf-8")
        self._record_lock = threading.Lock()
        self._hidden = hidden
        self._rooms = rooms

    def auto_create_handle_loop(self):
        return None

    async def _receive(self, payload: bytes):
        request = pickle.loads(payload)
        room = int(request.bootstrap_room)
        for item in request.items:
            feature = item.feature
            tensor = feature.tensor if isinstance(feature, ts_stubs.ShmTensorHandle) else feature
            pixels = tensor.tobytes()
            tokens = sum(end - start + 1 for start, end in item.offsets)
            line = {"room": room, "lane": self.lanes.pop(room, "unknown"),
                    "dtype": tensor.dtype.name, "shape": list(tensor.shape),
                    "nbytes": len(pixels), "sha256": hashlib.sha256(pixels).hexdigest(),
                    "tokens": tokens}
            with self._record_lock:
                self._record.write(json.dumps(line) + "\n")
                self._record.flush()
            embedding = embedding_of(pixels, tokens, self._hidden)
            self._rooms.put(room, (embedding, tokens, b""))


class RecordingEncoder(TokenSpeedEncoderServicer):
    """The published servicer; notes which payload lane each room came by."""

    async def Encode(self, request, context):
        if request.items and request.mm_inputs.items:
            lane = request.mm_inputs.items[0].encoder_input.WhichOneof("payload") or "none"
            self.async_llm.lanes[int(request.items[0].bootstrap_room)] = lane
        return await super().Encode(request, context)


class Discovery(TokenSpeedSchedulerServicer):
    """The published scheduler servicer as an encode worker's discovery
    surface (what TokenSpeed's encode-role server mounts)."""

    async def Generate(self, request, context):
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                            "Generate is unavailable on TokenSpeed encode workers")
        yield tokenspeed_scheduler_pb2.GenerateResponse()


def data_handler(rooms: Rooms, fetch_request, fetch_response):
    async def fetch_embedding(request, context):
        wait_s = request.wait_ms / 1000 if request.wait_ms else DEFAULT_WAIT_S
        entry = await rooms.take(request.room, wait_s)
        if entry is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"room {request.room} not encoded")
        embedding, tokens, content_hash = entry
        tensor = tokenspeed_scheduler_pb2.TensorData(
            shape=[tokens, len(embedding) // 4 // max(tokens, 1)], dtype="float32",
            inline=embedding)
        return fetch_response(embedding=tensor, content_hash=content_hash, num_tokens=tokens)

    method = grpc.unary_unary_rpc_method_handler(
        fetch_embedding, request_deserializer=fetch_request.FromString,
        response_serializer=fetch_response.SerializeToString)
    return grpc.method_handlers_generic_handler("iris.data.v1.IrisData",
                                                {"FetchEmbedding": method})


async def serve(args) -> None:
    rooms = Rooms()
    engine = StubEngine(Path(args.log), args.hidden, rooms)
    server = grpc.aio.server(options=GRPC_OPTIONS)
    port = server.add_insecure_port(f"{args.host}:0")
    server_args = types.SimpleNamespace(
        host=args.host, port=port, model="ts-encoder-stub", tokenizer="ts-encoder-stub",
        disaggregation_mode="encode", disaggregation_bootstrap_port=0)
    encoder = RecordingEncoder(engine, server_args, {})
    tokenspeed_encoder_pb2_grpc.add_TokenSpeedEncoderServicer_to_server(encoder, server)
    discovery = Discovery(engine, server_args, {})
    tokenspeed_scheduler_pb2_grpc.add_TokenSpeedSchedulerServicer_to_server(discovery, server)

    data = grpc.aio.server(options=GRPC_OPTIONS)
    data.add_generic_rpc_handlers((data_handler(rooms, *iris_data_messages()),))
    data_port = data.add_insecure_port(f"{args.host}:0")
    await server.start()
    await data.start()
    print(f"ts-encoder listening grpc={args.host}:{port} data={args.host}:{data_port}",
          flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await data.stop(1)
    await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", required=True, help="JSON lines, one per encoded item")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--hidden", type=int, default=16, help="embedding width")
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("TS_ENCODER_LOG", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
