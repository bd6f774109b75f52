#!/usr/bin/env python3
"""Regenerates the parity expectations of crates/vision from the Hugging Face reference.

Pinned reference: transformers==4.57.1, pillow==12.2.0, numpy, and for the
fast (torchvision) processors (InternVL's shipped class, Llama 4's only one)
torch==2.9.1 and torchvision==0.24.1 (CPU):

    pip install transformers==4.57.1 pillow==12.2.0 numpy torch==2.9.1 torchvision==0.24.1
    python3 scripts/vision/reference.py            # from the repository root
    python3 scripts/vision/reference.py --only phi4_multimodal   # one processor's cases

Writes
- crates/vision/tests/data/synthetic/*: small deterministic edge-case images
  (grey, grey+alpha, RGBA, palette, 16-bit, 1-bit, odd and extreme sizes,
  EXIF orientation, GIF, BMP, WebP, and JPEG: baseline, progressive, grey,
  CMYK with and without Adobe segment, YCCK, 4:4:4 / 4:2:2 / 4:2:0, sizes
  that are not whole MCUs, restart markers, untransformed RGB);
- crates/vision/tests/data/expected.json: per image the decoded image's
  size/sha256/sampled pixels, and per (image, processor, overrides) the
  resized 8-bit image's sha256, shapes, grid, token count, sum and sum of
  squares of pixel_values, and sampled float values; and for the
  any-resolution processors (LLaVA-NeXT, OneVision), Gemma 3 (with pan and
  scan), Idefics3 / SmolVLM, InternVL, Llama 4 and Phi-4-multimodal tables
  of image sizes with their tile and placeholder counts; for Idefics3 /
  SmolVLM each case's pixel_attention_mask, and the masks of image pairs of
  different frame counts in one prompt and as two prompts of one batch.

Images from ../shared/images (beside the repository root) are referenced by
name only; nothing large is written.
"""

import hashlib
import io
import json
import os
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import PIL
import transformers
from PIL import Image
import torch
import torchvision.transforms.v2.functional as TF
from transformers import (
    CLIPImageProcessor,
    Gemma3ImageProcessor,
    GotOcr2ImageProcessor,
    GotOcr2ImageProcessorFast,
    Llama4ImageProcessorFast,
    Phi4MultimodalImageProcessorFast,
    Idefics3ImageProcessor,
    PixtralImageProcessor,
    LlavaNextImageProcessor,
    LlavaNextProcessor,
    LlavaOnevisionImageProcessor,
    LlavaOnevisionProcessor,
    Qwen2VLImageProcessor,
)
from transformers.image_processing_utils import get_patch_output_size, select_best_resolution
from transformers.image_transforms import center_crop, resize
from transformers.models.gemma3.processing_gemma3 import Gemma3ProcessorKwargs
from transformers.models.got_ocr2.image_processing_got_ocr2 import get_optimal_tiled_canvas
from transformers.models.internvl.processing_internvl import InternVLProcessorKwargs
from transformers.models.llama4 import image_processing_llama4_fast as llama4_fast
from transformers.image_processing_utils_fast import SizeDict
from transformers.models.idefics3.image_processing_idefics3 import get_resize_output_image_size as idefics3_size
from transformers.models.pixtral.image_processing_pixtral import get_resize_output_image_size as pixtral_size
from transformers.image_utils import ChannelDimension, PILImageResampling, load_image
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "images"
DATA = ROOT / "crates" / "vision" / "tests" / "data"
SYN = DATA / "synthetic"
SAMPLES = 128

PROCESSORS = {
    # Qwen2-VL-7B-Instruct's shipped preprocessor_config.json
    "qwen2_vl": {
        "image_processor_type": "Qwen2VLImageProcessor",
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "patch_size": 14,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    },
    # Qwen3-VL's shipped config (the PIL-based class with its parameters)
    "qwen3_vl": {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "size": {"shortest_edge": 65536, "longest_edge": 16777216},
        "patch_size": 16,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    },
    # llava-hf/llava-1.5-7b-hf
    "llava": {
        "image_processor_type": "CLIPImageProcessor",
        "size": {"shortest_edge": 336},
        "crop_size": {"height": 336, "width": 336},
        "do_center_crop": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    },
    # llava-hf/llava-v1.6-mistral-7b-hf
    "llava_next": {
        "image_processor_type": "LlavaNextImageProcessor",
        "aspect_ratio_setting": "anyres",
        "crop_size": {"height": 336, "width": 336},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "resample": 3,
        "rescale_factor": 0.00392156862745098,
        "size": {"shortest_edge": 336},
    },
    # llava-hf/llava-onevision-qwen2-7b-ov-hf
    "llava_onevision": {
        "image_processor_type": "LlavaOnevisionImageProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_grid_pinpoints": [[i * 384, j * 384] for i in range(1, 7) for j in range(1, 7)],
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "resample": 3,
        "rescale_factor": 0.00392156862745098,
        "size": {"height": 384, "width": 384},
    },
    # google/gemma-3-4b-it (nulls as shipped: pan and scan off, its
    # parameters from Gemma3Processor's defaults when asked for)
    "gemma3": {
        "image_processor_type": "Gemma3ImageProcessor",
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_pan_and_scan": None,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_seq_length": 256,
        "image_std": [0.5, 0.5, 0.5],
        "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None,
        "pan_and_scan_min_ratio_to_activate": None,
        "resample": 2,
        "rescale_factor": 0.00392156862745098,
        "size": {"height": 896, "width": 896},
    },
    # HuggingFaceTB/SmolVLM-Instruct; image_seq_len from its processor_config.json
    "smolvlm": {
        "image_processor_type": "Idefics3ImageProcessor",
        "do_convert_rgb": True,
        "do_image_splitting": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "max_image_size": {"longest_edge": 384},
        "resample": 1,
        "rescale_factor": 0.00392156862745098,
        "size": {"longest_edge": 1536},
        "image_seq_len": 81,
    },
    # HuggingFaceM4/Idefics3-8B-Llama3 (the class defaults: 4·364, 364-pixel
    # tiles); image_seq_len from its processor_config.json
    "idefics3": {
        "image_processor_type": "Idefics3ImageProcessor",
        "do_convert_rgb": True,
        "do_image_splitting": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "max_image_size": {"longest_edge": 364},
        "resample": 1,
        "rescale_factor": 0.00392156862745098,
        "size": {"longest_edge": 1456},
        "image_seq_len": 169,
    },
    # mistral-community/pixtral-12b (spatial_merge_size 1: the processor's default)
    "pixtral": {
        "image_processor_type": "PixtralImageProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "patch_size": {"height": 16, "width": 16},
        "resample": 3,
        "rescale_factor": 0.00392156862745098,
        "size": {"longest_edge": 1024},
    },
}


def shipped(kind, tile, resample, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), **rest):
    """A shipped config of the torchvision classes: every do_* switch on, the 1/255
    rescale, square tiles of `tile`."""
    switches = {f"do_{k}": True for k in ("convert_rgb", "normalize", "rescale", "resize")}
    return {"image_processor_type": kind, **switches, "image_mean": list(mean), "image_std": list(std),
            "resample": resample, "rescale_factor": 0.00392156862745098, "size": {"height": tile, "width": tile}, **rest}


# OpenGVLab/InternVL3-1B-hf (the fast class, as shipped; image_seq_length from its
# processor_config.json)
PROCESSORS["internvl"] = shipped("GotOcr2ImageProcessorFast", 448, 3, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225),
                                 crop_to_patches=False, max_patches=12, min_patches=1, image_seq_length=256)
# meta-llama/Llama-4-Scout-17B-16E-Instruct (Llama4ImageProcessorFast: the only class)
PROCESSORS["llama4"] = shipped("Llama4ImageProcessorFast", 336, 2, max_patches=16, resize_to_max_canvas=False)
# microsoft/Phi-4-multimodal-instruct (Phi4MultimodalImageProcessorFast: the only class;
# AutoImageProcessor has no slow one for phi4_multimodal)
PROCESSORS["phi4_multimodal"] = shipped("Phi4MultimodalImageProcessorFast", 448, 3, dynamic_hd=36, patch_size=14)
# The same config with the slow (Pillow) class.
PROCESSORS["internvl_slow"] = dict(PROCESSORS["internvl"], image_processor_type="GotOcr2ImageProcessor")

IDEFICS3 = ("smolvlm", "idefics3")
# The torchvision classes: they take the PIL image as a channels-first tensor.
FAST = ("internvl", "llama4", "phi4_multimodal")
INTERNVL = ("internvl", "internvl_slow")

# InternVLProcessor's image defaults: crop_to_patches on, whatever the image
# processor's config says.
INTERNVL_CALL = dict(InternVLProcessorKwargs._defaults["images_kwargs"])

# Gemma3Processor's image defaults: the pan-and-scan parameters the shipped
# image processor config leaves null.
GEMMA3_CALL = {k: v for k, v in Gemma3ProcessorKwargs._defaults["images_kwargs"].items() if k.startswith("pan_and_scan")}

# The model processors' settings that decide the prompt's placeholder count
# (their processor_config.json): LLaVA-NeXT counts a CLS token and drops it
# ("default" strategy); OneVision has 729 SigLIP features and keeps them all.
MODEL_PROCESSORS = {
    "llava_next": (LlavaNextProcessor, {"patch_size": 14, "num_additional_image_tokens": 1, "vision_feature_select_strategy": "default"}),
    "llava_onevision": (LlavaOnevisionProcessor, {"num_image_tokens": 729, "vision_aspect_ratio": "anyres_max_9", "vision_feature_select_strategy": "full"}),
}


def sha256(arr):
    return hashlib.sha256(np.ascontiguousarray(arr, dtype=np.uint8).tobytes()).hexdigest()


def sample_indices(n, count=SAMPLES):
    """Deterministic spread of indices; crates/vision/tests/parity.rs uses the same formula."""
    return sorted({(k * 2654435761 + 12345) % n for k in range(count)})


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def write_png(path, width, height, bit_depth, colour_type, rows):
    """Minimal PNG writer for layouts Pillow cannot save (16-bit RGB/LA, 4-bit grey)."""
    raw = b"".join(b"\x00" + r for r in rows)
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b""))


def pattern(w, h, seed):
    """Smooth gradients plus a deterministic high-frequency texture: exercises every filter tap."""
    y, x = np.mgrid[0:h, 0:w].astype(np.int64)
    texture = ((x * x * (seed + 3) + 3 * y * y + seed * x * y) % 29) * 7  # periodic: compresses well
    noise = np.stack([texture, (texture * 3) % 61, (texture + 11 * seed) % 47], axis=-1)
    base = np.stack([(x * 255) // max(w - 1, 1), (y * 255) // max(h - 1, 1), ((x + y) * 97) % 256], axis=-1)
    return ((base + noise) % 256).astype(np.uint8)


def make_synthetic():
    SYN.mkdir(parents=True, exist_ok=True)
    out = {}

    def save(name, img, **kw):
        img.save(SYN / name, **kw)
        out[name] = SYN / name

    save("rgb_1x1.png", Image.fromarray(pattern(1, 1, 1)))
    save("rgb_1x4000.png", Image.fromarray(pattern(1, 4000, 2)))
    save("rgb_4000x1.png", Image.fromarray(pattern(4000, 1, 3)))
    save("rgb_28x3000.png", Image.fromarray(pattern(28, 3000, 4)))  # > 100:1, Pillow 12.2 goes vertical first
    save("rgb_3000x28.png", Image.fromarray(pattern(3000, 28, 5)))
    save("rgb_20x2500.png", Image.fromarray(pattern(20, 2500, 26)))  # > 100:1 and shrinking: vertical first
    save("rgb_333x217.png", Image.fromarray(pattern(333, 217, 6)))
    save("rgb_97x1013.png", Image.fromarray(pattern(97, 1013, 7)))
    save("rgb_560x280.png", Image.fromarray(pattern(560, 280, 8)))
    save("rgb_13x9.png", Image.fromarray(pattern(13, 9, 9)))
    save("rgb_300x1000.png", Image.fromarray(pattern(300, 1000, 27)))  # Gemma 3 pan and scan: 3 crops, the last shorter
    save("grey_L.png", Image.fromarray(pattern(150, 101, 10)[..., 0], mode="L"))
    la = Image.fromarray(pattern(120, 90, 11)[..., :2].copy(), mode="LA")
    save("grey_alpha_LA.png", la)
    rgba = np.dstack([pattern(130, 77, 12), pattern(130, 77, 13)[..., 0]])
    save("rgba.png", Image.fromarray(rgba, mode="RGBA"))
    pal = Image.fromarray(pattern(111, 66, 14)).quantize(colors=37, method=Image.Quantize.MEDIANCUT)
    save("palette_P.png", pal)
    save("palette_P_trns.png", pal, transparency=3)
    save("bilevel_1.png", Image.fromarray(pattern(64, 48, 15)[..., 0] > 127))
    g16 = (pattern(90, 70, 16)[..., 0].astype(np.uint16) * 3)  # some values above 255: Pillow clips
    save("grey16.png", Image.fromarray(g16.astype(np.uint16)))
    rgb16 = pattern(80, 60, 17).astype(np.uint16) * 257 + np.uint16(13)
    write_png(SYN / "rgb16.png", 80, 60, 16, 2, [r.astype(">u2").tobytes() for r in rgb16])
    out["rgb16.png"] = SYN / "rgb16.png"
    la16 = (pattern(70, 50, 18)[..., :2].astype(np.uint16) * 251)
    write_png(SYN / "la16.png", 70, 50, 16, 4, [r.astype(">u2").tobytes() for r in la16])
    out["la16.png"] = SYN / "la16.png"
    g4 = pattern(64, 40, 19)[..., 0] >> 4
    write_png(SYN / "grey4.png", 64, 40, 4, 0, [bytes(((a << 4) | b) for a, b in zip(r[0::2], r[1::2])) for r in g4])
    out["grey4.png"] = SYN / "grey4.png"
    exif = Image.Exif()
    exif[0x0112] = 6
    save("exif_rot90.png", Image.fromarray(pattern(90, 40, 20)), exif=exif.tobytes())
    exif[0x0112] = 5
    save("exif_transpose.webp", Image.fromarray(pattern(60, 33, 21)), lossless=True, exif=exif.tobytes())
    save("lossless.webp", Image.fromarray(pattern(95, 61, 22)), lossless=True)
    save("lossy.webp", Image.fromarray(pattern(95, 61, 23)), quality=80)
    save("rgb.bmp", Image.fromarray(pattern(71, 45, 24)))
    gif = Image.fromarray(pattern(50, 30, 25)).quantize(colors=16)
    save("transparent.gif", gif, transparency=2)
    photo = Image.open(SHARED / "coffee.png").convert("RGB").crop((100, 50, 340, 230))
    save("baseline.jpg", photo, quality=90)
    save("progressive.jpg", photo, quality=85, progressive=True)
    save("grey.jpg", photo.convert("L"), quality=90)
    save("cmyk.jpg", photo.convert("CMYK"), quality=90)
    exif[0x0112] = 8
    save("exif_rot270.jpg", photo, quality=90, exif=exif.tobytes())
    # libjpeg-turbo paths: chroma subsampling (4:4:4 / 4:2:2 / 4:2:0 select
    # different upsamplers), sizes that are not whole MCUs, restart markers,
    # RGB without colour transform, progressive subsampled, tiny images.
    save("q444_37x23.jpg", photo.crop((3, 5, 40, 28)), quality=92, subsampling=0)
    save("q422_41x19.jpg", photo.crop((7, 1, 48, 20)), quality=88, subsampling=1)
    save("q420_35x29.jpg", photo.crop((11, 13, 46, 42)), quality=75, subsampling=2)
    save("q420_1x1.jpg", photo.crop((60, 60, 61, 61)), quality=90)
    save("q422_progressive_101x67.jpg", photo.crop((20, 30, 121, 97)), quality=80, subsampling=1, progressive=True)
    save("q420_restart_rows.jpg", photo, quality=85, restart_marker_rows=1)
    save("q444_restart_blocks.jpg", photo.crop((0, 0, 123, 77)), quality=85, subsampling=0, restart_marker_blocks=5)
    save("rgb_keep_rgb.jpg", photo.crop((0, 0, 77, 51)), quality=90, keep_rgb=True)
    save("grey_odd_progressive.jpg", photo.convert("L").crop((1, 2, 84, 61)), quality=70, progressive=True)
    # Four components without an Adobe segment (Pillow still inverts), and
    # YCCK: a CMYK file whose Adobe transform byte says 2, so libjpeg
    # converts YCC→RGB→CMY (Pillow cannot write YCCK itself).
    cmyk = io.BytesIO()
    photo.convert("CMYK").crop((5, 5, 94, 70)).save(cmyk, "JPEG", quality=90)
    cmyk = cmyk.getvalue()
    adobe = cmyk.index(b"Adobe")
    length = struct.unpack(">H", cmyk[adobe - 2 : adobe])[0]
    assert cmyk[adobe - 4 : adobe - 2] == b"\xff\xee" and cmyk[adobe + 11] == 0
    (SYN / "cmyk_no_adobe.jpg").write_bytes(cmyk[: adobe - 4] + cmyk[adobe - 2 + length :])
    out["cmyk_no_adobe.jpg"] = SYN / "cmyk_no_adobe.jpg"
    (SYN / "ycck.jpg").write_bytes(cmyk[: adobe + 11] + b"\x02" + cmyk[adobe + 12 :])
    out["ycck.jpg"] = SYN / "ycck.jpg"
    return out


def decoded_entry(path):
    img = load_image(str(path))
    arr = np.asarray(img)
    flat = arr.reshape(-1)
    idx = sample_indices(flat.size)
    return img, {
        "width": img.width,
        "height": img.height,
        "sha256": sha256(arr),
        "samples": [[i, int(flat[i])] for i in idx],
    }


def anyres_tiles_8bit(name, arr):
    """The 8-bit tiles LLaVA-NeXT / OneVision normalise, stacked vertically: the base
    image squashed to the tile, then the grid's tiles row by row (built from
    transformers' own helpers, independently of the processor call)."""
    cfg = PROCESSORS[name]
    tile = cfg["size"].get("shortest_edge", cfg["size"].get("height"))
    last = ChannelDimension.LAST
    grid = select_best_resolution(arr.shape[:2], cfg["image_grid_pinpoints"])
    new_h, new_w = get_patch_output_size(arr, grid, last)
    scaled = resize(arr, (new_h, new_w), resample=PILImageResampling.BICUBIC, input_data_format=last)
    top, left = (grid[0] - new_h) // 2, (grid[1] - new_w) // 2
    canvas = np.zeros((grid[0], grid[1], 3), dtype=np.uint8)
    canvas[top : top + new_h, left : left + new_w] = scaled
    tiles = [canvas[y : y + tile, x : x + tile] for y in range(0, grid[0], tile) for x in range(0, grid[1], tile)]
    base = resize(arr, (tile, tile), resample=PILImageResampling.BICUBIC, input_data_format=last)
    return np.concatenate([base] + tiles, axis=0)


def anyres_tokens(name, image_processor, height, width):
    """The model processor's placeholder count for one image of height×width."""
    cls, settings = MODEL_PROCESSORS[name]
    proc = cls.__new__(cls)  # no tokenizer needed for the count
    proc.image_processor = image_processor
    for k, v in settings.items():
        setattr(proc, k, v)
    size = PROCESSORS[name]["size"]
    tile = size.get("shortest_edge", size.get("height"))
    tokens = proc._get_number_of_features(height, width, tile, tile)
    return tokens - 1 if settings["vision_feature_select_strategy"] == "default" else tokens


def gemma3_frames_8bit(arr, overrides):
    """The 8-bit frames Gemma 3 normalises, stacked vertically: the image, then its
    pan-and-scan crops (transformers' own pan_and_scan), each squashed to the size."""
    ip = processor_for("gemma3")
    frames = [arr]
    if overrides.get("do_pan_and_scan"):
        frames += ip.pan_and_scan(arr, input_data_format=ChannelDimension.LAST, **GEMMA3_CALL)
    size = PROCESSORS["gemma3"]["size"]
    out = [resize(f, (size["height"], size["width"]), resample=PILImageResampling.BILINEAR, input_data_format=ChannelDimension.LAST) for f in frames]
    return np.concatenate(out, axis=0)


def idefics3_frames_8bit(name, arr):
    """The 8-bit frames Idefics3 / SmolVLM normalise, stacked vertically: the tiles
    row by row and the global image (the processor's own resize steps and split)."""
    ip = processor_for(name)
    last = ChannelDimension.LAST
    cfg = PROCESSORS[name]
    first = ip.resize(arr, size=cfg["size"], resample=cfg["resample"], input_data_format=last)
    second = ip.resize_for_vision_encoder(first, cfg["max_image_size"]["longest_edge"], resample=cfg["resample"], input_data_format=last)
    frames, _, _ = ip.split_image(second, max_image_size=cfg["max_image_size"], resample=cfg["resample"], input_data_format=last)
    return np.concatenate(frames, axis=0)


def torch_resize(arr, h, w):
    """torchvision's antialiased BICUBIC on the uint8 image (the fast processors' resize)."""
    t = torch.from_numpy(np.array(arr, dtype=np.uint8)).permute(2, 0, 1)
    out = TF.resize(t, [h, w], interpolation=TF.InterpolationMode.BICUBIC, antialias=True)
    return out.permute(1, 2, 0).numpy()


def internvl_frames_8bit(name, arr):
    """The 8-bit frames InternVL normalises, stacked vertically: the canvas's tiles
    row by row, then (with more than one) the thumbnail (transformers' own grid choice)."""
    cfg = PROCESSORS[name]
    th, tw = cfg["size"]["height"], cfg["size"]["width"]
    cols, rows = get_optimal_tiled_canvas(arr.shape[:2], (th, tw), cfg["min_patches"], cfg["max_patches"])
    if name == "internvl":
        squash = lambda h, w: torch_resize(arr, h, w)
    else:
        squash = lambda h, w: resize(arr, (h, w), resample=PILImageResampling.BICUBIC, input_data_format=ChannelDimension.LAST)
    canvas = squash(rows * th, cols * tw)
    frames = [canvas[r * th : (r + 1) * th, c * tw : (c + 1) * tw] for r in range(rows) for c in range(cols)]
    if rows * cols > 1:
        frames.append(squash(th, tw))
    return np.concatenate(frames, axis=0)


def llama4_plan(h, w):
    """Llama4ImageProcessorFast's canvas (rows, cols) and resized (height, width) for an
    h×w image: the steps of its _preprocess, on transformers' own helpers."""
    cfg = PROCESSORS["llama4"]
    tile = cfg["size"]["height"]
    size = SizeDict(height=tile, width=tile)
    possible = torch.tensor(llama4_fast.find_supported_resolutions(max_num_chunks=cfg["max_patches"], patch_size=size))
    target = llama4_fast.get_best_fit((h, w), possible, resize_to_max_canvas=False)
    bounded = (min(max(h, tile), target[0]), min(max(w, tile), target[1]))
    nh, nw = llama4_fast.get_max_res_without_distortion((h, w), bounded)
    return int(target[0]) // tile, int(target[1]) // tile, max(int(nh), 1), max(int(nw), 1)


def torch_bilinear(arr, h, w):
    t = torch.from_numpy(np.array(arr, dtype=np.uint8)).permute(2, 0, 1)
    out = TF.resize(t, [h, w], interpolation=TF.InterpolationMode.BILINEAR, antialias=True)
    return out.permute(1, 2, 0).numpy()


def llama4_frames_8bit(arr):
    """The 8-bit frames Llama 4 normalises, stacked vertically: the padded canvas's
    tiles row by row, then (with more than one) the global tile."""
    tile = PROCESSORS["llama4"]["size"]["height"]
    rows, cols, nh, nw = llama4_plan(*arr.shape[:2])
    canvas = np.zeros((rows * tile, cols * tile, 3), dtype=np.uint8)
    canvas[:nh, :nw] = torch_bilinear(arr, nh, nw)
    frames = [canvas[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile] for r in range(rows) for c in range(cols)]
    if rows * cols > 1:
        frames.append(torch_bilinear(arr, tile, tile))
    return np.concatenate(frames, axis=0)


def phi4_frames_8bit(image_processor, arr):
    """The 8-bit canvas Phi-4-multimodal normalises (resized, padded white by
    transformers' own dynamic_preprocess), cut into its tiles row by row and stacked
    vertically."""
    cfg = PROCESSORS["phi4_multimodal"]
    tile, patch = cfg["size"]["height"], cfg["patch_size"]
    t = torch.from_numpy(np.array(arr, dtype=np.uint8)).permute(2, 0, 1)
    canvas, _ = image_processor.dynamic_preprocess(t, tile, patch, tile // patch, max_num=cfg["dynamic_hd"])
    c = canvas.permute(1, 2, 0).numpy()
    rows, cols = c.shape[0] // tile, c.shape[1] // tile
    return np.concatenate([c[r * tile : (r + 1) * tile, k * tile : (k + 1) * tile] for r in range(rows) for k in range(cols)])


def onevision_square_8bit(arr):
    """OneVision's multi-image frame: the image padded to a square with the mean
    colour (transformers' own pad_to_square), squashed to the tile."""
    ip = processor_for("llava_onevision")
    colour = tuple(int(x * 255) for x in ip.image_mean)
    last = ChannelDimension.LAST
    square = ip.pad_to_square(arr, background_color=colour, input_data_format=last)
    tile = PROCESSORS["llava_onevision"]["size"]["height"]
    return resize(square, (tile, tile), resample=PILImageResampling.BICUBIC, input_data_format=last)


def resized_8bit(name, cfg, arr, overrides):
    if overrides.get("multi_image"):
        return onevision_square_8bit(arr)
    if name == "phi4_multimodal":
        return phi4_frames_8bit(processor_for(name), arr)
    if name == "llama4":
        return llama4_frames_8bit(arr)
    if name in INTERNVL:
        return internvl_frames_8bit(name, arr)
    if name == "gemma3":
        return gemma3_frames_8bit(arr, overrides)
    if name in IDEFICS3:
        return idefics3_frames_8bit(name, arr)
    if name == "pixtral":
        h, w = pixtral_size(arr, size=(1024, 1024), patch_size=(16, 16), input_data_format=ChannelDimension.LAST)
        return resize(arr, (h, w), resample=PILImageResampling.BICUBIC, input_data_format=ChannelDimension.LAST)
    if name in MODEL_PROCESSORS:
        return anyres_tiles_8bit(name, arr)
    if cfg["image_processor_type"].startswith("CLIP"):
        h, w = arr.shape[:2]
        short, long = (w, h) if w <= h else (h, w)
        new_long = int(336 * long / short)
        size = (new_long, 336) if w <= h else (336, new_long)
        r = resize(arr, size, resample=PILImageResampling.BICUBIC, input_data_format="channels_last")
        return center_crop(r, (336, 336), input_data_format="channels_last")
    p = PROCESSORS[name]
    size = p.get("size", {})
    min_p = overrides.get("min_pixels", p.get("min_pixels", size.get("shortest_edge")))
    max_p = overrides.get("max_pixels", p.get("max_pixels", size.get("longest_edge")))
    h, w = smart_resize(arr.shape[0], arr.shape[1], factor=p["patch_size"] * p["merge_size"], min_pixels=min_p, max_pixels=max_p)
    return resize(arr, (h, w), resample=PILImageResampling.BICUBIC, input_data_format="channels_last")


def pad_for_patching_with_axes(self, image, target_resolution, input_data_format):
    """transformers 4.57.1's `_pad_for_patching` with the channel axis passed on to `pad`.

    The shipped method lets `pad` guess the axes, and for a scaled image 1 or 3
    pixels high (an `(h, w, 3)` array whose first axis looks like channels) it
    guesses channels-first and pads height and width as if they were width and
    channels: misplaced content and a wrong tile count (a 4000x1 image gets 3
    grid tiles for a 2-tile grid), which the model's unpadding then contradicts.
    Iris computes what the method means; for those images only, the
    expectations come from the reference with this fix (marked in the case)."""
    new_resolution = get_patch_output_size(image, target_resolution, input_data_format)
    padding = self._get_padding_size(new_resolution, target_resolution)
    return self.pad(image, padding=padding, input_data_format=input_data_format)


def pad_axes_guessed_wrong(name, arr):
    """Whether the reference's `_pad_for_patching` guesses channels-first for this image."""
    grid = select_best_resolution(arr.shape[:2], PROCESSORS[name]["image_grid_pinpoints"])
    new_h, _ = get_patch_output_size(arr, grid, ChannelDimension.LAST)
    return new_h in (1, 3)


def processor_for(name):
    cfg = {k: v for k, v in PROCESSORS[name].items() if k != "image_processor_type"}
    if name == "llava":
        return CLIPImageProcessor(**cfg)
    if name == "llava_next":
        return LlavaNextImageProcessor(**cfg)
    if name == "llava_onevision":
        return LlavaOnevisionImageProcessor(**cfg)
    if name == "gemma3":
        return Gemma3ImageProcessor(**cfg)
    if name in IDEFICS3:
        return Idefics3ImageProcessor(**cfg)
    if name == "pixtral":
        return PixtralImageProcessor(**cfg)
    if name == "internvl":
        return GotOcr2ImageProcessorFast(**cfg)
    if name == "llama4":
        return Llama4ImageProcessorFast(**cfg)
    if name == "phi4_multimodal":
        return Phi4MultimodalImageProcessorFast(**cfg)
    if name == "internvl_slow":
        return GotOcr2ImageProcessor(**cfg)
    if "size" in cfg:
        # transformers 4.57.1's PIL Qwen2VLImageProcessor.__init__ discards a valid `size`
        # (its `else` branch resets it to the class defaults); the config means
        # size.shortest_edge / size.longest_edge, which min_pixels / max_pixels express.
        size = cfg.pop("size")
        cfg["min_pixels"], cfg["max_pixels"] = size["shortest_edge"], size["longest_edge"]
    return Qwen2VLImageProcessor(**cfg)


def run_processor(name, img, overrides):
    """The reference processor run on `img`: (image_processor, out, multi, note),
    with `note` set when its `_pad_for_patching` had to be given the channel
    axis. A ValueError of the processor is raised as is."""
    arr = np.asarray(img)
    note = None
    # Explicit layout: the reference guesses channels-first for 1-pixel-wide images and fails.
    image_processor = processor_for(name)
    if name in MODEL_PROCESSORS and pad_axes_guessed_wrong(name, arr):
        image_processor._pad_for_patching = pad_for_patching_with_axes.__get__(image_processor)
        note = "reference _pad_for_patching given the channel axis (it guesses wrong on this image)"
    call = dict(overrides)
    multi = call.pop("multi_image", False)
    if multi:
        # OneVision's multi-image mode: the image twice, nested as one prompt's.
        img_arg = [[img, img]]
    else:
        img_arg = img
    if name == "gemma3":
        call.update(GEMMA3_CALL)
    if name in IDEFICS3:
        call["return_row_col_info"] = True
    if name in INTERNVL:
        call.update(INTERNVL_CALL)
    if name in FAST:
        # The fast classes take the PIL image as a channels-first tensor.
        out = image_processor(images=img_arg, return_tensors="pt", **call)
    else:
        out = image_processor(images=img_arg, return_tensors="np", input_data_format="channels_last", **call)
    return image_processor, out, multi, note


def pixel_values(name, out):
    """The processor output's pixel tensor as float32, one image's (the batch axis dropped)."""
    pv = out["image_pixel_values" if name == "phi4_multimodal" else "pixel_values"]
    # Llama 4 normalises in bfloat16, which numpy lacks: widened exactly.
    pv = np.asarray(pv.float() if hasattr(pv, "float") else pv, dtype=np.float32)
    if name in ("llava", "llava_next", "llava_onevision", "pixtral", "phi4_multimodal") or name in IDEFICS3:
        pv = pv[0]  # the batch of one
    return pv


def case(name, img, overrides):
    arr = np.asarray(img)
    entry = {"processor": name, "overrides": overrides}
    try:
        image_processor, out, multi, note = run_processor(name, img, overrides)
    except ValueError as e:
        entry["error"] = str(e)
        return entry
    if note:
        entry["note"] = note
    pv = pixel_values(name, out)
    r8 = resized_8bit(name, PROCESSORS[name], arr, overrides)
    flat = pv.reshape(-1).astype(np.float64)
    entry.update(
        resized_width=int(r8.shape[1]),
        resized_height=int(r8.shape[0]),
        resized_sha256=sha256(r8),
        shape=list(pv.shape),
        sum=float(flat.sum()),
        sum_sq=float((flat * flat).sum()),
        samples=[[i, float(f"{flat[i]:.9g}")] for i in sample_indices(flat.size)],
    )
    if "image_grid_thw" in out:
        grid = [int(v) for v in np.asarray(out["image_grid_thw"])[0]]
        entry["grid_thw"] = grid
        entry["tokens"] = grid[0] * grid[1] * grid[2] // 4
    elif name == "gemma3":
        entry["tokens"] = PROCESSORS[name]["image_seq_length"] * (1 + int(np.asarray(out["num_crops"])[0]))
    elif name in IDEFICS3:
        rows, cols = int(out["rows"][0][0]), int(out["cols"][0][0])
        entry["tile_grid"] = [rows, cols]
        entry["tokens"] = PROCESSORS[name]["image_seq_len"] * (rows * cols + 1)
        entry["pixel_attention_mask"] = mask_entry(out["pixel_attention_mask"][0])
    elif name == "pixtral":
        # PixtralProcessor: H/16 rows of W/16 [IMG], each row closed by [IMG_BREAK] (the last by [IMG_END]).
        height, width = (int(v) for v in np.asarray(out["image_sizes"])[0])
        entry["image_sizes"] = [height, width]
        entry["tile_grid"] = [height // 16, width // 16]
        entry["tokens"] = (height // 16) * (width // 16 + 1)
    elif name in INTERNVL:
        # InternVLProcessor: <img>, image_seq_length × num_patches <IMG_CONTEXT>, </img>.
        cfg = PROCESSORS[name]
        patches = int(np.asarray(out["num_patches"])[0])
        cols, rows = get_optimal_tiled_canvas(arr.shape[:2], (cfg["size"]["height"], cfg["size"]["width"]), cfg["min_patches"], cfg["max_patches"])
        entry["tile_grid"] = [rows, cols]
        entry["num_patches"] = patches
        entry["tokens"] = cfg["image_seq_length"] * patches
    elif name == "llama4":
        # Llama4Processor: (336/14)² / 4 = 144 <|patch|> per tile and per global tile.
        rows, cols = (int(v) for v in np.asarray(out["aspect_ratios"])[0])
        entry["tile_grid"] = [rows, cols]
        entry["tokens"] = 144 * (rows * cols + (1 if rows * cols > 1 else 0))
    elif name == "phi4_multimodal":
        # Phi4MultimodalProcessor repeats <|image|> num_img_tokens times; the model also
        # reads image_sizes (the canvas) and image_attention_mask [1 + tiles, 32, 32].
        height, width = (int(v) for v in np.asarray(out["image_sizes"])[0])
        tile = PROCESSORS[name]["size"]["height"]
        mask = np.asarray(out["image_attention_mask"][0])
        entry["image_sizes"] = [height, width]
        entry["tile_grid"] = [height // tile, width // tile]
        entry["tokens"] = int(out["num_img_tokens"][0])
        entry["attention_mask"] = {"shape": list(mask.shape), "sha256": sha256(mask.astype(np.uint8))}
    elif name in MODEL_PROCESSORS:
        height, width = (int(v) for v in np.asarray(out["image_sizes"])[0])
        entry["image_sizes"] = [height, width]
        if multi:
            # LlavaOnevisionProcessor: each image of a multi-image prompt takes
            # num_image_tokens + 1 (its newline).
            entry["tokens"] = MODEL_PROCESSORS[name][1]["num_image_tokens"] + 1
        else:
            entry["tokens"] = anyres_tokens(name, image_processor, height, width)
    else:
        entry["tokens"] = (336 // 14) ** 2
    return entry


def anyres_layouts():
    """Per any-resolution processor, rows [height, width, tiles + 1, tokens] for sizes
    around every tile and grid boundary, tiny and extreme: the plan from the size alone."""
    sides = [1, 2, 3, 4, 7, 13, 100, 223, 224, 335, 336, 337, 383, 384, 385, 500, 671, 672, 673, 767, 768, 1000,
             1007, 1008, 1009, 1080, 1151, 1152, 1920, 2303, 2304, 2305, 3000, 4000, 9999]
    sizes = [(h, w) for h in sides for w in sides]
    rng = np.random.default_rng(33)
    sizes += [(int(h), int(w)) for h, w in rng.integers(1, 5000, size=(300, 2))]
    out = {}
    for name in MODEL_PROCESSORS:
        cfg = PROCESSORS[name]
        ip = processor_for(name)
        tile = cfg["size"].get("shortest_edge", cfg["size"].get("height"))
        rows = []
        for h, w in sizes:
            gh, gw = select_best_resolution((h, w), cfg["image_grid_pinpoints"])
            rows.append([h, w, 1 + (gh // tile) * (gw // tile), anyres_tokens(name, ip, h, w)])
        out[name] = rows
    return out


def shape_only(h, w):
    """An h×w RGB array that takes no memory: for the size arithmetic alone."""
    return np.broadcast_to(np.zeros((1, 1, 1), dtype=np.uint8), (h, w, 3))


def tiled_layouts(sizes):
    """Gemma 3 with pan and scan: rows [height, width, frames]; SmolVLM: rows
    [height, width, frames, rows, cols]; Pixtral: rows [height, width, rows, cols];
    InternVL: rows [height, width, num_patches]; Llama 4: rows [height, width, rows, cols,
    resized height, resized width]. From the processors' own size code, with
    pixels replaced by shape-only arrays (their resize returns the size it would make)."""
    last = ChannelDimension.LAST
    g = processor_for("gemma3")
    gemma = [[h, w, 1 + len(g.pan_and_scan(shape_only(h, w), input_data_format=last, **GEMMA3_CALL))] for h, w in sizes]
    ip = processor_for("smolvlm")

    def fake_resize(image, size, resample=None, data_format=None, input_data_format=None):
        if "longest_edge" in size:
            h, w = idefics3_size(image, resolution_max_side=size["longest_edge"], input_data_format=last)
        else:
            h, w = size["height"], size["width"]
        return shape_only(h, w)

    ip.resize = fake_resize
    cfg = PROCESSORS["smolvlm"]
    smol = []
    for h, w in sizes:
        first = ip.resize(shape_only(h, w), size=cfg["size"])
        second = ip.resize_for_vision_encoder(first, cfg["max_image_size"]["longest_edge"], input_data_format=last)
        frames, rows, cols = ip.split_image(second, max_image_size=cfg["max_image_size"], input_data_format=last)
        smol.append([h, w, len(frames), rows, cols])
    pixtral = []
    for h, w in sizes:
        ph, pw = pixtral_size(shape_only(h, w), size=(1024, 1024), patch_size=(16, 16), input_data_format=last)
        # A side of zero: the reference's resize fails (rows 0, cols 0 mark it).
        pixtral.append([h, w, ph // 16, pw // 16] if ph and pw else [h, w, 0, 0])
    ip = processor_for("internvl")
    internvl = [[h, w, ip.get_number_of_image_patches(h, w, dict(INTERNVL_CALL))] for h, w in sizes]
    llama4 = [[h, w, *llama4_plan(h, w)] for h, w in sizes]
    return {"gemma3": gemma, "smolvlm": smol, "pixtral": pixtral, "internvl": internvl, "llama4": llama4}


def phi4_layouts(sizes):
    """Phi-4-multimodal: rows [height, width, rows, cols, num_img_tokens, mask ones]
    ([height, width, 0, 0, 0, 0] where the reference refuses the size), from its own
    _preprocess on an untouched uint8 tensor of the size, with the torchvision resize
    and pad of dynamic_preprocess replaced by shape-only stand-ins (the plan, mask and
    token count depend on the size alone)."""
    module = sys.modules[Phi4MultimodalImageProcessorFast.__module__]

    class ShapeOnly:
        @staticmethod
        def resize(image, size, **_):
            return torch.empty(*image.shape[:-2], *size, dtype=image.dtype)

        @staticmethod
        def pad(image, padding, fill=None):
            left, top, right, bottom = padding
            return torch.empty(*image.shape[:-2], image.shape[-2] + top + bottom, image.shape[-1] + left + right, dtype=image.dtype)

    cfg = PROCESSORS["phi4_multimodal"]
    ip = processor_for("phi4_multimodal")
    tile = cfg["size"]["height"]
    call = dict(size=SizeDict(height=tile, width=tile), interpolation=TF.InterpolationMode.BICUBIC,
                patch_size=cfg["patch_size"], dynamic_hd=cfg["dynamic_hd"], do_rescale=True,
                rescale_factor=cfg["rescale_factor"], do_normalize=True, image_mean=tuple(cfg["image_mean"]),
                image_std=tuple(cfg["image_std"]))
    rows, real = [], module.F
    module.F = ShapeOnly
    try:
        for h, w in sizes:
            try:
                out = ip._preprocess([torch.empty((3, h, w), dtype=torch.uint8)], **call)
            except ValueError:
                rows.append([h, w, 0, 0, 0, 0])
                continue
            height, width = (int(v) for v in out["image_sizes"][0])
            ones = int(out["image_attention_mask"][0].sum())
            rows.append([h, w, height // tile, width // tile, int(out["num_img_tokens"][0]), ones])
    finally:
        module.F = real
    return rows


def mask_entry(mask):
    """A 0/1 mask as the parity test checks it: shape, dtype, ones, sha256 of its bytes as uint8."""
    mask = np.asarray(mask)
    return {"shape": list(mask.shape), "dtype": str(mask.dtype), "ones": int(mask.sum()), "sha256": sha256(mask.astype(np.uint8))}


# Image pairs of different frame counts (5 and 13, 9 and 17 frames).
IDEFICS3_PAIRS = [("synthetic/rgb_1x4000.png", "shared/chelsea.png"), ("synthetic/rgb_300x1000.png", "synthetic/rgb_1x1.png")]


def image_file(key):
    return SHARED / key.removeprefix("shared/") if key.startswith("shared/") else DATA / key


def idefics3_multi():
    """Idefics3 / SmolVLM's pixel_attention_mask for two images of different frame
    counts: in one prompt (the frames concatenated, nothing padded) and as two
    prompts of one batch (the shorter padded with all-zero frames)."""
    entries = []
    for name in IDEFICS3:
        ip = processor_for(name)
        for pair in IDEFICS3_PAIRS:
            a, b = (decoded_entry(image_file(key))[0] for key in pair)
            call = {"return_tensors": "np", "input_data_format": "channels_last"}
            prompt = ip(images=[[a, b]], **call)["pixel_attention_mask"][0]
            batch = ip(images=[[a], [b]], **call)["pixel_attention_mask"]
            entries.append({"processor": name, "images": list(pair), "prompt": mask_entry(prompt), "batch": mask_entry(batch)})
    return entries


def layout_sizes():
    sides = [1, 2, 3, 4, 7, 13, 100, 223, 224, 255, 256, 257, 300, 307, 308, 335, 336, 337, 383, 384, 385, 500, 511, 512,
             513, 671, 672, 673, 767, 768, 769, 1000, 1007, 1008, 1009, 1080, 1151, 1152, 1153, 1535, 1536, 1537, 1920,
             2303, 2304, 2305, 3000, 4000, 4097, 9999]
    sizes = [(h, w) for h in sides for w in sides]
    rng = np.random.default_rng(33)
    sizes += [(int(h), int(w)) for h, w in rng.integers(1, 5000, size=(300, 2))]
    return sizes


def update_only(name):
    """Recomputes one processor's cases in the committed expected.json, every other
    entry left as it is (`--only NAME`)."""
    path = DATA / "expected.json"
    result = json.loads(path.read_text())
    result["processors"][name] = PROCESSORS[name]
    for image in result["images"]:
        key = image["name"]
        img, _ = decoded_entry(image_file(key))
        image["cases"] = [c for c in image["cases"] if c["processor"] != name] + [case(name, img, {})]
        if name == "llava_onevision":
            image["cases"].append(case(name, img, {"multi_image": True}))
        print(key, image["cases"][-1].get("shape", image["cases"][-1].get("error", "")[:40]), file=sys.stderr)
    if name == "phi4_multimodal":
        result["phi4_layouts"] = phi4_layouts(layout_sizes())
    if name in IDEFICS3:
        result["idefics3_multi"] = idefics3_multi()
    path.write_text(json.dumps(result, separators=(",", ":")) + "\n")


def main():
    if PIL.__version__ != "12.2.0" or transformers.__version__ != "4.57.1":
        sys.exit(f"need pillow 12.2.0 and transformers 4.57.1, have {PIL.__version__} / {transformers.__version__}")
    if sys.argv[1:2] == ["--only"]:
        return update_only(sys.argv[2])
    synthetic = make_synthetic()
    images = {f"shared/{p.name}": p for p in sorted(SHARED.iterdir()) if p.suffix in {".png", ".jpg", ".webp", ".gif"}}
    images.update({f"synthetic/{n}": p for n, p in sorted(synthetic.items())})
    result = {"pillow": PIL.__version__, "transformers": transformers.__version__, "sample_count": SAMPLES, "processors": PROCESSORS, "images": []}
    for key, path in images.items():
        img, decoded = decoded_entry(path)
        cases = [case(n, img, {}) for n in PROCESSORS]
        cases.append(case("gemma3", img, {"do_pan_and_scan": True}))
        cases.append(case("llava_onevision", img, {"multi_image": True}))
        if key == "synthetic/rgb_560x280.png":
            exact = 560 * 280
            for ov in ({"max_pixels": exact}, {"max_pixels": exact - 1}, {"min_pixels": exact}, {"min_pixels": exact + 1}):
                cases.append(case("qwen2_vl", img, ov))
        if key == "synthetic/rgb_13x9.png":
            cases.append(case("qwen2_vl", img, {"min_pixels": 200000, "max_pixels": 300000}))
        result["images"].append({"name": key, "format": path.suffix[1:], "decoded": decoded, "cases": cases})
        print(key, decoded["width"], decoded["height"], [c.get("shape", c.get("error", "")[:30]) for c in cases], file=sys.stderr)
    result["anyres_layouts"] = anyres_layouts()
    result["tiled_layouts"] = tiled_layouts(layout_sizes())
    result["phi4_layouts"] = phi4_layouts(layout_sizes())
    result["idefics3_multi"] = idefics3_multi()
    (DATA / "expected.json").write_text(json.dumps(result, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
