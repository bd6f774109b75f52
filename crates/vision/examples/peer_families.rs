//! Iris's and the peer gateway's (smg: the published `llm-multimodal`
//! crate) processors for every vision-language family both implement, held
//! to the Hugging Face reference in the same run, and their decode +
//! preprocess time (`e2e/bench/peer_families.sh`, issue 33).
//!
//! `cargo run --release -p iris-vision --example peer_families -- EXPECTED_JSON HF_ARRAYS [IMAGE] [ITERS]`
//!
//! EXPECTED_JSON is the parity reference (crates/vision/tests/data/expected.json):
//! its `processors` give each family's preprocessor config, and its cases for
//! the photos of ../shared/images (the ones the parity test reads) give
//! Hugging Face's shape, placeholder-token count, sampled values, sum and sum
//! of squares. HF_ARRAYS holds Hugging Face's whole tensors for those photos
//! (scripts/vision/reference_arrays.py). Both libraries run on each photo's
//! bytes and are checked as tests/parity.rs checks Iris, and element by
//! element against the whole tensor: exact means every value within 1e-5.
//! Placeholder tokens are the count smg writes into the prompt (see
//! support/peer.rs). IMAGE (default the 1080p photo) is timed: thread CPU per
//! decode + preprocess, float32 out, one thread each (llm-multimodal
//! `Parallelism::Inline`), median of ITERS (default 20) after a warm-up.
//! Prints a Markdown table, then what differs photo by photo. A peer error
//! or panic is reported, not fatal.

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

use std::path::{Path, PathBuf};

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
    /// Largest |difference| from Hugging Face's whole tensor, over the photos.
    iris_worst: Option<f32>,
    peer_worst: Option<f32>,
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
    let usage = "usage: peer_families EXPECTED_JSON HF_ARRAYS [IMAGE] [ITERS]";
    let expected_path = args.get(1).ok_or(usage)?;
    let hf_dir = PathBuf::from(args.get(2).ok_or(usage)?);
    let timed_image = match args.get(3) {
        Some(path) => PathBuf::from(path),
        None => common::image_path("shared/motorcycle_1080p.jpg"),
    };
    let iters = match args.get(4) {
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
        hf_dir,
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
    hf_dir: PathBuf,
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
    ) -> Result<FamilyReport, Box<dyn std::error::Error>> {
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
                        hf_dir: &self.hf_dir,
                    };
                    compare(&mut report, &case, iris.as_ref(), &theirs)?;
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
    /// Where Hugging Face's whole tensors are.
    hf_dir: &'a Path,
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

/// Both libraries on one photo, against the reference's case for its family
/// and Hugging Face's whole tensor.
fn compare(
    report: &mut FamilyReport,
    case: &Case,
    iris: &dyn Processor,
    theirs: &peer::PeerProcessor,
) -> Result<(), String> {
    let (photo, sample_count, hf_dir) = (case.photo, case.sample_count, case.hf_dir);
    let Some(expected) = reference::case(&photo.expected, case.family) else {
        return Ok(());
    };
    let hf = reference::hf_tensor(hf_dir, case.family, &photo.name)?;
    let check = |shape: &[usize], values: &[f32], tokens| {
        Verdict::new(expected, sample_count, shape, values, tokens, &hf)
    };
    report.photos += 1;
    let name = &photo.name;
    match iris.preprocess_bytes(&photo.bytes, &options()) {
        Ok(out) => {
            let values = out.pixel_values.to_f32_vec();
            let verdict = check(&out.shape, &values, Some(out.num_placeholder_tokens));
            report.iris_worst = max_of(report.iris_worst, verdict.whole_diff);
            if verdict.exact() {
                report.iris_exact += 1;
            } else {
                report.iris_failures.push(name.clone());
            }
        }
        Err(e) => report.iris_failures.push(format!("{name}: {e}")),
    }
    match theirs.output(&photo.bytes) {
        Ok(out) => report.add_peer(name, &check(&out.shape, &out.values, out.tokens)),
        Err(e) => report.peer_errors.push(format!("{name}: {e}")),
    }
    Ok(())
}

fn max_of(a: Option<f32>, b: Option<f32>) -> Option<f32> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        _ => a.or(b),
    }
}

impl FamilyReport {
    /// The peer's verdict on photo `name`.
    fn add_peer(&mut self, name: &str, verdict: &Verdict) {
        if verdict.passes_sampled_checks() {
            self.peer_checks_pass += 1;
        }
        if verdict.exact() {
            self.peer_exact += 1;
        }
        let (have, want) = &verdict.shape;
        if have != want {
            self.shape_diffs
                .push(format!("{name}: {have:?} (HF {want:?})"));
        }
        match verdict.tokens {
            (Some(have), want) if have != want => {
                self.token_diffs.push(format!("{name}: {have} (HF {want})"))
            }
            (None, _) => self.no_prompt = true,
            _ => {}
        }
        self.peer_worst = max_of(self.peer_worst, verdict.whole_diff);
        if let (Some(whole), Some(sampled)) = (verdict.whole_diff, verdict.sample_diff) {
            if whole > reference::TOLERANCE {
                self.value_diffs.push(format!(
                    "{name}: max |Δ| {whole:.3e} (sampled {sampled:.3e}), sum {:+.3e}",
                    verdict.sum_diff.unwrap_or(f64::NAN),
                ));
            }
        }
    }
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
         sampled values within 1e-5, sums) and the whole tensor within 1e-5 of Hugging Face's; \
         max |Δ|: the largest difference from Hugging Face's whole tensor over the photos; \
         decode + preprocess of {file}: thread CPU ms, float32 out, one thread, \
         median of {iters}:\n"
    );
    println!(
        "| family | Iris exact | Iris: max \\|Δ\\| | peer exact | peer passes the sampled checks \
         | peer: shape differs | peer: tokens differ | peer: max \\|Δ\\| \
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
            "| {} | {}/{} | {} | {}/{}{errors} | {}/{} | {} | {} | {} | {} | {} | {ratio} |",
            r.label,
            r.iris_exact,
            r.photos,
            r.iris_worst.map_or("–".into(), |d| format!("{d:.1e}")),
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
            r.peer_worst.map_or("–".into(), |d| format!("{d:.1e}")),
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
