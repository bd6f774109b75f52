//! How one image's mark in a rendered chat template becomes its part of
//! the prompt, as each family's Hugging Face processor writes it
//! (transformers 4.57.1, `processing_*.py`), for every family the same
//! way: a [`PlaceholderLayout`] per image, planned from its
//! [`OutputLayout`] by [`crate::Processor::placeholder_layout`].
//!
//! The chat template writes one mark per image. Most families only repeat
//! the image token in its place (Qwen-VL, LLaVA-1.5, LLaVA-NeXT,
//! LLaVA-OneVision): the layout is one run of image tokens and the text is
//! left alone. The others replace the mark with text that holds runs of
//! image tokens between structure tokens and text ([`Expansion`]):
//!
//! - Gemma 3 (`Gemma3Processor`): the mark is `<start_of_image>`; it
//!   becomes `\n\n<start_of_image>` + `image_seq_length` ×
//!   `<image_soft_token>` + `<end_of_image>\n\n`. With pan-and-scan crops
//!   it first becomes `Here is the original image <start_of_image> and
//!   here are some crops to help you see better ` followed by one
//!   `<start_of_image>` per crop, joined by spaces, each then expanded so.
//! - Idefics3 / SmolVLM (`Idefics3Processor`): the mark is `<image>`. An
//!   unsplit image becomes `<fake_token_around_image><global-img>` +
//!   `image_seq_len` × `<image>` + `<fake_token_around_image>`; a split
//!   one writes, row by row, each tile as `<fake_token_around_image>
//!   <row_r_col_c>` + `image_seq_len` × `<image>`, every row ended by
//!   `\n`, then `\n` and the global image as above.
//! - Pixtral (`PixtralProcessor`): the mark is `[IMG]`; it becomes one
//!   line per row of the token grid, `cols` × `[IMG]` followed by
//!   `[IMG_BREAK]`, the last line's break replaced by `[IMG_END]`.
//!
//! - InternVL (`InternVLProcessor`): the mark is `<IMG_CONTEXT>`; it
//!   becomes `<img>` + `image_seq_length × num_patches` × `<IMG_CONTEXT>`
//!   + `</img>`, one run.
//! - Llama 4 (`Llama4Processor`): the mark is `<|image|>`; it becomes
//!   `<|image_start|>`, then (with more than one tile) row by row each
//!   tile's `<|patch|>` run, tiles of a row separated by
//!   `<|tile_x_separator|>` and each row ended by `<|tile_y_separator|>`,
//!   then `<|image|>` and the global tile's `<|patch|>` run, and
//!   `<|image_end|>`.
//!
//! The expansion's text writes each run as a single image token: the image
//! token is a special token, so the text tokenizes to the same ids as the
//! processor's with every run one token long, and each run's token is then
//! repeated to the run's length. Text between the structure tokens (the
//! blank lines, Gemma 3's sentence) is tokenized in its context, as the
//! processor's tokenizer sees it.

use crate::output::OutputLayout;

/// Gemma 3's image start, soft image and image end tokens.
pub const GEMMA3_TOKENS: [&str; 3] = ["<start_of_image>", "<image_soft_token>", "<end_of_image>"];
/// Idefics3's wrapper, image and global image tokens.
pub const IDEFICS3_TOKENS: [&str; 3] = ["<fake_token_around_image>", "<image>", "<global-img>"];
/// InternVL's image start, context and image end tokens.
pub const INTERNVL_TOKENS: [&str; 3] = ["<img>", "<IMG_CONTEXT>", "</img>"];
/// Llama 4's image start, patch, image and image end tokens and its tile
/// separators (columns, rows).
pub const LLAMA4_TOKENS: [&str; 6] = [
    "<|image_start|>",
    "<|patch|>",
    "<|image|>",
    "<|image_end|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
];
/// Pixtral's image, row break and image end tokens.
pub const PIXTRAL_TOKENS: [&str; 3] = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"];

/// Where one image's tokens go in the prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaceholderLayout {
    /// Runs of image tokens, in prompt order (tiles, crops or rows).
    pub runs: usize,
    /// Image tokens in each run.
    pub run_len: usize,
    /// The text that replaces the image's mark; `None` when the mark is
    /// the image token itself, repeated `run_len` times (one run).
    pub expansion: Option<Expansion>,
}

/// The text an image's mark in the rendered template becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expansion {
    /// What the chat template writes once per image.
    pub mark: &'static str,
    /// What replaces it, each run written as one image token.
    pub text: String,
}

impl PlaceholderLayout {
    /// The mark itself, one run of `tokens` image tokens.
    pub fn repeated(tokens: usize) -> Self {
        PlaceholderLayout {
            runs: 1,
            run_len: tokens,
            expansion: None,
        }
    }

    /// Image tokens in all: `runs × run_len`.
    pub fn tokens(&self) -> usize {
        self.runs * self.run_len
    }
}

/// Gemma 3: the image and each of its `frames - 1` pan-and-scan crops, in
/// a block of `tokens_per_image` soft tokens each.
pub(crate) fn gemma3(frames: usize, tokens_per_image: usize) -> PlaceholderLayout {
    let [start, soft, end] = GEMMA3_TOKENS;
    let block = format!("\n\n{start}{soft}{end}\n\n");
    let crops = frames.saturating_sub(1);
    let text = if crops == 0 {
        block
    } else {
        let blocks = vec![block.as_str(); crops].join(" ");
        format!(
            "Here is the original image {block} and here are some crops to help you see better {blocks}"
        )
    };
    PlaceholderLayout {
        runs: 1 + crops,
        run_len: tokens_per_image,
        expansion: Some(Expansion { mark: start, text }),
    }
}

/// Idefics3 / SmolVLM: `rows × cols` tagged tiles (none when `[0, 0]`:
/// the image was not split) and the global image, `seq_len` tokens each.
pub(crate) fn idefics3([rows, cols]: [usize; 2], seq_len: usize) -> PlaceholderLayout {
    let [wrap, image, global] = IDEFICS3_TOKENS;
    let mut text = String::new();
    for row in 1..=rows {
        for col in 1..=cols {
            text.push_str(&format!("{wrap}<row_{row}_col_{col}>{image}"));
        }
        text.push('\n');
    }
    if rows * cols > 0 {
        text.push('\n');
    }
    text.push_str(&format!("{wrap}{global}{image}{wrap}"));
    PlaceholderLayout {
        runs: rows * cols + 1,
        run_len: seq_len,
        expansion: Some(Expansion { mark: image, text }),
    }
}

/// Pixtral: `rows` lines of `cols` image tokens, broken by `[IMG_BREAK]`
/// and ended by `[IMG_END]`.
pub(crate) fn pixtral([rows, cols]: [usize; 2]) -> PlaceholderLayout {
    let [image, brk, end] = PIXTRAL_TOKENS;
    let mut text = String::new();
    for row in 1..=rows {
        text.push_str(image);
        text.push_str(if row == rows { end } else { brk });
    }
    PlaceholderLayout {
        runs: rows,
        run_len: cols,
        expansion: Some(Expansion { mark: image, text }),
    }
}

/// InternVL: `tokens` context tokens between `<img>` and `</img>`.
pub(crate) fn internvl(tokens: usize) -> PlaceholderLayout {
    let [start, context, end] = INTERNVL_TOKENS;
    PlaceholderLayout {
        runs: 1,
        run_len: tokens,
        expansion: Some(Expansion {
            mark: context,
            text: format!("{start}{context}{end}"),
        }),
    }
}

/// Llama 4: `rows × cols` tiles (none written when `[1, 1]`) and the
/// global tile, `per_tile` patch tokens each.
pub(crate) fn llama4([rows, cols]: [usize; 2], per_tile: usize) -> PlaceholderLayout {
    let [start, patch, image, end, x_sep, y_sep] = LLAMA4_TOKENS;
    let tiled = rows * cols > 1;
    let mut text = String::from(start);
    if tiled {
        for _ in 0..rows {
            text.push_str(&vec![patch; cols].join(x_sep));
            text.push_str(y_sep);
        }
    }
    text.push_str(&format!("{image}{patch}{end}"));
    PlaceholderLayout {
        runs: if tiled { rows * cols + 1 } else { 1 },
        run_len: per_tile,
        expansion: Some(Expansion { mark: image, text }),
    }
}

/// The `[rows, cols]` of a layout that has them (Idefics3, Pixtral).
pub(crate) fn grid(layout: &OutputLayout) -> [usize; 2] {
    layout.tile_grid.unwrap_or([0, 0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_blocks_the_image_and_each_crop() {
        let plain = gemma3(1, 256);
        assert_eq!((plain.runs, plain.tokens()), (1, 256));
        let text = plain.expansion.map(|e| e.text);
        assert_eq!(
            text.as_deref(),
            Some("\n\n<start_of_image><image_soft_token><end_of_image>\n\n")
        );
        let crops = gemma3(3, 256);
        assert_eq!((crops.runs, crops.tokens()), (3, 768));
        let text = crops.expansion.map(|e| e.text).unwrap_or_default();
        let block = "\n\n<start_of_image><image_soft_token><end_of_image>\n\n";
        assert_eq!(
            text,
            format!("Here is the original image {block} and here are some crops to help you see better {block} {block}")
        );
    }

    #[test]
    fn idefics3_tags_each_tile_and_ends_with_the_global_image() {
        let single = idefics3([0, 0], 81);
        assert_eq!((single.runs, single.tokens()), (1, 81));
        assert_eq!(
            single.expansion.map(|e| e.text).as_deref(),
            Some("<fake_token_around_image><global-img><image><fake_token_around_image>")
        );
        let split = idefics3([2, 1], 64);
        assert_eq!((split.runs, split.tokens()), (3, 192));
        assert_eq!(
            split.expansion.map(|e| e.text).as_deref(),
            Some(
                "<fake_token_around_image><row_1_col_1><image>\n\
                 <fake_token_around_image><row_2_col_1><image>\n\
                 \n<fake_token_around_image><global-img><image><fake_token_around_image>"
            )
        );
    }

    #[test]
    fn internvl_wraps_every_tile_in_one_run() {
        let layout = internvl(5 * 256);
        assert_eq!((layout.runs, layout.tokens()), (1, 1280));
        let expansion = layout.expansion.unwrap_or_else(|| panic!("an expansion"));
        assert_eq!(expansion.mark, "<IMG_CONTEXT>");
        assert_eq!(expansion.text, "<img><IMG_CONTEXT></img>");
    }

    #[test]
    fn llama4_separates_tiles_and_ends_with_the_global_tile() {
        let single = llama4([1, 1], 144);
        assert_eq!((single.runs, single.tokens()), (1, 144));
        assert_eq!(
            single.expansion.map(|e| e.text).as_deref(),
            Some("<|image_start|><|image|><|patch|><|image_end|>")
        );
        let tiled = llama4([2, 3], 144);
        assert_eq!((tiled.runs, tiled.tokens()), (7, 1008));
        let row = "<|patch|><|tile_x_separator|><|patch|><|tile_x_separator|><|patch|><|tile_y_separator|>";
        assert_eq!(
            tiled.expansion.map(|e| e.text),
            Some(format!(
                "<|image_start|>{row}{row}<|image|><|patch|><|image_end|>"
            ))
        );
    }

    #[test]
    fn pixtral_breaks_rows_and_ends_the_image() {
        let layout = pixtral([3, 5]);
        assert_eq!((layout.runs, layout.run_len, layout.tokens()), (3, 5, 15));
        let expansion = layout.expansion.unwrap_or_else(|| panic!("an expansion"));
        assert_eq!(expansion.mark, "[IMG]");
        assert_eq!(
            expansion.text,
            "[IMG][IMG_BREAK][IMG][IMG_BREAK][IMG][IMG_END]"
        );
    }
}
