#!/usr/bin/env python3
"""Decode + preprocess time of one image through each family's Hugging Face
image processors, the slow (PIL) class and the fast (torchvision) one where
transformers 4.57.1 has it, for e2e/bench/families.sh.

    python3 scripts/vision/families_speed.py IMAGE [ITERS]

The families and their configs are scripts/vision/reference.py's (the
parity reference). Each call opens the image from its bytes, converts it
to RGB and runs the processor with `return_tensors="pt"` and the model
processor's own call arguments (`call_kwargs`), torch on one thread; the time is the process's CPU time per call (median and minimum,
after one warm-up). Prints one tab-separated line per processor:
family, class, median ms, minimum ms; the first, `decode PIL`, is the
decode alone (`Image.open(...).convert("RGB")`), which every call includes.
"""

import io
import sys
import time
from pathlib import Path

import torch
import transformers
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference  # noqa: E402  (the families' configs and classes)


def twin_class(cls):
    """The other class of `cls`'s family: slow for a fast one and back."""
    name = cls.__name__
    twin = name[: -len("Fast")] if name.endswith("Fast") else name + "Fast"
    return getattr(transformers, twin, None)


def cpu_ms(iters, call):
    call()
    times = []
    for _ in range(iters):
        start = time.process_time()
        call()
        times.append((time.process_time() - start) * 1e3)
    times.sort()
    return times[len(times) // 2], times[0]


def call_kwargs(family):
    """What the model's processor passes its image processor, as the parity
    reference calls it: InternVL's processor turns `crop_to_patches` on (the
    image processor's config leaves it off), Gemma 3's sets its pan-and-scan
    parameters."""
    if family in reference.INTERNVL:
        return dict(reference.INTERNVL_CALL)
    if family == "gemma3":
        return dict(reference.GEMMA3_CALL)
    return {}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    data = Path(sys.argv[1]).read_bytes()
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    torch.set_num_threads(1)
    median, least = cpu_ms(iters, lambda: Image.open(io.BytesIO(data)).convert("RGB"))
    print(f"decode\tPIL\t{median:.2f}\t{least:.2f}", flush=True)
    for family in reference.PROCESSORS:
        shipped = reference.processor_for(family)
        processors = [shipped]
        twin = twin_class(type(shipped))
        if twin is not None and family != "internvl_slow":
            config = {k: v for k, v in reference.PROCESSORS[family].items() if k != "image_processor_type"}
            processors.append(twin(**config))
        kwargs = call_kwargs(family)
        for processor in processors:
            def call(processor=processor):
                image = Image.open(io.BytesIO(data)).convert("RGB")
                processor(images=[image], return_tensors="pt", **kwargs)
            median, least = cpu_ms(iters, call)
            print(f"{family}\t{type(processor).__name__}\t{median:.2f}\t{least:.2f}", flush=True)


if __name__ == "__main__":
    main()
