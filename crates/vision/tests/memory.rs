//! Memory before decoding: [`probe`] reads what decoding will need from
//! the header alone, and [`Processor::memory_needed`] is an upper bound of
//! the bytes decoding and preprocessing really allocate (checked with a
//! global allocator that tracks live bytes and their peak). A header that
//! declares more than its data holds leaves no scratch behind.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Cursor;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{png_with_header, read, Rng, DATA};
use iris_vision::{
    decode, parked_scratch_bytes, probe, thread_scratch_bytes, AnyresProcessor, ClipProcessor,
    DecodeLimits, Gemma3Processor, Idefics3Processor, ImageFormat, ImageInfo, InternVlProcessor,
    Llama4Processor, OutputDtype, Phi4Processor, PixtralProcessor, PreprocessOptions, Processor,
    QwenVlProcessor, SCRATCH_KEEP_TOTAL_BYTES,
};

struct Tracking;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            grew(new_size - layout.size());
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Fixed allocations a decode may make whatever the image size (inflate
/// window, Huffman and LZW tables, resize kernels, a band of rows).
const SLACK: usize = 1 << 20;

/// Peak bytes allocated (and not yet freed before the peak) while `f` runs.
fn peak_of<R>(f: impl FnOnce() -> R) -> (usize, R) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let result = f();
    (PEAK.load(Ordering::Relaxed) - base, result)
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

fn png16_rgba(w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let encoder = image::codecs::png::PngEncoder::new(&mut out);
    image::ImageEncoder::write_image(
        encoder,
        &noise((w * h * 8) as usize, 1),
        w,
        h,
        image::ExtendedColorType::Rgba16,
    )
    .unwrap();
    out
}

fn bmp_rgb(w: u32, h: u32) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    image::codecs::bmp::BmpEncoder::new(&mut out)
        .encode(
            &noise((w * h * 3) as usize, 2),
            w,
            h,
            image::ExtendedColorType::Rgb8,
        )
        .unwrap();
    out.into_inner()
}

fn webp_lossless(w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    image::codecs::webp::WebPEncoder::new_lossless(&mut out)
        .encode(
            &noise((w * h * 4) as usize, 3),
            w,
            h,
            image::ExtendedColorType::Rgba8,
        )
        .unwrap();
    out
}

fn jpeg(w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
        .encode(
            &noise((w * h * 3) as usize, 5),
            w,
            h,
            image::ExtendedColorType::Rgb8,
        )
        .unwrap();
    out
}

/// A GIF whose only frame (`fw`×`fh` at `left`, `top`) sticks out of a
/// `sw`×`sh` logical screen.
fn gif_frame_outside(sw: u16, sh: u16, (left, top, fw, fh): (u16, u16, u16, u16)) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let palette: Vec<u8> = (0..=255u8).flat_map(|i| [i, 255 - i, i / 2]).collect();
        let mut encoder = gif::Encoder::new(&mut out, sw, sh, &palette).unwrap();
        let mut frame = gif::Frame {
            left,
            top,
            width: fw,
            height: fh,
            ..gif::Frame::default()
        };
        frame.buffer = noise(usize::from(fw) * usize::from(fh), 4).into();
        encoder.write_frame(&frame).unwrap();
    }
    out
}

fn synthetic_files() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(DATA).join("synthetic");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect()
}

/// Every image of the corpus, through every processor kind (Gemma 3 with
/// pan and scan, OneVision alone and in a multi-image prompt) and both
/// dtypes, allocates at most what `memory_needed` said from its header.
fn estimates_bound_the_real_peak() {
    let mut corpus = synthetic_files();
    corpus.push(("png16 rgba".into(), png16_rgba(700, 500)));
    corpus.push(("bmp".into(), bmp_rgb(640, 480)));
    corpus.push(("webp lossless".into(), webp_lossless(640, 480)));
    corpus.push((
        "gif canvas".into(),
        gif_frame_outside(10, 10, (300, 200, 40, 30)),
    ));
    corpus.push(("1080p jpeg".into(), jpeg(1920, 1080)));
    let processors: [&dyn Processor; 10] = [
        &QwenVlProcessor::qwen2_vl(),
        &ClipProcessor::llava_1_5(),
        &AnyresProcessor::llava_next(),
        &AnyresProcessor::llava_onevision(),
        &Gemma3Processor::gemma3(),
        &Idefics3Processor::smolvlm(),
        &PixtralProcessor::pixtral_12b(),
        &InternVlProcessor::internvl3(),
        &Llama4Processor::llama4(),
        &Phi4Processor::phi4_multimodal(),
    ];
    for (name, bytes) in &corpus {
        let Ok(info) = probe(bytes) else {
            continue; // not an image the corpus expects to decode
        };
        let variants = [OutputDtype::F32, OutputDtype::Bf16]
            .into_iter()
            .flat_map(|dtype| [(dtype, false), (dtype, true)]);
        for processor in processors {
            for (dtype, multi_image) in variants.clone() {
                let opts = PreprocessOptions {
                    dtype,
                    pan_and_scan: Some(true),
                    multi_image,
                    ..PreprocessOptions::default()
                };
                let Ok(need) = processor.memory_needed(&info, &opts) else {
                    continue; // refused by the processor's limits
                };
                // A fresh thread: no scratch to reuse.
                let (peak, output) = std::thread::scope(|s| {
                    s.spawn(|| peak_of(|| processor.preprocess_bytes(bytes, &opts)))
                        .join()
                        .unwrap()
                });
                if output.is_err() {
                    continue;
                }
                assert!(
                    peak as u64 <= need + SLACK as u64,
                    "{name} ({}, {dtype:?}, multi-image {multi_image}): allocated {peak} bytes, estimated {need}",
                    processor.name()
                );
            }
        }
    }
}

/// The probe reads the native layout, the GIF canvas and the JPEG extras.
fn probe_reads_what_decoding_needs() {
    let info = probe(&png16_rgba(70, 50)).unwrap();
    assert_eq!(
        (
            info.format,
            info.width,
            info.height,
            info.work_bytes_per_pixel
        ),
        (ImageFormat::Png, 70, 50, 8)
    );
    assert_eq!(info.decode_bytes(), 70 * 50 * 11);
    // Grey PNG: at least the 3 bytes per pixel orientation may need.
    let grey = probe(&read("synthetic/grey_L.png")).unwrap();
    assert_eq!(grey.work_bytes_per_pixel, 3);
    // JPEG: coefficients (2 per sample) plus the CMYK samples or the
    // orientation copy.
    let baseline = probe(&read("synthetic/baseline.jpg")).unwrap();
    assert_eq!(baseline.work_bytes_per_pixel, 6);
    assert_eq!(
        probe(&read("synthetic/cmyk.jpg"))
            .unwrap()
            .work_bytes_per_pixel,
        12
    );
    assert_eq!(
        probe(&read("synthetic/exif_rot270.jpg"))
            .unwrap()
            .work_bytes_per_pixel,
        9
    );
    // GIF: the canvas grows to hold a frame outside the logical screen,
    // exactly as decoding builds it.
    let gif = gif_frame_outside(10, 10, (300, 200, 40, 30));
    let info = probe(&gif).unwrap();
    assert_eq!(
        (info.width, info.height, info.work_bytes_per_pixel),
        (340, 230, 2)
    );
    let decoded = decode(&gif, &DecodeLimits::default()).unwrap();
    assert_eq!(decoded.dimensions(), (340, 230));
    let webp = probe(&webp_lossless(64, 32)).unwrap();
    assert_eq!(
        (webp.format, webp.width, webp.height),
        (ImageFormat::WebP, 64, 32)
    );
    assert!(webp.work_bytes_per_pixel >= 4 + 4, "{webp:?}");
}

/// A 57-byte PNG declaring 9000×9000: the probe refuses it as truncated
/// (its data cannot inflate to that size) without allocating in
/// proportion, and so does decoding; the limits apply to estimates as to
/// decoding.
fn a_lying_header_costs_nothing() {
    let bytes = png_with_header(9000, 9000);
    let (peak, probed) = peak_of(|| probe(&bytes));
    let err = probed.unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    assert!(peak < SLACK, "probing allocated {peak} bytes");
    let (peak, decoded) = peak_of(|| decode(&bytes, &DecodeLimits::default()));
    assert!(decoded.is_err());
    assert!(peak < SLACK, "decoding allocated {peak} bytes");
    let huge = ImageInfo {
        format: ImageFormat::Png,
        width: 100_000,
        height: 100_000,
        work_bytes_per_pixel: 3,
        swaps_axes: false,
    };
    assert!(QwenVlProcessor::qwen2_vl()
        .memory_needed(&huge, &PreprocessOptions::default())
        .is_err());
}

fn solid_png(w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let encoder = image::codecs::png::PngEncoder::new(&mut out);
    image::ImageEncoder::write_image(
        encoder,
        &vec![90u8; (w * h * 3) as usize],
        w,
        h,
        image::ExtendedColorType::Rgb8,
    )
    .unwrap();
    out
}

/// After an image whose buffers exceed the per-thread bound, the thread
/// keeps no scratch; after a 1080p-sized one it keeps its buffers.
fn a_huge_image_leaves_no_scratch() {
    let (small, huge) = (solid_png(1920, 1080), solid_png(4000, 4500));
    std::thread::spawn(move || {
        decode(&small, &DecodeLimits::default()).unwrap();
        assert!(thread_scratch_bytes() >= 1920 * 1080 * 3);
        decode(&huge, &DecodeLimits::default()).unwrap();
        assert_eq!(thread_scratch_bytes(), 0);
    })
    .join()
    .unwrap();
}

/// Each thread keeps a large image's scratch (under its own bound), but
/// all together keep at most the total: the threads past it free theirs.
fn threads_together_keep_at_most_the_total() {
    // 3000×3000 RGB: decoded and raw buffers ≈ 54 MB, under the
    // per-thread bound.
    let png = solid_png(3000, 3000);
    let threads = SCRATCH_KEEP_TOTAL_BYTES / 54_000_000 + 2;
    let barrier = std::sync::Barrier::new(threads + 1);
    let kept: Vec<usize> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    decode(&png, &DecodeLimits::default()).unwrap();
                    let kept = thread_scratch_bytes();
                    barrier.wait();
                    barrier.wait();
                    kept
                })
            })
            .collect();
        barrier.wait();
        assert!(parked_scratch_bytes() <= SCRATCH_KEEP_TOTAL_BYTES);
        barrier.wait();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(kept.iter().filter(|&&k| k == 0).count() >= 2, "{kept:?}");
    assert!(kept.iter().any(|&k| k >= 54_000_000), "{kept:?}");
    assert!(kept.iter().sum::<usize>() <= SCRATCH_KEEP_TOTAL_BYTES);
}

/// One test function: the allocator's counters are process-wide.
#[test]
fn memory_is_known_before_decoding() {
    probe_reads_what_decoding_needs();
    a_lying_header_costs_nothing();
    a_huge_image_leaves_no_scratch();
    estimates_bound_the_real_peak();
    threads_together_keep_at_most_the_total();
}
