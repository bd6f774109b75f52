#!/usr/bin/env bash
# Generates the small test clips of crates/video/tests/data with the ffmpeg
# CLI (needs libx264, libx265, libvpx, libaom/libsvtav1 and libwebp
# encoders). CI does not run this: the clips are committed. After
# regenerating, rerun scripts/video/pyav_reference.py to refresh pyav.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=crates/video/tests/data
mkdir -p "$out"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ff() { ffmpeg -hide_banner -loglevel error -y "$@"; }
# testsrc2 moves every frame, so consecutive frames differ.
src() { echo "testsrc2=size=$1:rate=$2:duration=$3"; }

# H.264 in MP4 and MOV, 160x120, 2 s at 10 fps, no B-frames.
ff -f lavfi -i "$(src 160x120 10 2)" -c:v libx264 -preset veryfast -bf 0 -pix_fmt yuv420p "$out/h264.mp4"
ff -f lavfi -i "$(src 160x120 10 2)" -c:v libx264 -preset veryfast -bf 0 -pix_fmt yuv420p "$out/h264.mov"
# H.264 with B-frames and a short GOP (keyframe every 8 frames), 25 fps, 3 s.
ff -f lavfi -i "$(src 160x120 25 3)" -c:v libx264 -preset veryfast -bf 3 -g 8 -keyint_min 8 -sc_threshold 0 -pix_fmt yuv420p "$out/h264_bframes.mp4"
# H.264 with one long GOP (a single keyframe), 2 s at 15 fps.
ff -f lavfi -i "$(src 160x120 15 2)" -c:v libx264 -preset veryfast -g 1000 -keyint_min 1000 -sc_threshold 0 -pix_fmt yuv420p "$out/h264_longgop.mp4"
# Odd size: 4:4:4 H.264 allows any width and height (testsrc2 itself
# rounds to even sizes, so scale its output).
ff -f lavfi -i "$(src 160x120 10 2)" -vf scale=97:61 -c:v libx264 -preset veryfast -pix_fmt yuv444p "$out/h264_odd.mp4"
# Colour tags: BT.709 limited range (phones, screen recordings) and BT.601
# full range, both honoured by the RGB conversion.
ff -f lavfi -i "$(src 160x120 10 1)" -c:v libx264 -preset veryfast -pix_fmt yuv420p \
    -colorspace bt709 -color_primaries bt709 -color_trc bt709 -color_range tv "$out/h264_bt709.mp4"
ff -f lavfi -i "$(src 160x120 10 1)" -c:v libx264 -preset veryfast -pix_fmt yuvj420p \
    -colorspace smpte170m -color_range pc "$out/h264_fullrange.mp4"
# Rotation metadata: the track header's display matrix turned by 90
# degrees (FFmpeg 5.1's CLI cannot write one, so the identity matrix after
# `tkhd` is patched). Ignored by PyAV and by us: frames stay 160x120.
ff -f lavfi -i "$(src 160x120 10 1)" -c:v libx264 -preset veryfast -pix_fmt yuv420p "$out/h264_rotated.mp4"
python3 - "$out/h264_rotated.mp4" <<'PY'
import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
identity = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)
turned = struct.pack(">9i", 0, 0x10000, 0, -0x10000, 0, 0, 0, 0, 0x40000000)
at = data.index(identity, data.index(b"tkhd"))
data[at:at + 36] = turned
open(sys.argv[1], "wb").write(bytes(data))
PY
# Size change mid-stream: 5 frames of 160x120 then 5 of 80x60 (two raw
# H.264 streams joined); the Matroska header says 80x60 (the last SPS).
ff -f lavfi -i "$(src 160x120 5 1)" -c:v libx264 -preset veryfast -bf 0 -f h264 "$tmp/big.h264"
ff -f lavfi -i "$(src 80x60 5 1)" -c:v libx264 -preset veryfast -bf 0 -f h264 "$tmp/small.h264"
cat "$tmp/big.h264" "$tmp/small.h264" > "$tmp/joined.h264"
ff -fflags +genpts -framerate 5 -f h264 -i "$tmp/joined.h264" -c copy "$out/size_change.mkv"
# HEVC in Matroska.
ff -f lavfi -i "$(src 160x120 12 2)" -c:v libx265 -preset veryfast -x265-params log-level=error:keyint=12 -pix_fmt yuv420p "$out/hevc.mkv"
# VP9 in WebM (WebM carries no per-stream frame count).
ff -f lavfi -i "$(src 160x120 10 2)" -c:v libvpx-vp9 -b:v 200k -g 10 -pix_fmt yuv420p "$out/vp9.webm"
# AV1 in MP4.
ff -f lavfi -i "$(src 160x120 10 2)" -c:v libaom-av1 -cpu-used 8 -crf 40 -g 10 -pix_fmt yuv420p "$out/av1.mp4"
# Animated GIF (delays of 10 cs: 10 fps) and animated WebP (100 ms: 10 fps).
ff -f lavfi -i "$(src 80x60 10 1)" -c:v gif "$out/anim.gif"
ff -f lavfi -i "$(src 80x60 10 1)" -c:v libwebp_anim -lossless 1 -loop 0 "$out/anim.webp"
# Audio only (no video stream).
ff -f lavfi -i "sine=frequency=440:duration=0.3" -c:a aac -b:a 32k "$out/audio_only.m4a"
# Corrupt: the MP4 with its middle overwritten (header intact, data broken).
python3 - "$out/h264.mp4" "$out/corrupt.mp4" <<'PY'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
mid = len(data) // 2
data[mid:mid + 2048] = bytes((i * 37) & 0xFF for i in range(2048))
open(sys.argv[2], "wb").write(bytes(data))
PY
ls -l "$out"
