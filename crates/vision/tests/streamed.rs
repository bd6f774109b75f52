//! The row-by-row JPEG path of `preprocess_bytes` (decode rows, resize
//! them as they come) gives exactly the bytes of decoding the whole image
//! first, and hands every file it does not stream to the whole-image path:
//! for Qwen-VL, and for the families whose tensor is one resize of the
//! whole image (LLaVA-1.5's centre crop, Pixtral, Gemma 3 without
//! pan-and-scan) or cut from several resizes of it (LLaVA-NeXT, OneVision,
//! InternVL).

mod common;

use common::read;
use iris_vision::{
    decode, processor_from_config, thread_images_decoded_ahead, thread_streamed_images,
    AnyresProcessor, ClipProcessor, DecodeLimits, Gemma3Processor, InternVlProcessor,
    Llama4Processor, OutputDtype, PixtralProcessor, PreprocessOptions, Processor, QwenVlProcessor,
};

fn qwen2() -> Box<dyn Processor> {
    Box::new(QwenVlProcessor::qwen2_vl())
}

fn qwen3() -> Box<dyn Processor> {
    Box::new(QwenVlProcessor::qwen3_vl())
}

/// `preprocess_bytes` against decode-then-`preprocess`, byte for byte, in
/// both dtypes; returns how many of the calls streamed.
fn same_bytes(p: &dyn Processor, bytes: &[u8], opts: PreprocessOptions, what: &str) -> u64 {
    let mut streamed = 0;
    for dtype in [OutputDtype::F32, OutputDtype::Bf16] {
        let opts = PreprocessOptions { dtype, ..opts };
        let before = thread_streamed_images();
        let got = p.preprocess_bytes(bytes, &opts).expect(what);
        streamed += thread_streamed_images() - before;
        let image = decode(bytes, &opts.limits).expect(what);
        let expected = p.preprocess(&image, &opts).expect(what);
        assert!(
            got.pixel_values.as_bytes() == expected.pixel_values.as_bytes(),
            "{what} {dtype:?}: pixel values differ"
        );
        assert_eq!(got.shape, expected.shape, "{what}");
        assert_eq!(got.image_grid_thw, expected.image_grid_thw, "{what}");
        assert_eq!(got.resized_size, expected.resized_size, "{what}");
    }
    streamed
}

/// Pixel bounds that make smart resize change the height of small images.
fn small_bounds() -> PreprocessOptions {
    PreprocessOptions {
        min_pixels: Some(56 * 56 * 4),
        ..PreprocessOptions::default()
    }
}

/// JPEGs the row path takes: every sampling, odd sizes, 1×1, restart
/// markers, grey, untransformed RGB, two photos.
const PLAIN_JPEGS: [&str; 11] = [
    "synthetic/baseline.jpg",
    "synthetic/q420_35x29.jpg",
    "synthetic/q422_41x19.jpg",
    "synthetic/q444_37x23.jpg",
    "synthetic/q420_restart_rows.jpg",
    "synthetic/q444_restart_blocks.jpg",
    "synthetic/q420_1x1.jpg",
    "synthetic/grey.jpg",
    "synthetic/rgb_keep_rgb.jpg",
    "shared/coffee.jpg",
    "shared/motorcycle_1080p.jpg",
];

#[test]
fn plain_jpegs_stream_with_identical_output() {
    for file in PLAIN_JPEGS {
        let bytes = read(file);
        for (name, p) in [("qwen2", qwen2()), ("qwen3", qwen3())] {
            let what = format!("{file} {name}");
            let streamed = same_bytes(p.as_ref(), &bytes, small_bounds(), &what);
            let info = iris_vision::probe(&bytes).expect("probe");
            let opts = small_bounds();
            let target = match name {
                "qwen2" => QwenVlProcessor::qwen2_vl(),
                _ => QwenVlProcessor::qwen3_vl(),
            }
            .target_size(info.height as usize, info.width as usize, &opts)
            .expect("target size");
            // Streams exactly when the resize changes the height.
            let expect = if target.0 != info.height as usize {
                2
            } else {
                0
            };
            assert_eq!(streamed, expect, "{what}: streamed {streamed} of 2 calls");
        }
    }
}

#[test]
fn width_unchanged_streams_straight_into_the_vertical_pass() {
    // 56 wide stays 56 wide under Qwen2-VL's factor 28; 50 rows become 56.
    let img = image::RgbImage::from_fn(56, 50, |x, y| {
        image::Rgb([(x * 4) as u8, (y * 5) as u8, (x * y) as u8])
    });
    let mut bytes = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 90)
        .encode_image(&img)
        .expect("encode");
    let p = qwen2();
    let opts = PreprocessOptions::default();
    let out = p.preprocess_bytes(&bytes, &opts).expect("preprocess");
    assert_eq!(out.resized_size, (56, 56));
    assert_eq!(same_bytes(p.as_ref(), &bytes, opts, "56x50"), 2);
}

#[test]
fn other_files_fall_back_to_the_whole_image_path() {
    let files = [
        "synthetic/progressive.jpg",
        "synthetic/grey_odd_progressive.jpg",
        "synthetic/q422_progressive_101x67.jpg",
        "synthetic/cmyk.jpg",
        "synthetic/cmyk_no_adobe.jpg",
        "synthetic/ycck.jpg",
        "synthetic/exif_rot270.jpg",
        "synthetic/rgb_333x217.png",
        "synthetic/rgb_20x2500.png",
    ];
    for file in files {
        let bytes = read(file);
        let streamed = same_bytes(qwen2().as_ref(), &bytes, small_bounds(), file);
        assert_eq!(streamed, 0, "{file} must not stream");
    }
}

/// Options for an image alone in the pool (split across threads).
fn alone() -> PreprocessOptions {
    PreprocessOptions {
        intra_image_parallel: true,
        ..PreprocessOptions::default()
    }
}

#[test]
fn an_image_alone_in_the_pool_streams_its_rows_decoded_ahead() {
    let bytes = read("shared/motorcycle_1080p.jpg");
    let families: [(&str, Box<dyn Processor>); 9] = [
        ("qwen2", qwen2()),
        ("llama4", Box::new(Llama4Processor::llama4())),
        ("qwen3", qwen3()),
        ("llava", Box::new(ClipProcessor::llava_1_5())),
        ("pixtral", Box::new(PixtralProcessor::pixtral_12b())),
        ("gemma3", Box::new(Gemma3Processor::gemma3())),
        ("llava_next", Box::new(AnyresProcessor::llava_next())),
        ("internvl", Box::new(InternVlProcessor::internvl3())),
        (
            "llava_onevision",
            Box::new(AnyresProcessor::llava_onevision()),
        ),
    ];
    for (name, p) in &families {
        let before = thread_images_decoded_ahead();
        let streamed = same_bytes(p.as_ref(), &bytes, alone(), name);
        let ahead = thread_images_decoded_ahead() - before;
        // OneVision's grid is this photo's own size: decoded whole.
        let expect = if *name == "llava_onevision" { 0 } else { 2 };
        assert_eq!((streamed, ahead), (expect, expect), "{name}");
    }
    // Below a megapixel an image is not split: rows on the calling thread.
    let small = read("shared/coffee.jpg");
    let before = thread_images_decoded_ahead();
    assert_eq!(same_bytes(qwen2().as_ref(), &small, alone(), "coffee"), 2);
    assert_eq!(thread_images_decoded_ahead(), before);
}

#[test]
fn corrupt_and_truncated_jpegs_fail_as_the_whole_image_path_does() {
    let bytes = read("shared/coffee.jpg");
    let p = qwen2();
    let opts = PreprocessOptions::default();
    let mut cases = vec![("truncated", bytes[..bytes.len() * 2 / 3].to_vec())];
    // Garbage in the entropy-coded data of the last rows only: no output
    // row may need them, yet the file must be refused.
    let mut tail = bytes.clone();
    let n = tail.len();
    for b in &mut tail[n - 200..n - 2] {
        *b = 0xFF;
    }
    cases.push(("corrupt tail", tail));
    for (what, bad) in cases {
        let whole = decode(&bad, &DecodeLimits::default());
        assert!(whole.is_err(), "{what}: the whole-image decoder refuses it");
        for opts in [opts, alone()] {
            let before = thread_streamed_images();
            let streamed = p.preprocess_bytes(&bad, &opts);
            assert!(streamed.is_err(), "{what}: so does the streamed path");
            assert_eq!(thread_streamed_images(), before, "{what}");
        }
    }
    // A 1080p photo cut short, decoded ahead: the error reaches the caller.
    let photo = read("shared/motorcycle_1080p.jpg");
    let cut = &photo[..photo.len() / 2];
    let before = thread_images_decoded_ahead();
    assert!(p.preprocess_bytes(cut, &alone()).is_err());
    assert_eq!(thread_images_decoded_ahead(), before + 1);
    // Limits are checked before any row is decoded.
    let tight = PreprocessOptions {
        limits: DecodeLimits {
            max_pixels: 1000,
            ..DecodeLimits::default()
        },
        ..opts
    };
    assert!(p.preprocess_bytes(&bytes, &tight).is_err());
}

#[test]
fn config_built_processors_stream_too() {
    let config = serde_json::json!({
        "image_processor_type": "Qwen2VLImageProcessor",
        "min_pixels": 3136, "max_pixels": 12845056,
        "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2
    });
    let p = processor_from_config(&config).expect("processor");
    let bytes = read("shared/coffee.jpg");
    let opts = PreprocessOptions::default();
    assert_eq!(same_bytes(p.as_ref(), &bytes, opts, "coffee"), 2);
}

#[test]
fn one_resize_families_stream_with_identical_output() {
    let families: [(&str, Box<dyn Processor>); 3] = [
        ("llava", Box::new(ClipProcessor::llava_1_5())),
        ("pixtral", Box::new(PixtralProcessor::pixtral_12b())),
        ("gemma3", Box::new(Gemma3Processor::gemma3())),
    ];
    let opts = PreprocessOptions::default();
    for file in PLAIN_JPEGS {
        let bytes = read(file);
        let info = iris_vision::probe(&bytes).expect("probe");
        for (name, p) in &families {
            let what = format!("{file} {name}");
            let streamed = same_bytes(p.as_ref(), &bytes, opts, &what);
            let out = p.preprocess_bytes(&bytes, &opts).expect("preprocess");
            let out_h = out.resized_size.1;
            // Streams exactly when the resize changes the height (Gemma 3's
            // and LLaVA's always do here; Pixtral keeps small images' rows).
            let expect = if out_h != info.height as usize { 2 } else { 0 };
            assert_eq!(streamed, expect, "{what}: streamed {streamed} of 2 calls");
        }
    }
}

#[test]
fn pan_and_scan_crops_take_the_whole_image_path() {
    let p = Gemma3Processor::gemma3();
    let opts = PreprocessOptions {
        pan_and_scan: Some(true),
        ..PreprocessOptions::default()
    };
    let bytes = read("shared/motorcycle_1080p.jpg");
    let out = p.preprocess_bytes(&bytes, &opts).expect("preprocess");
    assert!(out.shape[0] > 1, "crops were made: {:?}", out.shape);
    assert_eq!(same_bytes(&p, &bytes, opts, "pan-and-scan"), 0);
}

#[test]
fn several_resize_families_stream_with_identical_output() {
    let families: [(&str, Box<dyn Processor>); 5] = [
        ("llava_next", Box::new(AnyresProcessor::llava_next())),
        ("llama4", Box::new(Llama4Processor::llama4())),
        (
            "llava_onevision",
            Box::new(AnyresProcessor::llava_onevision()),
        ),
        ("internvl", Box::new(InternVlProcessor::internvl3())),
        (
            "internvl_slow",
            Box::new(InternVlProcessor {
                fast: false,
                ..InternVlProcessor::internvl3()
            }),
        ),
    ];
    let opts = PreprocessOptions::default();
    for file in PLAIN_JPEGS {
        let bytes = read(file);
        for (name, p) in &families {
            let what = format!("{file} {name}");
            let streamed = same_bytes(p.as_ref(), &bytes, opts, &what);
            assert!(
                streamed == 0 || streamed == 2,
                "{what}: streamed {streamed}"
            );
        }
    }
    // The 1080p photo: LLaVA-NeXT's base tile and 672x378 grid, Llama 4's
    // canvas and global tile, and InternVL's canvas and thumbnail are
    // resized from the decoder's rows;
    // OneVision's grid is the photo's own size, so it is decoded whole.
    let bytes = read("shared/motorcycle_1080p.jpg");
    for (name, p) in &families {
        let streamed = same_bytes(p.as_ref(), &bytes, opts, name);
        let expect = if *name == "llava_onevision" { 0 } else { 2 };
        assert_eq!(streamed, expect, "{name}: streamed {streamed} of 2 calls");
    }
    // OneVision's multi-image squares: decoded whole.
    let squares = PreprocessOptions {
        multi_image: true,
        ..opts
    };
    assert_eq!(
        same_bytes(families[2].1.as_ref(), &bytes, squares, "squares"),
        0
    );
}
