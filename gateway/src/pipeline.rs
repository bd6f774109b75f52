//! The steps of a chat request's path, in order, and the code of each
//! (the `stage` histograms of `/metrics` time parts of them: `metrics.rs`): the one
//! list (docs/architecture.md mirrors it; a test keeps every named
//! function where this list says it is).
//!
//! 1. **Parse** — `gateway/src/http/serve.rs` `serve` → `prepare`: read
//!    the body (`gateway/src/http/body.rs` `read_body`), parse, validate
//!    and convert it (`gateway/src/chat/mod.rs` `convert`), look its model
//!    up (`gateway/src/served.rs`); `gateway/src/request/conversation.rs`
//!    `prepare` checks the text's size and runs steps 2 and 3.
//! 2. **Images** — `gateway/src/mm/mod.rs` `start_media`: fetch
//!    (`fetch_one`, `crates/media`) and each image's layout from its
//!    header (videos: `gateway/src/mm/video.rs` `plan_videos`, the
//!    container header and the sampled frames); then, each item in a task
//!    of its own (`gateway/src/mm/pending.rs` `start`), the pixel cache
//!    and preprocessing (`load_one`, `preprocess`; `preprocess_video`),
//!    overlapping the prompt and (EPD) the dispatch.
//! 3. **Prompt** — `gateway/src/prompt.rs` `prompt_for`: chat template and
//!    tokenizing; `gateway/src/mm/items.rs` `expand_placeholders` places
//!    the image tokens.
//! 4. **Encode** (EPD only) — `gateway/src/router/dispatch.rs` `start`
//!    (the attempt loop) with `gateway/src/router/strategy.rs` `plan`, then
//!    `gateway/src/router/encode.rs` `send_all`; the encoder's `encode`
//!    in `encoder/src/service.rs`.
//! 5. **Prefill** — the engine's `prefill` (`crates/engine/src/run.rs`),
//!    started by the same attempt; with PD or EPD it hands its KV state
//!    to decode (`hand_over`).
//! 6. **Decode** — the engine's `decode` (`crates/engine/src/run.rs`); the
//!    gateway reads it through `gateway/src/router/generation.rs` `next`.
//! 7. **Stream** — `gateway/src/chat/stream.rs` `respond` (SSE, run by
//!    `gateway/src/http/sse.rs` `respond`) or `gateway/src/chat/complete.rs`
//!    `respond` (one JSON body, `gateway/src/http/unary.rs`); each
//!    choice's text goes through `gateway/src/output/mod.rs` `shaper`
//!    (reasoning and tool calls parsed out).

/// A step of a chat request's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Parse,
    Images,
    Prompt,
    Encode,
    Prefill,
    Decode,
    Stream,
}

/// Every step in order, with its main functions as (file from the
/// workspace root, function name).
pub const STEPS: [(Step, &[(&str, &str)]); 7] = [
    (
        Step::Parse,
        &[
            ("gateway/src/http/serve.rs", "serve"),
            ("gateway/src/http/serve.rs", "prepare"),
            ("gateway/src/http/body.rs", "read_body"),
            ("gateway/src/chat/mod.rs", "convert"),
            ("gateway/src/request/conversation.rs", "prepare"),
        ],
    ),
    (
        Step::Images,
        &[
            ("gateway/src/mm/mod.rs", "start_media"),
            ("gateway/src/mm/pending.rs", "start"),
            ("gateway/src/mm/mod.rs", "fetch_one"),
            ("gateway/src/mm/mod.rs", "load_one"),
            ("gateway/src/mm/video.rs", "plan_videos"),
            ("gateway/src/mm/video.rs", "preprocess_video"),
        ],
    ),
    (
        Step::Prompt,
        &[
            ("gateway/src/prompt.rs", "prompt_for"),
            ("gateway/src/mm/items.rs", "expand_placeholders"),
        ],
    ),
    (
        Step::Encode,
        &[
            ("gateway/src/router/dispatch.rs", "start"),
            ("gateway/src/router/strategy.rs", "plan"),
            ("gateway/src/router/encode.rs", "send_all"),
            ("encoder/src/service.rs", "encode"),
        ],
    ),
    (
        Step::Prefill,
        &[
            ("crates/engine/src/run.rs", "prefill"),
            ("crates/engine/src/run.rs", "hand_over"),
        ],
    ),
    (
        Step::Decode,
        &[
            ("crates/engine/src/run.rs", "decode"),
            ("gateway/src/router/generation.rs", "next"),
        ],
    ),
    (
        Step::Stream,
        &[
            ("gateway/src/chat/stream.rs", "respond"),
            ("gateway/src/http/sse.rs", "respond"),
            ("gateway/src/chat/complete.rs", "respond"),
            ("gateway/src/http/unary.rs", "respond"),
            ("gateway/src/output/mod.rs", "shaper"),
        ],
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_function_is_where_the_list_says() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (step, code) in STEPS {
            for (file, function) in code {
                let text = std::fs::read_to_string(root.join(file))
                    .unwrap_or_else(|e| panic!("{step:?}: {file}: {e}"));
                assert!(
                    text.contains(&format!("fn {function}("))
                        || text.contains(&format!("fn {function}<")),
                    "{step:?}: no fn {function} in {file}"
                );
            }
        }
    }
}
