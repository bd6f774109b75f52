//! What a vision-language family's multimodal items must look like, so
//! that the reference engine refuses (with `INVALID_ARGUMENT`) a request
//! a real worker of the family would misread.
//!
//! The family is the model directory's `image_processor_type`; each
//! item's `encoder_input` shape and the model-specific tensors it needs
//! follow that family's Hugging Face processor (`pixel_values` per image):
//!
//! | family | `encoder_input` | also |
//! |---|---|---|
//! | Qwen2/2.5/3-VL | `[t·h·w, C·T·P·P]` | `image_grid_thw` `[1, 3]` whose product is the rows; `rows / merge²` tokens |
//! | LLaVA-1.5 (CLIP) | `[3, S, S]` (`crop_size`) | |
//! | LLaVA-NeXT, OneVision | `[tiles, 3, S, S]` | `image_sizes` `[1, 2]` |
//! | Gemma 3 | `[crops, 3, S, S]` | one placeholder run per crop |
//! | Idefics3, SmolVLM | `[frames, 3, S, S]` | one placeholder run per frame; `pixel_attention_mask` uint8 `[frames, S, S]` |
//! | Pixtral | `[3, H, W]`, multiples of the patch | `image_sizes` `= [H, W]`; one run per patch row, `H·W / P²` tokens |
//! | InternVL | `[patches, 3, S, S]` | `image_num_patches` `= [patches]`; one run, the same tokens per patch |
//! | Llama 4 | `[tiles (+ 1 global), 3, S, S]` | `aspect_ratios` `[rows, cols]` with `rows·cols` tiles (+ 1 when more than one); one run per frame, all of one length |
//! | Phi-4-multimodal | `[1 + tiles, 3, S, S]` | `image_sizes` `[H, W]` in whole tiles, `H·W / S²` tiles; float32 `image_attention_mask` `[1 + tiles, S/P, S/P]`; `num_img_tokens` `=` the one run's length |
//!
//! Whatever the family, every placeholder range holds only the item's
//! placeholder token, and the image items' ranges cover every image
//! token of the prompt.

use std::sync::atomic::{AtomicU64, Ordering};

use iris_model::ModelDir;
use iris_proto::common::Modality;
use iris_proto::scheduler::{MultimodalItem, TensorData};
use iris_proto::tensor;
use serde_json::Value;
use tonic::Status;

/// The item layout a family's processor gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Qwen-VL: flattened patches; `merge` patches per side make a token.
    Qwen { merge: u64 },
    /// CLIP (LLaVA-1.5): one `[3, side, side]` image.
    Clip { side: u64 },
    /// LLaVA-NeXT / OneVision: `[tiles, 3, side, side]` with `image_sizes`.
    Anyres { side: u64 },
    /// Gemma 3: `[crops, 3, side, side]`, a run per crop.
    Crops { side: u64 },
    /// Idefics3 / SmolVLM: `[frames, 3, side, side]`, a run per frame,
    /// with the uint8 `pixel_attention_mask` `[frames, side, side]`.
    Idefics3 { side: u64 },
    /// Pixtral: `[3, H, W]`, a run of `W / patch` tokens per patch row.
    Pixtral { patch: u64 },
    /// InternVL: `[patches, 3, side, side]` with `image_num_patches`, one run.
    Internvl { side: u64 },
    /// Llama 4: `[frames, 3, side, side]` with `aspect_ratios`, a run per frame.
    Llama4 { side: u64 },
    /// Phi-4-multimodal: `[1 + tiles, 3, side, side]` with `image_sizes`,
    /// `image_attention_mask` (`side / patch` cells a side) and
    /// `num_img_tokens`, one run.
    Phi4 { side: u64, patch: u64 },
    /// No (known) image processor: only the placeholders are checked.
    Unknown,
}

/// The checks of one model's multimodal items.
#[derive(Debug)]
pub struct ItemRules {
    pub layout: Layout,
    /// `image_token_id` / `video_token_id` of `config.json`.
    pub image_token: Option<u32>,
    pub video_token: Option<u32>,
    /// Image tokens of the prompts whose items passed (a metric).
    image_tokens: AtomicU64,
}

impl ItemRules {
    /// The rules of the model in `dir`.
    pub fn of(dir: &ModelDir) -> Self {
        ItemRules {
            layout: dir
                .preprocessor_config
                .as_ref()
                .map_or(Layout::Unknown, layout),
            image_token: dir.config.image_token_id,
            video_token: dir.config.video_token_id,
            image_tokens: AtomicU64::new(0),
        }
    }

    /// Rules that check nothing (`--no-mm-item-checks`).
    pub fn unchecked() -> Self {
        ItemRules {
            layout: Layout::Unknown,
            image_token: None,
            video_token: None,
            image_tokens: AtomicU64::new(0),
        }
    }

    /// Image tokens of the prompts whose items passed, since start.
    pub fn image_tokens(&self) -> u64 {
        self.image_tokens.load(Ordering::Relaxed)
    }

    /// Checks `items` against the prompt `ids`, counting its image tokens
    /// when they pass.
    pub fn check(&self, items: &[MultimodalItem], ids: &[u32]) -> Result<(), Status> {
        for (index, item) in items.iter().enumerate() {
            self.check_runs(index, item, ids)?;
            // An item without `encoder_input` is encoded elsewhere (EPD).
            if item.modality == Modality::Image as i32 && item.encoder_input.is_some() {
                check_layout(self.layout, index, item)?;
            }
        }
        let tokens = self.check_coverage(items, ids)?;
        self.image_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Every position of the item's ranges holds its placeholder token.
    fn check_runs(&self, index: usize, item: &MultimodalItem, ids: &[u32]) -> Result<(), Status> {
        let token = item.placeholder_token_id.or(match item.modality {
            m if m == Modality::Video as i32 => self.video_token,
            _ => self.image_token,
        });
        let Some(token) = token else {
            return Ok(());
        };
        for range in &item.placeholders {
            let (start, end) = (
                range.offset as usize,
                (range.offset + range.length) as usize,
            );
            let span = ids.get(start..end).unwrap_or_default();
            if let Some(at) = span.iter().position(|&t| t != token) {
                return Err(invalid(format!(
                    "mm item {index}: placeholder range {start}..{end} holds token {} at {}, not the placeholder token {token}",
                    span[at],
                    start + at
                )));
            }
        }
        Ok(())
    }

    /// The image items' ranges cover every image token of the prompt;
    /// returns how many there are.
    fn check_coverage(&self, items: &[MultimodalItem], ids: &[u32]) -> Result<usize, Status> {
        let Some(image) = self.image_token else {
            return Ok(0);
        };
        let in_prompt = ids.iter().filter(|&&t| t == image).count();
        let covered: usize = items
            .iter()
            .filter(|i| i.modality == Modality::Image as i32)
            .flat_map(|i| &i.placeholders)
            .map(|r| r.length as usize)
            .sum();
        if in_prompt != covered {
            return Err(invalid(format!(
                "the prompt has {in_prompt} image tokens ({image}) but the image items' placeholder ranges cover {covered}"
            )));
        }
        Ok(in_prompt)
    }
}

fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

/// The layout `preprocessor_config.json` names; [`Layout::Unknown`] when
/// it lacks the size the checks need.
fn layout(config: &Value) -> Layout {
    let named = named_layout(config);
    match named {
        Layout::Clip { side: 0 }
        | Layout::Anyres { side: 0 }
        | Layout::Crops { side: 0 }
        | Layout::Idefics3 { side: 0 }
        | Layout::Internvl { side: 0 }
        | Layout::Llama4 { side: 0 }
        | Layout::Phi4 { side: 0, .. }
        | Layout::Phi4 { patch: 0, .. }
        | Layout::Pixtral { patch: 0 } => Layout::Unknown,
        known => known,
    }
}

fn named_layout(config: &Value) -> Layout {
    let kind = config["image_processor_type"].as_str().unwrap_or_default();
    let kind = kind.trim_end_matches("Fast");
    let side = |v: &Value| v.as_u64().unwrap_or(0);
    match kind {
        "Qwen2VLImageProcessor" | "Qwen2_5_VLImageProcessor" => Layout::Qwen {
            merge: config["merge_size"].as_u64().unwrap_or(2),
        },
        "CLIPImageProcessor" => Layout::Clip {
            side: side(&config["crop_size"]["height"]),
        },
        "LlavaNextImageProcessor" => Layout::Anyres {
            side: side(&config["crop_size"]["height"]),
        },
        "LlavaOnevisionImageProcessor" => Layout::Anyres {
            side: side(&config["size"]["height"]),
        },
        "Gemma3ImageProcessor" => Layout::Crops {
            side: side(&config["size"]["height"]),
        },
        "Idefics3ImageProcessor" => Layout::Idefics3 {
            side: side(&config["max_image_size"]["longest_edge"]),
        },
        "GotOcr2ImageProcessor" => Layout::Internvl {
            side: side(&config["size"]["height"]),
        },
        "Llama4ImageProcessor" => Layout::Llama4 {
            side: side(&config["size"]["height"]),
        },
        "Phi4MultimodalImageProcessor" => Layout::Phi4 {
            side: side(&config["size"]["height"]),
            patch: side(&config["patch_size"]),
        },
        "PixtralImageProcessor" => Layout::Pixtral {
            patch: match &config["patch_size"] {
                Value::Object(o) => o.get("height").and_then(Value::as_u64).unwrap_or(16),
                other => other.as_u64().unwrap_or(16),
            },
        },
        _ => Layout::Unknown,
    }
}

/// The item's shape and tensors against `layout`.
fn check_layout(layout: Layout, index: usize, item: &MultimodalItem) -> Result<(), Status> {
    let shape: Vec<u64> = item
        .encoder_input
        .as_ref()
        .map(|t| t.shape.iter().map(|&d| u64::from(d)).collect())
        .unwrap_or_default();
    let fail = |what: String| invalid(format!("mm item {index} ({layout:?}): {what}"));
    let runs = item.placeholders.len() as u64;
    let tokens: u64 = item.placeholders.iter().map(|r| u64::from(r.length)).sum();
    match layout {
        Layout::Unknown => Ok(()),
        Layout::Qwen { merge } => {
            let [t, h, w] = ints(item, "image_grid_thw", 3).map_err(fail)?[..] else {
                return Err(fail("image_grid_thw is not 3 values".into()));
            };
            let rows = (t * h * w) as u64;
            expect(shape.len() == 2 && shape[0] == rows, || {
                fail(format!(
                    "pixel_values shape {shape:?} is not [{rows}, _] (t·h·w)"
                ))
            })?;
            expect(tokens * merge * merge == rows, || {
                fail(format!(
                    "{tokens} placeholder tokens for {rows} patches merged {merge}×{merge}"
                ))
            })
        }
        Layout::Clip { side } => expect(shape == [3, side, side], || {
            fail(format!(
                "pixel_values shape {shape:?} is not [3, {side}, {side}]"
            ))
        }),
        Layout::Anyres { side } => {
            square_tiles(&shape, side).map_err(fail)?;
            ints(item, "image_sizes", 2).map_err(fail).map(|_| ())
        }
        Layout::Crops { side } => check_crops(&shape, side, runs).map_err(fail),
        Layout::Idefics3 { side } => check_crops(&shape, side, runs)
            .and_then(|()| check_pixel_mask(&shape, side, item))
            .map_err(fail),
        Layout::Pixtral { patch } => check_pixtral(&shape, patch, item, runs, tokens).map_err(fail),
        Layout::Internvl { side } => check_internvl(&shape, side, item, runs, tokens).map_err(fail),
        Layout::Llama4 { side } => check_llama4(&shape, side, item).map_err(fail),
        Layout::Phi4 { side, patch } => {
            check_phi4(&shape, (side, patch), item, runs, tokens).map_err(fail)
        }
    }
}

/// `[crops, 3, side, side]`, one placeholder run per crop.
fn check_crops(shape: &[u64], side: u64, runs: u64) -> Result<(), String> {
    square_tiles(shape, side)?;
    if runs != shape[0] {
        return Err(format!("{runs} placeholder runs for {} crops", shape[0]));
    }
    Ok(())
}

/// Idefics3's uint8 `pixel_attention_mask` `[frames, side, side]` beside
/// `[frames, 3, side, side]` pixels.
fn check_pixel_mask(shape: &[u64], side: u64, item: &MultimodalItem) -> Result<(), String> {
    let mask = item.model_specific_tensors.get("pixel_attention_mask");
    let have = mask.map(|t| (t.shape.clone(), t.dtype.as_str()));
    let want = vec![shape[0] as u32, side as u32, side as u32];
    if have.as_ref().map(|(s, d)| (s, *d)) != Some((&want, "uint8")) {
        return Err(format!(
            "pixel_attention_mask {have:?} is not uint8 {want:?}"
        ));
    }
    Ok(())
}

/// `[1 + tiles, 3, side, side]` with `image_sizes = [H, W]`, the canvas
/// of `H·W / side²` tiles; the float32 `image_attention_mask`
/// `[1 + tiles, side / patch, side / patch]`; one run of
/// `num_img_tokens` tokens.
fn check_phi4(
    shape: &[u64],
    (side, patch): (u64, u64),
    item: &MultimodalItem,
    runs: u64,
    tokens: u64,
) -> Result<(), String> {
    square_tiles(shape, side)?;
    let &[h, w] = &ints(item, "image_sizes", 2)?[..] else {
        return Err("image_sizes is not 2 values".into());
    };
    let (h, w) = (h.max(0) as u64, w.max(0) as u64);
    let canvas = (h / side) * (w / side);
    if h % side != 0 || w % side != 0 || shape[0] != 1 + canvas {
        return Err(format!(
            "{} frames for image_sizes [{h}, {w}] (1 + {canvas} tiles of {side} expected)",
            shape[0]
        ));
    }
    let cells = side / patch;
    let mask = item.model_specific_tensors.get("image_attention_mask");
    let mask_shape = mask.map(|t| (t.shape.clone(), t.dtype.as_str()));
    let want = vec![shape[0] as u32, cells as u32, cells as u32];
    if mask_shape.as_ref().map(|(s, d)| (s, *d)) != Some((&want, "float32")) {
        return Err(format!(
            "image_attention_mask {mask_shape:?} is not float32 {want:?}"
        ));
    }
    let counted = ints(item, "num_img_tokens", 1)?;
    if runs != 1 || counted != [tokens as i64] {
        return Err(format!(
            "{runs} placeholder runs of {tokens} tokens for num_img_tokens {counted:?} (one run of them)"
        ));
    }
    Ok(())
}

/// `[frames, 3, side, side]` where `aspect_ratios = [rows, cols]` gives
/// `rows·cols` tiles, plus a global tile when more than one; a run of the
/// same length per frame.
fn check_llama4(shape: &[u64], side: u64, item: &MultimodalItem) -> Result<(), String> {
    square_tiles(shape, side)?;
    let &[rows, cols] = &ints(item, "aspect_ratios", 2)?[..] else {
        return Err("aspect_ratios is not 2 values".into());
    };
    let tiles = (rows * cols).max(0) as u64;
    let frames = if tiles > 1 { tiles + 1 } else { tiles };
    if shape[0] != frames {
        return Err(format!(
            "{} frames for aspect_ratios [{rows}, {cols}] ({frames} expected)",
            shape[0]
        ));
    }
    let lengths: Vec<u32> = item.placeholders.iter().map(|r| r.length).collect();
    if lengths.len() as u64 != frames || lengths.windows(2).any(|w| w[0] != w[1]) {
        return Err(format!(
            "placeholder runs {lengths:?} are not one run of equal length per frame ({frames})"
        ));
    }
    Ok(())
}

/// `[patches, 3, side, side]`, `image_num_patches = [patches]`, and one
/// run of the same number of tokens per patch.
fn check_internvl(
    shape: &[u64],
    side: u64,
    item: &MultimodalItem,
    runs: u64,
    tokens: u64,
) -> Result<(), String> {
    square_tiles(shape, side)?;
    let patches = shape[0];
    let counted = ints(item, "image_num_patches", 1)?;
    if counted != [patches as i64] {
        return Err(format!(
            "image_num_patches {counted:?} is not the pixels' {patches} patches"
        ));
    }
    if runs != 1 || tokens == 0 || !tokens.is_multiple_of(patches) {
        return Err(format!(
            "{runs} placeholder runs of {tokens} tokens for {patches} patches (one run, the same tokens per patch)"
        ));
    }
    Ok(())
}

fn expect(ok: bool, error: impl FnOnce() -> Status) -> Result<(), Status> {
    if ok {
        Ok(())
    } else {
        Err(error())
    }
}

/// `[n ≥ 1, 3, side, side]`.
fn square_tiles(shape: &[u64], side: u64) -> Result<(), String> {
    match shape {
        [n, 3, h, w] if *n >= 1 && *h == side && *w == side => Ok(()),
        _ => Err(format!(
            "pixel_values shape {shape:?} is not [tiles, 3, {side}, {side}]"
        )),
    }
}

fn check_pixtral(
    shape: &[u64],
    patch: u64,
    item: &MultimodalItem,
    runs: u64,
    tokens: u64,
) -> Result<(), String> {
    let &[3, h, w] = shape else {
        return Err(format!("pixel_values shape {shape:?} is not [3, H, W]"));
    };
    if h % patch != 0 || w % patch != 0 {
        return Err(format!(
            "{h}×{w} is not a multiple of the {patch}-pixel patch"
        ));
    }
    let sizes = ints(item, "image_sizes", 2)?;
    if sizes != [h as i64, w as i64] {
        return Err(format!(
            "image_sizes {sizes:?} is not the pixels' [{h}, {w}]"
        ));
    }
    let (rows, cols) = (h / patch, w / patch);
    if runs != rows || tokens != rows * cols {
        return Err(format!(
            "{runs} placeholder runs of {tokens} tokens for {rows} rows of {cols} patches"
        ));
    }
    Ok(())
}

/// The `n` int64 values of the item's model-specific tensor `name`.
fn ints(item: &MultimodalItem, name: &str, n: usize) -> Result<Vec<i64>, String> {
    let values = item
        .model_specific_tensors
        .get(name)
        .map(read)
        .ok_or_else(|| format!("{name} is missing"))?;
    match values {
        Some(v) if v.len() == n => Ok(v),
        _ => Err(format!("{name} is not {n} inline int64 values")),
    }
}

fn read(t: &TensorData) -> Option<Vec<i64>> {
    tensor::read_int64(t)
}

#[cfg(test)]
mod tests {
    use iris_proto::scheduler::PlaceholderRange;

    use super::*;

    const IMAGE: u32 = 9;

    fn rules(layout: Layout) -> ItemRules {
        ItemRules {
            layout,
            image_token: Some(IMAGE),
            video_token: None,
            image_tokens: AtomicU64::new(0),
        }
    }

    /// An image item of `shape` over `ranges`, with `extra` tensors.
    fn image(shape: &[u32], ranges: &[(u32, u32)], extra: &[(&str, &[i64])]) -> MultimodalItem {
        MultimodalItem {
            modality: Modality::Image as i32,
            encoder_input: Some(TensorData {
                shape: shape.to_vec(),
                dtype: "float32".into(),
                payload: None,
            }),
            model_specific_tensors: extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), tensor::int64(vec![1, v.len() as u32], v)))
                .collect(),
            placeholders: ranges
                .iter()
                .map(|&(offset, length)| PlaceholderRange { offset, length })
                .collect(),
            placeholder_token_id: Some(IMAGE),
            ..Default::default()
        }
    }

    /// `text` ids with runs of `IMAGE` at `runs` (offset, length).
    fn prompt(len: usize, runs: &[(u32, u32)]) -> Vec<u32> {
        let mut ids = vec![1; len];
        for &(o, l) in runs {
            ids[o as usize..(o + l) as usize].fill(IMAGE);
        }
        ids
    }

    fn error(rules: &ItemRules, item: MultimodalItem, ids: &[u32]) -> String {
        match rules.check(&[item], ids) {
            Ok(()) => String::new(),
            Err(status) => status.message().to_owned(),
        }
    }

    #[test]
    fn a_matching_item_passes_and_counts_its_tokens() {
        let rules = rules(Layout::Crops { side: 896 });
        let runs = [(2, 4), (8, 4)];
        let item = image(&[2, 3, 896, 896], &runs, &[]);
        assert_eq!(error(&rules, item, &prompt(16, &runs)), "");
        assert_eq!(rules.image_tokens(), 8);
    }

    #[test]
    fn ranges_must_hold_the_image_token_and_cover_all_of_them() {
        let rules = rules(Layout::Unknown);
        let item = image(&[1], &[(2, 4)], &[]);
        let shifted = error(&rules, item.clone(), &prompt(10, &[(3, 4)]));
        assert!(shifted.contains("holds token 1 at 2"), "{shifted}");
        let uncovered = error(&rules, item, &prompt(10, &[(2, 4), (7, 2)]));
        assert!(uncovered.contains("6 image tokens"), "{uncovered}");
        assert_eq!(rules.image_tokens(), 0);
    }

    /// A Phi-4 item: `frames` frames of 448 for a `[h, w]` canvas, the
    /// mask as `mask_dtype`, one run of `tokens` claiming `counted`.
    fn phi4(frames: u32, [h, w]: [i64; 2], mask_dtype: &str, counted: i64) -> MultimodalItem {
        let mut item = image(
            &[frames, 3, 448, 448],
            &[(0, 4)],
            &[("image_sizes", &[h, w]), ("num_img_tokens", &[counted])],
        );
        let mask = TensorData {
            dtype: mask_dtype.into(),
            ..tensor::float32(vec![frames, 32, 32], &vec![1.0; frames as usize * 1024])
        };
        item.model_specific_tensors
            .insert("image_attention_mask".into(), mask);
        item
    }

    #[test]
    fn phi4_items_need_their_canvas_mask_and_token_count() {
        let rules = rules(Layout::Phi4 {
            side: 448,
            patch: 14,
        });
        let ids = prompt(6, &[(0, 4)]);
        assert_eq!(error(&rules, phi4(3, [448, 896], "float32", 4), &ids), "");
        let cases = [
            (
                phi4(2, [448, 896], "float32", 4),
                "2 frames for image_sizes [448, 896]",
            ),
            (
                phi4(2, [448, 400], "float32", 4),
                "(1 + 0 tiles of 448 expected)",
            ),
            (
                phi4(3, [448, 896], "int64", 4),
                "is not float32 [3, 32, 32]",
            ),
            (
                phi4(3, [448, 896], "float32", 5),
                "4 tokens for num_img_tokens [5]",
            ),
        ];
        for (item, want) in cases {
            let got = error(&rules, item, &ids);
            assert!(got.contains(want), "{got} (wanted {want})");
        }
        let config = serde_json::json!({
            "image_processor_type": "Phi4MultimodalImageProcessorFast",
            "size": {"height": 448, "width": 448}, "patch_size": 14,
        });
        assert_eq!(
            layout(&config),
            Layout::Phi4 {
                side: 448,
                patch: 14
            }
        );
    }

    #[test]
    fn each_family_refuses_a_wrong_tensor() {
        let runs = [(0, 4)];
        let ids = prompt(6, &runs);
        let cases = [
            (
                Layout::Clip { side: 336 },
                image(&[3, 224, 224], &runs, &[]),
                "not [3, 336, 336]",
            ),
            (
                Layout::Anyres { side: 336 },
                image(&[2, 3, 336, 336], &runs, &[]),
                "image_sizes is missing",
            ),
            (
                Layout::Crops { side: 384 },
                image(&[2, 3, 384, 384], &runs, &[]),
                "1 placeholder runs for 2 crops",
            ),
            (
                Layout::Qwen { merge: 2 },
                image(&[8, 1176], &runs, &[("image_grid_thw", &[1, 4, 4])]),
                "is not [16, _]",
            ),
            (
                Layout::Pixtral { patch: 16 },
                image(&[3, 32, 32], &runs, &[("image_sizes", &[32, 16])]),
                "is not the pixels' [32, 32]",
            ),
            (
                Layout::Internvl { side: 448 },
                image(&[2, 3, 448, 448], &runs, &[("image_num_patches", &[3])]),
                "is not the pixels' 2 patches",
            ),
            (
                Layout::Internvl { side: 448 },
                image(&[3, 3, 448, 448], &runs, &[("image_num_patches", &[3])]),
                "4 tokens for 3 patches",
            ),
            (
                Layout::Llama4 { side: 336 },
                image(&[2, 3, 336, 336], &runs, &[("aspect_ratios", &[1, 2])]),
                "2 frames for aspect_ratios [1, 2] (3 expected)",
            ),
            (
                Layout::Llama4 { side: 336 },
                image(
                    &[1, 3, 336, 336],
                    &[(0, 2), (2, 2)],
                    &[("aspect_ratios", &[1, 1])],
                ),
                "not one run of equal length per frame (1)",
            ),
        ];
        for (layout, item, want) in cases {
            let got = error(&rules(layout), item, &ids);
            assert!(got.contains(want), "{layout:?}: {got}");
        }
    }

    /// Idefics3 / SmolVLM: a run per frame and the uint8 pixel mask of
    /// the frames' shape.
    #[test]
    fn idefics3_items_need_their_pixel_mask() {
        let runs = [(0, 2), (3, 2)];
        let ids = prompt(6, &runs);
        let rules = rules(Layout::Idefics3 { side: 4 });
        let with_mask = |shape: &[u32], dtype: &str| {
            let mut item = image(&[2, 3, 4, 4], &runs, &[]);
            let len = shape.iter().product::<u32>() as usize;
            let bytes = vec![1u8; len * tensor::DType::parse(dtype).unwrap().size()];
            item.model_specific_tensors.insert(
                "pixel_attention_mask".into(),
                tensor::inline(
                    shape.to_vec(),
                    tensor::DType::parse(dtype).unwrap(),
                    bytes.into(),
                ),
            );
            item
        };
        assert_eq!(error(&rules, with_mask(&[2, 4, 4], "uint8"), &ids), "");
        let missing = error(&rules, image(&[2, 3, 4, 4], &runs, &[]), &ids);
        assert!(missing.contains("pixel_attention_mask None"), "{missing}");
        let short = error(&rules, with_mask(&[1, 4, 4], "uint8"), &ids);
        assert!(short.contains("is not uint8 [2, 4, 4]"), "{short}");
        let wide = error(&rules, with_mask(&[2, 4, 4], "int64"), &ids);
        assert!(wide.contains("is not uint8"), "{wide}");
    }

    #[test]
    fn a_config_without_the_sizes_checks_placeholders_only() {
        let config = serde_json::json!({"image_processor_type": "CLIPImageProcessor"});
        assert_eq!(layout(&config), Layout::Unknown);
        let config = serde_json::json!({
            "image_processor_type": "Idefics3ImageProcessorFast",
            "max_image_size": {"longest_edge": 364},
        });
        assert_eq!(layout(&config), Layout::Idefics3 { side: 364 });
    }

    #[test]
    fn qwen_pixtral_internvl_and_llama4_items_of_the_right_shape_pass() {
        let qwen = image(&[16, 1176], &[(0, 4)], &[("image_grid_thw", &[1, 4, 4])]);
        assert_eq!(
            error(
                &rules(Layout::Qwen { merge: 2 }),
                qwen,
                &prompt(6, &[(0, 4)])
            ),
            ""
        );
        let runs = [(0, 2), (3, 2)];
        let pixtral = image(&[3, 32, 32], &runs, &[("image_sizes", &[32, 32])]);
        let ids = prompt(6, &runs);
        assert_eq!(
            error(&rules(Layout::Pixtral { patch: 16 }), pixtral, &ids),
            ""
        );
        let internvl = image(&[2, 3, 448, 448], &[(0, 4)], &[("image_num_patches", &[2])]);
        assert_eq!(
            error(
                &rules(Layout::Internvl { side: 448 }),
                internvl,
                &prompt(6, &[(0, 4)])
            ),
            ""
        );
        let config = serde_json::json!({
            "image_processor_type": "GotOcr2ImageProcessorFast",
            "size": {"height": 448, "width": 448},
        });
        assert_eq!(layout(&config), Layout::Internvl { side: 448 });
        let runs = [(0, 2), (3, 2), (6, 2)];
        let llama4 = image(&[3, 3, 336, 336], &runs, &[("aspect_ratios", &[1, 2])]);
        assert_eq!(
            error(
                &rules(Layout::Llama4 { side: 336 }),
                llama4,
                &prompt(9, &runs)
            ),
            ""
        );
    }
}
