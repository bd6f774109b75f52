#!/usr/bin/env python3
"""Reference outputs for iris-tower's parity tests.

Builds two tiny, seeded vision towers with Hugging Face `transformers`
(4.57.1, torch on the CPU, eager attention):

- Qwen2-VL  (`Qwen2VisionTransformerPretrainedModel`): LayerNorm, QuickGELU
  MLP, full attention;
- Qwen2.5-VL (`Qwen2_5_VisionTransformerPretrainedModel`): RMSNorm, gated
  SiLU MLP, windowed attention with one full-attention block;

preprocesses two real images with `Qwen2VLImageProcessor` (small
`max_pixels`, so the tensors stay small), runs both towers on the batch,
and writes into `crates/tower/tests/data/`:

- `inputs.safetensors`: `pixel_values` [patches, 1176] f32 and
  `image_grid_thw` [2, 3] i64 (shared by both towers);
- `<model_type>/config.json`: a model-level config with `vision_config`;
- `<model_type>/model.safetensors`: the tower's weights, f32, under
  `visual.` (Qwen2-VL) or `model.visual.` (Qwen2.5-VL, as newer
  transformers saves), so both prefixes are exercised;
- `<model_type>/expected.safetensors`: `embeddings` [tokens, out_hidden] f32.

Usage (needs torch, transformers==4.57.1, pillow; CI does not run this):

    python3 -m venv /tmp/towervenv
    /tmp/towervenv/bin/pip install torch transformers==4.57.1 pillow
    /tmp/towervenv/bin/python scripts/tower/reference.py
"""

import json
import math
import pathlib

import torch
import transformers
from PIL import Image
from safetensors.torch import save_file
from transformers import Qwen2VLImageProcessor
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
    Qwen2_5_VisionTransformerPretrainedModel,
)
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

REPO = pathlib.Path(__file__).resolve().parents[2]
OUT = REPO / "crates" / "tower" / "tests" / "data"
IMAGES = REPO.parent / "shared" / "images"
IMAGE_FILES = ["astronaut.png", "coffee.png"]
# 25 merged tokens' worth of pixels: astronaut → 10×10 patches, coffee → 8×12.
MAX_PIXELS = 28 * 28 * 25
SEED = 20240917

QWEN2_VL = {
    "depth": 2,
    "embed_dim": 32,
    "hidden_act": "quick_gelu",
    "hidden_size": 64,
    "in_chans": 3,
    "in_channels": 3,
    "mlp_ratio": 2,
    "num_heads": 2,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "spatial_patch_size": 14,
    "temporal_patch_size": 2,
}

# window_size 84 px = 3 merged tokens per side: 5×5 and 4×6 token grids
# both end in partial windows.
QWEN2_5_VL = {
    "depth": 3,
    "fullatt_block_indexes": [1],
    "hidden_act": "silu",
    "hidden_size": 32,
    "in_chans": 3,
    "in_channels": 3,
    "intermediate_size": 48,
    "num_heads": 2,
    "out_hidden_size": 64,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "spatial_patch_size": 14,
    "temporal_patch_size": 2,
    "tokens_per_second": 2,
    "window_size": 84,
}


def preprocess():
    processor = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=MAX_PIXELS)
    images = [Image.open(IMAGES / name).convert("RGB") for name in IMAGE_FILES]
    batch = processor(images=images, return_tensors="pt")
    return batch["pixel_values"].float(), batch["image_grid_thw"]


def randomise(model, generator):
    """Replaces every parameter so each one matters: matrices uniform with a
    1/sqrt(fan_in) bound, norm weights near 1, biases small."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            u = torch.rand(param.shape, generator=generator) * 2 - 1
            if name.endswith("bias"):
                param.copy_(0.05 * u)
            elif param.dim() == 1:
                param.copy_(1.0 + 0.1 * u)
            else:
                fan_in = math.prod(param.shape[1:])
                param.copy_(u / math.sqrt(fan_in))


def build(model_type, vision):
    generator = torch.Generator().manual_seed(SEED)
    if model_type == "qwen2_vl":
        config = Qwen2VLVisionConfig(**vision)
        model_class = Qwen2VisionTransformerPretrainedModel
    else:
        config = Qwen2_5_VLVisionConfig(**vision)
        model_class = Qwen2_5_VisionTransformerPretrainedModel
    config._attn_implementation = "eager"
    model = model_class._from_config(config, attn_implementation="eager").float().eval()
    randomise(model, generator)
    return model


def write_model(model_type, vision, prefix, pixel_values, grid_thw):
    model = build(model_type, vision)
    with torch.no_grad():
        out = model(pixel_values, grid_thw=grid_thw)
    out = out if torch.is_tensor(out) else out.last_hidden_state
    folder = OUT / model_type
    folder.mkdir(parents=True, exist_ok=True)
    weights = {prefix + k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    save_file({"embeddings": out.contiguous()}, str(folder / "expected.safetensors"))
    config = {
        "architectures": [
            "Qwen2VLForConditionalGeneration"
            if model_type == "qwen2_vl"
            else "Qwen2_5_VLForConditionalGeneration"
        ],
        "model_type": model_type,
        "torch_dtype": "float32",
        "vision_config": vision,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    print(f"{model_type}: {tuple(out.shape)} max|y|={out.abs().max().item():.4f}")


def main():
    assert transformers.__version__ == "4.57.1", transformers.__version__
    torch.set_num_threads(1)
    pixel_values, grid_thw = preprocess()
    OUT.mkdir(parents=True, exist_ok=True)
    save_file(
        {"pixel_values": pixel_values.contiguous(), "image_grid_thw": grid_thw.to(torch.int64)},
        str(OUT / "inputs.safetensors"),
    )
    print("grids:", grid_thw.tolist(), "pixel_values:", tuple(pixel_values.shape))
    write_model("qwen2_vl", QWEN2_VL, "visual.", pixel_values, grid_thw)
    write_model("qwen2_5_vl", QWEN2_5_VL, "model.visual.", pixel_values, grid_thw)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
