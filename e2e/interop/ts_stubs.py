"""Stand-ins for the heavy modules the published TokenSpeed servicer imports.

``smg_grpc_servicer/tokenspeed/encoder_servicer.py`` (PyPI
``smg-grpc-servicer`` 0.14.1) and the scheduler servicer it builds on import
``torch`` and the TokenSpeed engine package (``tokenspeed.runtime…``), which
need a GPU stack and are not on PyPI. ``install()`` puts small modules under
those names into ``sys.modules`` *before* the servicer is imported, so the
servicer's own receive code (``mm_shm.py``, ``mm_rdma.py``, its
``_tensor_from_proto``) runs unchanged on top of them.

What the servicer uses of ``torch`` (read from its code), and what this file
gives for it, backed by numpy:

- dtypes ``bfloat16``, ``float16``, ``float32``, ``uint8``, ``uint16``,
  ``int64``, ``uint32`` (bfloat16 is held as its raw 16-bit patterns: the
  servicer reads bfloat16 bytes as uint16 and views them as bfloat16);
- ``torch.from_numpy(array)``; ``Tensor.view(dtype)`` (reinterpreting the
  bytes, e.g. uint16 → bfloat16); ``Tensor.dtype``;
  ``Tensor.is_floating_point()``; ``Tensor.to(dtype)`` (float casts, with
  round-to-nearest-even into bfloat16); ``Tensor.clone()``;
- for the RDMA puller: ``torch.empty(n, dtype=uint8, pin_memory=True)``,
  ``Tensor.numpy()``, ``Tensor.data_ptr()``; ``torch.is_floating_point`` and
  ``Tensor.element_size()`` for the scheduler side's shm handles.

Anything else raises, so a servicer that starts to use more of torch fails
loudly here instead of computing something else.

Of the engine package it uses ``Modality`` and ``MultimodalDataItem``
(``runtime.multimodal.inputs``), ``ShmTensorHandle.publish`` (which moves a
feature to the scheduler process through /dev/shm; here it keeps the tensor),
``hash_feature``, ``EncodeRequest`` (``runtime.epd.encode_worker``) and
``get_local_ip_by_remote``. The engine itself is the ``StubEngine`` of
``ts_encoder.py``.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import sys
import types

import numpy as np


class dtype:  # noqa: N801 - torch's spelling
    """A torch dtype: its name, the numpy type holding its bytes, and
    whether it is a float."""

    def __init__(self, name: str, storage, floating: bool):
        self.name = name
        self.storage = np.dtype(storage)
        self.itemsize = self.storage.itemsize
        self.is_floating_point = floating

    def __repr__(self):
        return f"torch.{self.name}"

    def __reduce__(self):
        return (_dtype_by_name, (self.name,))


bfloat16 = dtype("bfloat16", np.uint16, True)
float16 = dtype("float16", np.float16, True)
float32 = dtype("float32", np.float32, True)
uint8 = dtype("uint8", np.uint8, False)
int64 = dtype("int64", np.int64, False)
uint32 = dtype("uint32", np.uint32, False)
uint16 = dtype("uint16", np.uint16, False)
_DTYPES = {d.name: d for d in (bfloat16, float16, float32, uint8, uint16, int64, uint32)}
_BY_STORAGE = {np.dtype(np.float16): float16, np.dtype(np.float32): float32,
               np.dtype(np.uint8): uint8, np.dtype(np.uint16): uint16,
               np.dtype(np.int64): int64, np.dtype(np.uint32): uint32}


def _dtype_by_name(name: str) -> dtype:
    return _DTYPES[name]


def _bf16_from_f32(values: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bit patterns, rounding to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))
    return (rounded >> 16).astype(np.uint16)


def _f32_from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Tensor:
    """A numpy array and the torch dtype its bytes are read as."""

    def __init__(self, array: np.ndarray, of: dtype):
        if array.dtype != of.storage:
            raise TypeError(f"stub tensor: {array.dtype} cannot hold {of}")
        self._array = array
        self.dtype = of

    @property
    def shape(self):
        return tuple(self._array.shape)

    def view(self, target):
        if not isinstance(target, dtype) or target.itemsize != self.dtype.itemsize:
            raise NotImplementedError(f"stub tensor: view({target!r}) of {self.dtype}")
        return Tensor(self._array.view(target.storage), target)

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def to(self, target):
        if target is self.dtype:
            return self
        if not (isinstance(target, dtype) and target.is_floating_point
                and self.dtype.is_floating_point):
            raise NotImplementedError(f"stub tensor: {self.dtype}.to({target!r})")
        wide = (_f32_from_bf16(self._array) if self.dtype is bfloat16
                else self._array.astype(np.float32))
        if target is bfloat16:
            return Tensor(_bf16_from_f32(wide), bfloat16)
        return Tensor(wide.astype(target.storage), target)

    def clone(self):
        return Tensor(self._array.copy(), self.dtype)

    def numpy(self) -> np.ndarray:
        return self._array

    def data_ptr(self) -> int:
        return self._array.ctypes.data

    def element_size(self) -> int:
        return self.dtype.itemsize

    def tobytes(self) -> bytes:
        """The little-endian bytes (for the harness, not a torch call)."""
        return np.ascontiguousarray(self._array).tobytes()


def from_numpy(array: np.ndarray) -> Tensor:
    of = _BY_STORAGE.get(array.dtype)
    if of is None:
        raise NotImplementedError(f"stub torch.from_numpy: {array.dtype}")
    return Tensor(array, of)


def empty(*size, dtype=float32, pin_memory=False):  # noqa: A002 - torch's keyword
    del pin_memory  # host memory either way here
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], tuple) else size
    return Tensor(np.zeros(shape, dtype=dtype.storage), dtype)


def is_floating_point(tensor: Tensor) -> bool:
    return tensor.is_floating_point()


# --- the engine package -------------------------------------------------------


class Modality(enum.Enum):
    IMAGE = 1
    AUDIO = 2
    VIDEO = 3


@dataclasses.dataclass
class MultimodalDataItem:
    modality: Modality
    hash: int | None = None
    feature: object = None
    model_specific_data: dict = dataclasses.field(default_factory=dict)
    offsets: list = dataclasses.field(default_factory=list)
    pad_value: int | None = None

    def set_pad_value(self):
        self.pad_value = (self.hash or 0) % (1 << 30)


@dataclasses.dataclass
class MultimodalInputs:
    mm_items: list


@dataclasses.dataclass
class ShmTensorHandle:
    """TokenSpeed moves a feature to its scheduler process through /dev/shm
    with ``publish``; the stub keeps the tensor itself (one process)."""

    shm_name: str = ""
    shape: tuple = ()
    dtype: object = None
    tensor: Tensor | None = None

    @classmethod
    def publish(cls, feature: Tensor) -> ShmTensorHandle:
        return cls(shm_name="stub", shape=feature.shape, dtype=feature.dtype, tensor=feature)


def hash_feature(feature: Tensor) -> int:
    digest = hashlib.sha256(feature.tobytes()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclasses.dataclass
class EncodeRequest:
    request_id: str
    bootstrap_host: str
    bootstrap_port: int
    bootstrap_room: int
    items: list


def get_local_ip_by_remote() -> str:
    return "127.0.0.1"


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__path__ = []  # a package, so submodules resolve
    return module


def install() -> None:
    """Registers the stand-ins; call before importing the servicer."""
    torch = _module("torch", Tensor=Tensor, dtype=dtype, from_numpy=from_numpy, empty=empty,
                    is_floating_point=is_floating_point, **_DTYPES)
    modules = {
        "torch": torch,
        "tokenspeed": _module("tokenspeed", __version__="stub"),
        "tokenspeed.runtime": _module("tokenspeed.runtime"),
        "tokenspeed.runtime.engine": _module("tokenspeed.runtime.engine"),
        "tokenspeed.runtime.engine.async_llm": _module("tokenspeed.runtime.engine.async_llm"),
        "tokenspeed.runtime.engine.io_struct": _module("tokenspeed.runtime.engine.io_struct"),
        "tokenspeed.runtime.utils": _module("tokenspeed.runtime.utils"),
        "tokenspeed.runtime.utils.server_args": _module("tokenspeed.runtime.utils.server_args"),
        "tokenspeed.runtime.utils.network": _module(
            "tokenspeed.runtime.utils.network", get_local_ip_by_remote=get_local_ip_by_remote),
        "tokenspeed.runtime.multimodal": _module("tokenspeed.runtime.multimodal"),
        "tokenspeed.runtime.multimodal.inputs": _module(
            "tokenspeed.runtime.multimodal.inputs", Modality=Modality,
            MultimodalDataItem=MultimodalDataItem, MultimodalInputs=MultimodalInputs),
        "tokenspeed.runtime.multimodal.shm_transport": _module(
            "tokenspeed.runtime.multimodal.shm_transport", ShmTensorHandle=ShmTensorHandle),
        "tokenspeed.runtime.multimodal.hash": _module(
            "tokenspeed.runtime.multimodal.hash", hash_feature=hash_feature),
        "tokenspeed.runtime.epd": _module("tokenspeed.runtime.epd"),
        "tokenspeed.runtime.epd.encode_worker": _module(
            "tokenspeed.runtime.epd.encode_worker", EncodeRequest=EncodeRequest),
    }
    for name, module in modules.items():
        if name in sys.modules and sys.modules[name] is not module:
            raise RuntimeError(f"{name} is already imported: the stubs must come first")
        sys.modules[name] = module
