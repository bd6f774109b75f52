//! Criterion benchmark: iris-vision vs llm-multimodal (crates.io) on the
//! shared test photos, Qwen2-VL with its shipped preprocessor config.
//!
//! Groups: `decode`, `preprocess` (from decoded RGB), `decode+preprocess`
//! on one thread (plus an `iris-bf16` row: bfloat16 output), and the same
//! three stages as `<stage> x4 @2 threads` (four images over a two-thread
//! rayon pool, throughput in images/s). llm-multimodal runs with
//! `Parallelism::Inline` so each of its calls uses exactly its caller's
//! thread, like ours with intra-image parallelism off.
//!
//! Run (see docs/benchmarks.md):
//! `CARGO_TARGET_DIR=/work/target-vision cargo bench -p iris-vision --bench preprocess`

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use iris_vision::{
    decode, preprocess_batch, processor_from_config, DecodeLimits, OutputDtype, PreprocessOptions,
    Processor,
};
use llm_multimodal::vision::processors::Qwen2VLProcessor;
use llm_multimodal::vision::{PreProcessorConfig, VisionPreProcessor};
use rayon::prelude::*;

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/images");
const IMAGES: [&str; 3] = ["coffee.jpg", "motorcycle_1080p.jpg", "motorcycle_4k.jpg"];
const QWEN2_VL_CONFIG: &str = r#"{
    "image_processor_type": "Qwen2VLImageProcessor",
    "do_resize": true, "do_rescale": true, "do_normalize": true, "do_convert_rgb": true,
    "resample": 3, "rescale_factor": 0.00392156862745098,
    "min_pixels": 3136, "max_pixels": 12845056,
    "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711]
}"#;

struct Fixture {
    name: &'static str,
    bytes: Vec<u8>,
    rgb: iris_vision::RgbImage,
    dynamic: image::DynamicImage,
}

fn fixtures() -> Vec<Fixture> {
    IMAGES
        .iter()
        .map(|name| {
            let path = format!("{SHARED}/{name}");
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            let rgb = decode(&bytes, &DecodeLimits::default()).expect("decode");
            let dynamic = smg_decode(&bytes);
            Fixture {
                name,
                bytes,
                rgb,
                dynamic,
            }
        })
        .collect()
}

/// llm-multimodal's decode without libturbojpeg (absent here): the `image` crate.
fn smg_decode(bytes: &[u8]) -> image::DynamicImage {
    let img = image::load_from_memory(bytes).expect("image decode");
    image::DynamicImage::ImageRgb8(img.into_rgb8())
}

struct Libs {
    ours: Box<dyn Processor>,
    opts: PreprocessOptions,
    /// Same, with bfloat16 output (the TokenSpeed wire default): an extra
    /// row, not the headline comparison (llm-multimodal only makes f32).
    opts_bf16: PreprocessOptions,
    smg: Qwen2VLProcessor,
    smg_config: PreProcessorConfig,
}

fn libs() -> Libs {
    let json: serde_json::Value = serde_json::from_str(QWEN2_VL_CONFIG).expect("config json");
    let smg_config = PreProcessorConfig::from_json(QWEN2_VL_CONFIG).expect("smg config");
    // Inline: every llm-multimodal task runs on its caller's thread.
    let _ = llm_multimodal::configure_parallelism(llm_multimodal::Parallelism::Inline);
    Libs {
        ours: processor_from_config(&json).expect("processor"),
        opts: PreprocessOptions::default(),
        opts_bf16: PreprocessOptions {
            dtype: OutputDtype::Bf16,
            ..PreprocessOptions::default()
        },
        smg: Qwen2VLProcessor::from_preprocessor_config(&smg_config),
        smg_config,
    }
}

fn one_thread(c: &mut Criterion) {
    let libs = libs();
    let fx = fixtures();
    // Neither library touches a thread pool here: ours has intra-image
    // parallelism off, llm-multimodal is Inline.
    {
        let mut g = c.benchmark_group("decode");
        configure(&mut g);
        for f in &fx {
            g.bench_with_input(BenchmarkId::new("iris", f.name), f, |b, f| {
                b.iter(|| decode(&f.bytes, &DecodeLimits::default()).expect("decode"))
            });
            g.bench_with_input(BenchmarkId::new("llm-multimodal", f.name), f, |b, f| {
                b.iter(|| smg_decode(&f.bytes))
            });
        }
        g.finish();

        let mut g = c.benchmark_group("preprocess");
        configure(&mut g);
        for f in &fx {
            g.bench_with_input(BenchmarkId::new("iris", f.name), f, |b, f| {
                b.iter(|| {
                    libs.ours
                        .preprocess(&f.rgb, &libs.opts)
                        .expect("preprocess")
                })
            });
            g.bench_with_input(BenchmarkId::new("iris-bf16", f.name), f, |b, f| {
                b.iter(|| {
                    libs.ours
                        .preprocess(&f.rgb, &libs.opts_bf16)
                        .expect("preprocess")
                })
            });
            g.bench_with_input(BenchmarkId::new("llm-multimodal", f.name), f, |b, f| {
                b.iter(|| {
                    libs.smg
                        .preprocess(std::slice::from_ref(&f.dynamic), &libs.smg_config)
                        .expect("smg")
                })
            });
        }
        g.finish();

        let mut g = c.benchmark_group("decode+preprocess");
        configure(&mut g);
        for f in &fx {
            g.bench_with_input(BenchmarkId::new("iris", f.name), f, |b, f| {
                b.iter(|| {
                    libs.ours
                        .preprocess_bytes(&f.bytes, &libs.opts)
                        .expect("preprocess")
                })
            });
            g.bench_with_input(BenchmarkId::new("iris-bf16", f.name), f, |b, f| {
                b.iter(|| {
                    libs.ours
                        .preprocess_bytes(&f.bytes, &libs.opts_bf16)
                        .expect("preprocess")
                })
            });
            g.bench_with_input(BenchmarkId::new("llm-multimodal", f.name), f, |b, f| {
                b.iter(|| {
                    let img = smg_decode(&f.bytes);
                    libs.smg
                        .preprocess(std::slice::from_ref(&img), &libs.smg_config)
                        .expect("smg")
                })
            });
        }
        g.finish();
    }
}

fn two_threads(c: &mut Criterion) {
    let libs = libs();
    let fx = fixtures();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    let limits = DecodeLimits::default();
    let on_pool = |work: &(dyn Fn(&Fixture) + Sync), f: &Fixture| {
        pool.install(|| (0..BATCH).into_par_iter().for_each(|_| work(f)))
    };
    two_thread_group(
        c,
        "decode",
        &fx,
        |f| on_pool(&|f| drop(decode(&f.bytes, &limits).expect("decode")), f),
        |f| on_pool(&|f| drop(smg_decode(&f.bytes)), f),
    );
    two_thread_group(
        c,
        "preprocess",
        &fx,
        |f| {
            on_pool(
                &|f| {
                    drop(
                        libs.ours
                            .preprocess(&f.rgb, &libs.opts)
                            .expect("preprocess"),
                    )
                },
                f,
            )
        },
        |f| {
            on_pool(
                &|f| {
                    drop(
                        libs.smg
                            .preprocess(std::slice::from_ref(&f.dynamic), &libs.smg_config)
                            .expect("smg"),
                    )
                },
                f,
            )
        },
    );
    // Ours through the gateway's entry point (`preprocess_batch`), theirs
    // as a par_iter over decode+preprocess.
    two_thread_group(
        c,
        "decode+preprocess",
        &fx,
        |f| {
            let batch: Vec<&[u8]> = vec![f.bytes.as_slice(); BATCH];
            pool.install(|| drop(preprocess_batch(libs.ours.as_ref(), &batch, &libs.opts)))
        },
        |f| {
            on_pool(
                &|f| {
                    let img = smg_decode(&f.bytes);
                    drop(
                        libs.smg
                            .preprocess(std::slice::from_ref(&img), &libs.smg_config)
                            .expect("smg"),
                    )
                },
                f,
            )
        },
    );
}

/// Images handed to the two-thread pool per iteration.
const BATCH: usize = 4;

/// One `<stage> x4 @2 threads` group: `ours` and `theirs` each process
/// [`BATCH`] copies of an image on the shared two-thread pool; throughput
/// in images/s.
fn two_thread_group(
    c: &mut Criterion,
    stage: &str,
    fx: &[Fixture],
    ours: impl Fn(&Fixture),
    theirs: impl Fn(&Fixture),
) {
    let mut g = c.benchmark_group(format!("{stage} x{BATCH} @2 threads"));
    configure(&mut g);
    g.throughput(Throughput::Elements(BATCH as u64));
    for f in fx {
        g.bench_with_input(BenchmarkId::new("iris", f.name), f, |b, f| {
            b.iter(|| ours(f))
        });
        g.bench_with_input(BenchmarkId::new("llm-multimodal", f.name), f, |b, f| {
            b.iter(|| theirs(f))
        });
    }
    g.finish();
}

fn configure<M: criterion::measurement::Measurement>(g: &mut criterion::BenchmarkGroup<'_, M>) {
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
}

criterion_group!(benches, one_thread, two_threads);
criterion_main!(benches);
