//! Iris's and the peer gateway's (smg: the published `llm-multimodal`
//! crate) processors for every vision-language family both implement, held
//! to the Hugging Face parity reference in the same run, and their decode +
//! preprocess time (`e2e/bench/peer_families.sh`, issue 33).
//!
//! `cargo run --release -p iris-vision --example peer_families -- EXPECTED_JSON [IMAGE] [ITERS]`
//!
//! EXPECTED_JSON is the parity reference (crates/vision/tests/data/expected.json):
//! its `processors` give each family's preprocessor config, and its cases for
//! the photos of ../shared/images (the ones the parity test reads) give
//! Hugging Face's shape, placeholder-token count, sampled values, sum and sum
//! of squares. Both libraries run on each photo's bytes and are checked as
//! tests/parity.rs checks Iris. The reference holds samples, not the whole
//! tensor, so where the peer's tensor has the reference's shape it is also
//! compared with Iris's element by element (Iris's being Hugging Face's: its
//! resized pixels are Pillow's byte for byte, its floats within 1e-5), and
//! the peer counts as exact only when that difference is within 1e-5 too.
//! Placeholder tokens are the count smg writes into the prompt (see
//! support/peer.rs). IMAGE (default
//! the 1080p photo) is timed: thread CPU per decode + preprocess, float32
//! out, one thread each (llm-multimodal `Parallelism::Inline`), median of
//! ITERS (default 20) after a warm-up. Prints a Markdown table, then what
//! differs photo by photo. A peer error or panic is reported, not fatal.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/cpu.rs"]
mod cpu;
#[path = "support/peer.rs"]
mod peer;
#[path = "support/reference.rs"]
mod reference;
#[path = "support/timed.rs"]
mod timed;

use std::path::PathBuf;

use iris_vision::{OutputDtype, PreprocessOptions, Processor};
use reference::Verdict;
use serde_json::Value;

/// The families both Iris and llm-multimodal 1.14.0 implement: the parity
/// reference's name and the name the table shows.
const FAMILIES: [(&str, &str); 7] = [
    ("llava", "LLaVA-1.5 (CLIP)"),
    ("llava_next", "LLaVA-NeXT"),
    ("llama4", "Llama 4"),
    ("pixtral", "Pixtral"),
    ("phi4_multimodal", "Phi-4-multimodal"),
    ("qwen2_vl", "Qwen2-VL"),
    ("qwen3_vl", "Qwen3-VL"),
];

/// One family's findings over the photos.
#[derive(Default)]
struct FamilyReport {
    label: &'static str,
    how: String,
    photos: usize,
    iris_exact: usize,
    /// Photos whose peer output passes the parity test's checks.
    peer_checks_pass: usize,
    /// Those whose whole tensor is also Iris's within 1e-5.
    peer_exact: usize,
    iris_failures: Vec<String>,
    peer_errors: Vec<String>,
    shape_diffs: Vec<String>,
    token_diffs: Vec<String>,
    /// smg has no prompt for the family: its tokens are not compared.
    no_prompt: bool,
    value_diffs: Vec<String>,
    worst_sample: Option<f32>,
    worst_whole: Option<f32>,
    iris_ms: Option<f64>,
    peer_ms: Option<f64>,
}

struct Photo {
    name: String,
    bytes: Vec<u8>,
    expected: Value,
}

fn options() -> PreprocessOptions {
    PreprocessOptions {
        dtype: OutputDtype::F32,
        intra_image_parallel: false,
        ..PreprocessOptions::default()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: peer_families EXPECTED_JSON [IMAGE] [ITERS]";
    let expected_path = args.get(1).ok_or(usage)?;
    let timed_image = match args.get(2) {
        Some(path) => PathBuf::from(path),
        None => common::image_path("shared/motorcycle_1080p.jpg"),
    };
    let iters = match args.get(3) {
        Some(n) => n.parse()?,
        None => 20,
    };
    llm_multimodal::configure_parallelism(llm_multimodal::Parallelism::Inline)
        .map_err(|e| format!("llm-multimodal parallelism: {e:?}"))?;
    let reference: Value = serde_json::from_slice(&std::fs::read(expected_path)?)?;
    let sample_count = reference["sample_count"]
        .as_u64()
        .ok_or("the reference has no `sample_count`")? as usize;
    let run = Run {
        photos: shared_photos(&reference)?,
        sample_count,
        timed_bytes: std::fs::read(&timed_image)?,
        iters,
    };
    let reports = FAMILIES
        .iter()
        .map(|(family, label)| run.family(&reference["processors"][family], family, label))
        .collect::<Result<Vec<_>, _>>()?;
    let decodes = decodes_like_pillow(&run.photos);
    print_table(&reports, &decodes, &timed_image, iters);
    Ok(())
}

/// What every family is run on.
struct Run {
    photos: Vec<Photo>,
    sample_count: usize,
    timed_bytes: Vec<u8>,
    iters: usize,
}

impl Run {
    /// Both libraries' processors for `family` (its reference `config`) on
    /// every photo, and timed.
    fn family(
        &self,
        config: &Value,
        family: &str,
        label: &'static str,
    ) -> Result<FamilyReport, iris_vision::VisionError> {
        let iris = iris_vision::processor_from_config(config)?;
        let mut report = FamilyReport {
            label,
            ..FamilyReport::default()
        };
        match peer::processor(family, config) {
            Ok(theirs) => {
                report.how = theirs.how.clone();
                for photo in &self.photos {
                    let case = Case {
                        family,
                        photo,
                        sample_count: self.sample_count,
                    };
                    compare(&mut report, &case, iris.as_ref(), &theirs);
                }
                time(
                    &mut report,
                    iris.as_ref(),
                    &theirs,
                    &self.timed_bytes,
                    self.iters,
                );
            }
            Err(e) => {
                report.how = format!("not configurable: {e}");
                report.photos = self.photos.len();
            }
        }
        Ok(report)
    }
}

/// One photo of one family.
struct Case<'a> {
    family: &'a str,
    photo: &'a Photo,
    sample_count: usize,
}

/// The reference's photos from ../shared/images, with their bytes.
fn shared_photos(reference: &Value) -> Result<Vec<Photo>, String> {
    let images = reference["images"]
        .as_array()
        .ok_or("the reference has no `images`")?;
    images
        .iter()
        .filter_map(|image| {
            let name = image["name"].as_str()?;
            name.starts_with("shared/").then(|| {
                std::fs::read(common::image_path(name))
                    .map(|bytes| Photo {
                        name: name.trim_start_matches("shared/").to_string(),
                        bytes,
                        expected: image.clone(),
                    })
                    .map_err(|e| format!("{name}: {e}"))
            })
        })
        .collect()
}

/// The photos the peer decodes to Pillow's pixels byte for byte (the
/// reference's `decoded.sha256`), and the others with why.
fn decodes_like_pillow(photos: &[Photo]) -> (usize, Vec<String>) {
    let mut same = 0;
    let mut differ = Vec::new();
    for photo in photos {
        match peer::decoded_rgb(&photo.bytes) {
            Ok(rgb) if sha256_hex(&rgb) == photo.expected["decoded"]["sha256"] => same += 1,
            Ok(_) => differ.push(photo.name.clone()),
            Err(e) => differ.push(format!("{}: {e}", photo.name)),
        }
    }
    (same, differ)
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Both libraries on one photo, against the reference's case for its family.
fn compare(
    report: &mut FamilyReport,
    case: &Case,
    iris: &dyn Processor,
    theirs: &peer::PeerProcessor,
) {
    let (photo, sample_count) = (case.photo, case.sample_count);
    let Some(case) = reference::case(&photo.expected, case.family) else {
        return;
    };
    report.photos += 1;
    let name = &photo.name;
    let ours = match iris.preprocess_bytes(&photo.bytes, &options()) {
        Ok(out) => {
            let values = out.pixel_values.to_f32_vec();
            let verdict = Verdict::new(
                case,
                sample_count,
                &out.shape,
                &values,
                Some(out.num_placeholder_tokens),
            );
            if verdict.exact() {
                report.iris_exact += 1;
            } else {
                report.iris_failures.push(name.clone());
            }
            Some((out.shape, values))
        }
        Err(e) => {
            report.iris_failures.push(format!("{name}: {e}"));
            None
        }
    };
    let out = match theirs.output(&photo.bytes) {
        Ok(out) => out,
        Err(e) => {
            report.peer_errors.push(format!("{name}: {e}"));
            return;
        }
    };
    let verdict = Verdict::new(case, sample_count, &out.shape, &out.values, out.tokens);
    let whole = ours.and_then(|(shape, values)| whole_diff(&shape, &values, &out));
    if verdict.exact() {
        report.peer_checks_pass += 1;
        if whole.is_some_and(|w| w <= reference::TOLERANCE) {
            report.peer_exact += 1;
        }
    }
    let (have, want) = &verdict.shape;
    if have != want {
        report
            .shape_diffs
            .push(format!("{name}: {have:?} (HF {want:?})"));
    }
    match verdict.tokens {
        (Some(have), want) if have != want => report
            .token_diffs
            .push(format!("{name}: {have} (HF {want})")),
        (None, _) => report.no_prompt = true,
        _ => {}
    }
    if let Some(d) = verdict.sample_diff {
        report.worst_sample = Some(report.worst_sample.unwrap_or(0.0).max(d));
        if let Some(w) = whole {
            report.worst_whole = Some(report.worst_whole.unwrap_or(0.0).max(w));
        }
        if whole.is_none_or(|w| w > reference::TOLERANCE) {
            report.value_diffs.push(format!(
                "{name}: sampled {d:.3e}, sum {:+.3e}, whole tensor vs Iris {}",
                verdict.sum_diff.unwrap_or(f64::NAN),
                whole.map_or("–".into(), |w| format!("{w:.3e}"))
            ));
        }
    }
}

/// Largest |difference| between Iris's tensor and the peer's when their
/// shapes agree (a leading batch axis of one aside).
fn whole_diff(shape: &[usize], values: &[f32], theirs: &peer::PeerOutput) -> Option<f32> {
    let same = reference::without_unit_batch(&theirs.shape, shape) == shape
        && values.len() == theirs.values.len();
    same.then(|| {
        values
            .iter()
            .zip(&theirs.values)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
    })
}

/// Thread CPU of decode + preprocess of `bytes` through both, median of `iters`.
fn time(
    report: &mut FamilyReport,
    iris: &dyn Processor,
    theirs: &peer::PeerProcessor,
    bytes: &[u8],
    iters: usize,
) {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let opts = options();
    if iris.preprocess_bytes(bytes, &opts).is_ok() {
        let (median, _) = timed::cpu_times(iters, || {
            std::hint::black_box(iris.preprocess_bytes(bytes, &opts).ok());
        });
        report.iris_ms = Some(ms(median));
    }
    if theirs.run(bytes).is_ok() {
        let (median, _) = timed::cpu_times(iters, || {
            std::hint::black_box(theirs.run(bytes).ok());
        });
        report.peer_ms = Some(ms(median));
    }
}

fn print_table(
    reports: &[FamilyReport],
    decodes: &(usize, Vec<String>),
    timed_image: &std::path::Path,
    iters: usize,
) {
    let file = timed_image
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    println!(
        "llm-multimodal 1.14.0 decode: libjpeg-turbo {}, libwebp {}.",
        available(llm_multimodal::jpeg_turbo::turbojpeg_available()),
        available(llm_multimodal::webp_native::webp_available()),
    );
    let (same, differ) = decodes;
    let photos = same + differ.len();
    println!("The peer's decode is Pillow's, byte for byte, on {same} of the {photos} photos");
    if !differ.is_empty() {
        println!("(not on {})", differ.join("; "));
    }
    println!();
    println!(
        "Photos exact to Hugging Face: the parity test's checks (shape, placeholder tokens, \
         sampled values within 1e-5, sums) and, for the peer, its whole tensor within 1e-5 of \
         Iris's; decode + preprocess of {file}: thread CPU ms, float32 out, one thread, \
         median of {iters}:\n"
    );
    println!(
        "| family | Iris exact | peer exact | peer passes the sampled checks | peer: shape differs \
         | peer: tokens differ | peer: max \\|Δ\\| sampled | peer: max \\|Δ\\| whole tensor vs Iris \
         | Iris ms | peer ms | peer / Iris |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in reports {
        println!("{}", r.row());
    }
    println!();
    for r in reports {
        r.print_details();
    }
}

impl FamilyReport {
    /// The family's row of the Markdown table.
    fn row(&self) -> String {
        let r = self;
        let ratio = match (r.iris_ms, r.peer_ms) {
            (Some(i), Some(p)) => format!("{:.2}×", p / i),
            _ => "–".into(),
        };
        let errors = if r.peer_errors.is_empty() {
            String::new()
        } else {
            format!(" ({} failed)", r.peer_errors.len())
        };
        format!(
            "| {} | {}/{} | {}/{}{errors} | {}/{} | {} | {} | {} | {} | {} | {} | {ratio} |",
            r.label,
            r.iris_exact,
            r.photos,
            r.peer_exact,
            r.photos,
            r.peer_checks_pass,
            r.photos,
            r.shape_diffs.len(),
            if r.no_prompt {
                "n/a (not served)".to_string()
            } else {
                r.token_diffs.len().to_string()
            },
            r.worst_sample.map_or("–".into(), |d| format!("{d:.1e}")),
            r.worst_whole.map_or("–".into(), |d| format!("{d:.1e}")),
            r.iris_ms.map_or("–".into(), |m| format!("{m:.1}")),
            r.peer_ms.map_or("–".into(), |m| format!("{m:.1}")),
        )
    }

    /// How the peer's processor was obtained and what differs, photo by photo.
    fn print_details(&self) {
        println!("- **{}**, peer processor: {}", self.label, self.how);
        for (what, list) in [
            ("Iris not exact", &self.iris_failures),
            ("peer failed", &self.peer_errors),
            ("peer shape", &self.shape_diffs),
            ("peer tokens", &self.token_diffs),
            ("peer values", &self.value_diffs),
        ] {
            if !list.is_empty() {
                println!("  - {what}: {}", list.join("; "));
            }
        }
    }
}

fn available(yes: bool) -> &'static str {
    if yes {
        "loaded"
    } else {
        "absent (the `image` crate decodes)"
    }
}
