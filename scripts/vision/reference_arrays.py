#!/usr/bin/env python3
"""Writes the Hugging Face reference's whole pixel tensors for the photos of
../shared/images, for e2e/bench/peer_families.sh: the parity reference's
processors and calls (scripts/vision/reference.py), whose expected.json keeps
only samples and sums of them.

    python3 scripts/vision/reference_arrays.py OUT_DIR FAMILY...

Each tensor goes to OUT_DIR/FAMILY/PHOTO.f32 as raw little-endian float32,
row-major; its shape is the one expected.json gives for that case. Needs
reference.py's pins (transformers 4.57.1, pillow 12.2.0, torch 2.9.1,
torchvision 0.24.1).
"""

import sys
from pathlib import Path

import PIL
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference  # noqa: E402  (the families' configs, processors and calls)

PHOTO_SUFFIXES = {".png", ".jpg", ".webp", ".gif"}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    if PIL.__version__ != "12.2.0" or transformers.__version__ != "4.57.1":
        sys.exit(f"need pillow 12.2.0 and transformers 4.57.1, have {PIL.__version__} / {transformers.__version__}")
    out_dir = Path(sys.argv[1])
    families = sys.argv[2:]
    unknown = [f for f in families if f not in reference.PROCESSORS]
    if unknown:
        sys.exit(f"not in the parity reference: {', '.join(unknown)}")
    for path in sorted(reference.SHARED.iterdir()):
        if path.suffix not in PHOTO_SUFFIXES:
            continue
        img, _ = reference.decoded_entry(path)
        for family in families:
            _, out, _, _ = reference.run_processor(family, img, {})
            dest = out_dir / family / f"{path.name}.f32"
            dest.parent.mkdir(parents=True, exist_ok=True)
            reference.pixel_values(family, out).astype("<f4").tofile(dest)
        print(path.name, file=sys.stderr)


if __name__ == "__main__":
    main()
