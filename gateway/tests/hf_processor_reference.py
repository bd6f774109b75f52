#!/usr/bin/env python3
"""Reference prompts for gateway/tests/mm_prompts.rs: the token ids Hugging
Face's own processor classes (transformers 4.57.1) give for a chat with
images, `processor(text=processor.apply_chat_template(...), images=...)`.

Reads one JSON object on stdin:

    {"model_dir": DIR,            # tokenizer.json, chat_template.jinja,
                                  # preprocessor_config.json
     "processor_class": "Gemma3Processor",
     "processor_kwargs": {...},   # the model processor's (processor_config.json)
     "tokenizer_class": "PreTrainedTokenizerFast",  # or the class the processor requires
     "tokenizer": {...},          # its keyword arguments
     "call_kwargs": {...},        # per-call processor arguments
     "nest_images": false,        # optional: each chat's images as [[...]],
                                  # one prompt's (OneVision's multi-image rule)
     "tensors": false,            # optional: also every tensor the processor
                                  # returns, its image processor the class
                                  # preprocessor_config.json names
     "conversations": [{"messages": [...], "images": [PNG path, ...]}]}

and writes, per conversation, {"text": rendered prompt, "input_ids": [...]}
(with "tensors": {name: {"shape", "dtype", "base64"}} when asked) as a
JSON list on stdout. Exits 3 with an install hint when transformers
(or Pillow) is missing or not the pinned version.
"""

import json
import sys
from pathlib import Path

PINNED = "4.57.1"
HINT = (
    "mm_prompts.rs needs transformers=={0} with Pillow in the interpreter "
    "$IRIS_HF_PYTHON: run `$IRIS_HF_PYTHON -m pip install -r .ci/hf-reference/requirements.txt` "
    "(.ci/run makes a cached venv with it)".format(PINNED)
)

try:
    import numpy as np
    import transformers
    from PIL import Image
except ImportError as error:  # the test fails, never skips
    print(f"{HINT} ({error})", file=sys.stderr)
    sys.exit(3)
if transformers.__version__ != PINNED:
    print(f"{HINT} (found transformers {transformers.__version__})", file=sys.stderr)
    sys.exit(3)


def image_processor(model_dir, as_configured=False):
    """The image processor class preprocessor_config.json names, with its values.
    Unless `as_configured`, a fast (torchvision) class that has a slow twin
    is replaced by the twin: the prompt depends on the tile counts alone,
    which both compute with the same function (InternVL's
    `get_optimal_tiled_canvas`), and the slow one needs no torch."""
    config = json.loads((model_dir / "preprocessor_config.json").read_text())
    name = config.pop("image_processor_type")
    slow_twin = name.endswith("Fast") and hasattr(transformers, name[: -len("Fast")])
    if slow_twin and not as_configured:
        name = name[: -len("Fast")]
    cls = getattr(transformers, name)
    config.pop("processor_class", None)
    return cls(**config)


def images_only(cls):
    """`cls` accepting no video processor: building one needs torchvision,
    and a call with images only never uses it."""

    class ImagesOnly(cls):
        def check_argument_for_proper_class(self, name, argument):
            if name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(name, argument)

    return ImagesOnly


def with_defaults(cls, kwargs):
    """`kwargs` with the processor's other parts that an image call never
    uses: no video processor (`images_only`), and the audio feature
    extractor's defaults (Phi-4-multimodal's processor requires one)."""
    if "video_processor" in cls.attributes:
        cls = images_only(cls)
        kwargs["video_processor"] = None
    if "audio_processor" in cls.attributes:
        kwargs["audio_processor"] = getattr(transformers, cls.audio_processor_class)()
    return cls, kwargs


def processor(request):
    model_dir = Path(request["model_dir"])
    tokenizer_class = getattr(transformers, request["tokenizer_class"])
    tokenizer = tokenizer_class(
        tokenizer_file=str(model_dir / "tokenizer.json"), **request["tokenizer"]
    )
    cls = getattr(transformers, request["processor_class"])
    cls, kwargs = with_defaults(cls, dict(request["processor_kwargs"]))
    return cls(
        image_processor=image_processor(model_dir, request.get("tensors", False)),
        tokenizer=tokenizer,
        chat_template=(model_dir / "chat_template.jinja").read_text(),
        **kwargs,
    )


# What the processor returns for the text, not the images.
TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def tensor_record(value):
    """`value` (a tensor, array or nested list) as shape, dtype and its
    little-endian bytes in base64."""
    import base64

    if hasattr(value, "numpy"):
        # bfloat16 (Llama 4's pixels) has no numpy type: widened, exactly.
        value = (value.float() if str(value.dtype) == "torch.bfloat16" else value).numpy()
    array = np.ascontiguousarray(np.asarray(value))
    return {"shape": list(array.shape), "dtype": str(array.dtype),
            "base64": base64.b64encode(array.astype(array.dtype.newbyteorder("<")).tobytes())
            .decode()}


def main():
    request = json.load(sys.stdin)
    proc = processor(request)
    out = []
    for conversation in request["conversations"]:
        text = proc.apply_chat_template(
            conversation["messages"], tokenize=False, add_generation_prompt=True
        )
        images = [Image.open(path) for path in conversation["images"]]
        if request.get("nest_images") and images:
            images = [images]
        encoded = proc(text=text, images=images or None, **request["call_kwargs"])
        ids = [int(i) for i in np.asarray(encoded["input_ids"]).reshape(-1)]
        answer = {"text": text, "input_ids": ids}
        if request.get("tensors"):
            answer["tensors"] = {key: tensor_record(value) for key, value in encoded.items()
                                 if key not in TEXT_KEYS}
        out.append(answer)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
