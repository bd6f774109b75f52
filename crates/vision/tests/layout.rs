//! The layout a processor plans from an image's header
//! ([`Processor::planned_layout`]) is the layout preprocessing the image
//! gives: callers place an image's tokens in the prompt from the plan while
//! its pixels are computed, so a difference would misplace them.

mod common;

use iris_vision::{
    probe, AnyresProcessor, ClipProcessor, Gemma3Processor, Idefics3Processor, InternVlProcessor,
    OutputDtype, Phi4Processor, PixtralProcessor, PreprocessOptions, Processor, QwenVlProcessor,
};

/// Every committed synthetic image and the shared photos.
fn images() -> Vec<String> {
    let dir = std::path::Path::new(common::DATA).join("synthetic");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| format!("synthetic/{}", entry.unwrap().file_name().to_string_lossy()))
        .collect();
    names.sort();
    for photo in [
        "coffee.jpg",
        "chelsea.webp",
        "camera.png",
        "no_time_for_that_tiny.gif",
        "motorcycle_left.png",
    ] {
        names.push(format!("shared/{photo}"));
    }
    names
}

fn options() -> Vec<PreprocessOptions> {
    let small = PreprocessOptions {
        min_pixels: Some(56 * 56),
        max_pixels: Some(200 * 28 * 28),
        ..PreprocessOptions::default()
    };
    let bf16 = PreprocessOptions {
        dtype: OutputDtype::Bf16,
        ..PreprocessOptions::default()
    };
    let pan_and_scan = PreprocessOptions {
        pan_and_scan: Some(true),
        ..PreprocessOptions::default()
    };
    vec![PreprocessOptions::default(), small, bf16, pan_and_scan]
}

#[test]
fn the_planned_layout_is_the_output_layout() {
    let processors: Vec<Box<dyn Processor>> = vec![
        Box::new(QwenVlProcessor::qwen2_vl()),
        Box::new(QwenVlProcessor::qwen3_vl()),
        Box::new(ClipProcessor::llava_1_5()),
        Box::new(AnyresProcessor::llava_next()),
        Box::new(AnyresProcessor::llava_onevision()),
        Box::new(Gemma3Processor::gemma3()),
        Box::new(Idefics3Processor::smolvlm()),
        Box::new(PixtralProcessor::pixtral_12b()),
        Box::new(InternVlProcessor::internvl3()),
        Box::new(Phi4Processor::phi4_multimodal()),
    ];
    let (mut checked, mut turned) = (0, 0);
    for name in images() {
        let bytes = common::read(&name);
        // Files the decoder refuses (the fuzz-like fixtures) plan nothing.
        let Ok(info) = probe(&bytes) else { continue };
        turned += usize::from(info.swaps_axes);
        for processor in &processors {
            for opts in options() {
                let Ok(output) = processor.preprocess_bytes(&bytes, &opts) else {
                    continue;
                };
                let planned = processor
                    .planned_layout(&info, &opts)
                    .unwrap_or_else(|e| panic!("{name}: planned {e}, decoded fine"));
                assert_eq!(
                    planned,
                    output.layout(),
                    "{name} {} {opts:?}",
                    processor.name()
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 200, "only {checked} images checked");
    assert!(
        turned >= 3,
        "the EXIF-turned fixtures are covered ({turned})"
    );
}

#[test]
fn a_quarter_turn_swaps_the_planned_grid() {
    let bytes = common::read("synthetic/exif_rot90.png");
    let info = probe(&bytes).unwrap();
    assert!(info.swaps_axes && info.width != info.height, "{info:?}");
    assert_eq!(info.oriented_size(), (info.height, info.width));
    let qwen = QwenVlProcessor::qwen2_vl();
    let opts = PreprocessOptions::default();
    let planned = qwen.planned_layout(&info, &opts).unwrap();
    let unturned = qwen
        .layout_for(info.width as usize, info.height as usize, &opts)
        .unwrap();
    let [_, h, w] = planned.image_grid_thw.unwrap();
    assert_eq!(unturned.image_grid_thw.unwrap(), [1, w, h]);
    assert_ne!(h, w, "a non-square fixture tells the axes apart");
}

/// LLaVA-NeXT / OneVision plan tiles and tokens from the image's size
/// alone: the same as transformers' model processors count on a table of
/// sizes (tiny, extreme, at and around every grid boundary) that
/// reference.py writes.
#[test]
fn anyres_layouts_match_the_reference_table() {
    let all = common::expected();
    let table = all["anyres_layouts"].as_object().expect("anyres_layouts");
    let mut checked = 0;
    for (name, rows) in table {
        let processor = iris_vision::processor_from_config(&all["processors"][name.as_str()])
            .expect("processor config");
        for row in rows.as_array().unwrap() {
            let v: Vec<usize> = row
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            let [h, w, patches, tokens] = v[..] else {
                panic!("bad row {row}")
            };
            let layout = processor
                .layout_for(w, h, &PreprocessOptions::default())
                .unwrap();
            assert_eq!(
                (layout.shape[0], layout.num_placeholder_tokens),
                (patches, tokens),
                "{name} {w}x{h}"
            );
            assert_eq!(layout.image_sizes, Some([h, w]));
            checked += 1;
        }
    }
    assert!(checked > 1000, "only {checked} sizes");
}

/// Gemma 3 (pan and scan on), SmolVLM and Pixtral plan their frames from the
/// image's size alone: the same as transformers' own size code gives on a
/// table of sizes (tiny, extreme, around every crop and tile boundary)
/// that reference.py writes.
#[test]
fn tiled_layouts_match_the_reference_table() {
    let all = common::expected();
    let table = all["tiled_layouts"].as_object().expect("tiled_layouts");
    let pan_and_scan = PreprocessOptions {
        pan_and_scan: Some(true),
        ..PreprocessOptions::default()
    };
    let mut checked = 0;
    for (name, rows) in table {
        let processor = iris_vision::processor_from_config(&all["processors"][name.as_str()])
            .expect("processor config");
        for row in rows.as_array().unwrap() {
            let v: Vec<usize> = row
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            if name == "pixtral" {
                let [h, w, rows, cols] = v[..] else {
                    panic!("bad row {row}")
                };
                let layout = processor.layout_for(w, h, &pan_and_scan);
                if rows == 0 {
                    assert!(layout.is_err(), "pixtral {w}x{h}: the reference fails");
                } else {
                    let layout = layout.unwrap();
                    assert_eq!(layout.shape, vec![3, rows * 16, cols * 16], "{w}x{h}");
                    assert_eq!(layout.tile_grid, Some([rows, cols]), "{w}x{h}");
                    assert_eq!(layout.num_placeholder_tokens, rows * (cols + 1), "{w}x{h}");
                    assert_eq!(layout.image_sizes, Some([rows * 16, cols * 16]));
                }
                checked += 1;
                continue;
            }
            if name == "llama4" {
                // [h, w, rows, cols, resized h, resized w]: the resized size
                // is llama4.rs's unit test's.
                let layout = processor.layout_for(v[1], v[0], &pan_and_scan).unwrap();
                let (rows, cols) = (v[2], v[3]);
                let frames = if rows * cols > 1 { rows * cols + 1 } else { 1 };
                assert_eq!(layout.shape, vec![frames, 3, 336, 336], "llama4 {row}");
                assert_eq!(layout.tile_grid, Some([rows, cols]), "llama4 {row}");
                assert_eq!(layout.num_placeholder_tokens, 144 * frames, "llama4 {row}");
                checked += 1;
                continue;
            }
            let (h, w, frames) = (v[0], v[1], v[2]);
            let layout = processor.layout_for(w, h, &pan_and_scan).unwrap();
            assert_eq!(layout.shape[0], frames, "{name} {w}x{h}");
            let per_frame = match name.as_str() {
                "gemma3" | "internvl" => 256,
                _ => 81,
            };
            assert_eq!(
                layout.num_placeholder_tokens,
                per_frame * frames,
                "{name} {w}x{h}"
            );
            if let [_, _, _, rows, cols] = v[..] {
                assert_eq!(layout.tile_grid, Some([rows, cols]), "{name} {w}x{h}");
            }
            checked += 1;
        }
    }
    assert!(checked > 5000, "only {checked} sizes");
}

/// Phi-4-multimodal plans its canvas, mask and token count from the
/// image's size alone: the same as transformers' own `_preprocess` gives
/// on the size table (`phi4_layouts`: height, width, rows, cols,
/// `num_img_tokens`, the mask's ones; zeros where the reference refuses
/// the size), the dynamic path beyond 36 tiles included.
#[test]
fn phi4_layouts_match_the_reference_table() {
    let all = common::expected();
    let rows = all["phi4_layouts"].as_array().expect("phi4_layouts");
    let processor = iris_vision::processor_from_config(&all["processors"]["phi4_multimodal"])
        .expect("processor config");
    let opts = PreprocessOptions::default();
    for row in rows {
        let v: Vec<usize> = serde_json::from_value(row.clone()).unwrap_or_default();
        let [h, w, rows, cols, tokens, ones] = v[..] else {
            panic!("bad row {row}")
        };
        let layout = processor.layout_for(w, h, &opts);
        if rows == 0 {
            assert!(layout.is_err(), "{w}x{h}: the reference refuses it");
            continue;
        }
        let layout = layout.unwrap_or_else(|e| panic!("{w}x{h}: {e}"));
        assert_eq!(layout.tile_grid, Some([rows, cols]), "{w}x{h}");
        assert_eq!(layout.shape, vec![1 + rows * cols, 3, 448, 448], "{w}x{h}");
        assert_eq!(layout.num_placeholder_tokens, tokens, "{w}x{h}");
        assert_eq!(
            layout.image_sizes,
            Some([rows * 448, cols * 448]),
            "{w}x{h}"
        );
        let mask = &processor.item_tensors(&layout)[0];
        assert_eq!(
            mask.values.to_i64().iter().sum::<i64>() as usize,
            ones,
            "{w}x{h}"
        );
    }
    assert!(rows.len() > 2000, "only {} sizes", rows.len());
}
