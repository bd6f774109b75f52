//! Vision tower throughput on the CPU: patches/s of a mid-size Qwen2-VL
//! tower (depth 4, width 256, 4 heads, MLP 1024, 224×224 images = 256
//! patches) at batch 1 and 8 on 1 and 2 threads (batch 8 also as eight
//! per-image forwards side by side, as the encode worker runs a batch),
//! next to a plain GEMM of the tower's largest shape (tokens × 256 · 256 ×
//! 1024) for the GFLOP/s reference. The forward's FLOP count per batch is
//! printed once, so GFLOP/s = FLOPs / time.
//!
//! `CARGO_TARGET_DIR=/work/target-tower cargo bench -p iris-tower --bench tower`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use iris_tower::{write_tiny_weights, Activation, Family, Tower, TowerConfig, VisionBackend};
use ndarray::linalg::general_mat_mul;
use ndarray::parallel::prelude::*;
use ndarray::{Array2, Axis};
use rayon::slice::ParallelSlice;

const GRID: [usize; 3] = [1, 16, 16];

fn mid_config() -> TowerConfig {
    TowerConfig {
        family: Family::Qwen2Vl,
        patch_size: 14,
        temporal_patch_size: 2,
        spatial_merge_size: 2,
        in_channels: 3,
        embed_dim: 256,
        num_heads: 4,
        depth: 4,
        intermediate_size: 1024,
        out_hidden_size: 512,
        hidden_act: Activation::QuickGelu,
        window_size: 0,
        fullatt_block_indexes: Vec::new(),
    }
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
}

fn bench_tower(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = mid_config();
    write_tiny_weights(dir.path(), &config, 1).expect("weights");
    let tower = Tower::from_checkpoint(
        config.clone(),
        &iris_tower::Checkpoint::open(dir.path()).expect("open"),
    )
    .expect("load");
    let mut group = c.benchmark_group("tower");
    group.sample_size(10);
    for batch in [1usize, 8] {
        let grids = vec![GRID; batch];
        let patches = batch * GRID.iter().product::<usize>();
        let pixels: Vec<f32> = (0..patches * config.patch_features())
            .map(|i| (i % 255) as f32 / 128.0 - 1.0)
            .collect();
        eprintln!(
            "tower batch {batch}: {patches} patches, {:.3} GFLOP per forward",
            tower.flops(&grids) as f64 / 1e9
        );
        group.throughput(Throughput::Elements(patches as u64));
        for threads in [1usize, 2] {
            let pool = pool(threads);
            group.bench_with_input(
                BenchmarkId::new(format!("batch{batch}"), format!("{threads}t")),
                &grids,
                |b, grids| {
                    b.iter(|| pool.install(|| tower.encode(&pixels, grids).expect("forward")))
                },
            );
            if batch > 1 {
                // What the encode worker does: each image its own forward,
                // side by side on the pool, each done on its own.
                let per_image = pixels.len() / batch;
                group.bench_with_input(
                    BenchmarkId::new(format!("batch{batch}-per-image"), format!("{threads}t")),
                    &grids,
                    |b, grids| {
                        b.iter(|| {
                            pool.install(|| {
                                pixels
                                    .par_chunks(per_image)
                                    .zip(grids.par_iter())
                                    .map(|(p, g)| tower.encode(p, &[*g]).expect("forward"))
                                    .collect::<Vec<_>>()
                            })
                        })
                    },
                );
            }
        }
    }
    group.finish();
}

/// `x · w` with rows split over the current pool, as the tower does.
fn gemm(x: &Array2<f32>, w: &Array2<f32>, out: &mut Array2<f32>) {
    let chunk = if rayon::current_num_threads() <= 1 {
        x.nrows()
    } else {
        x.nrows()
            .div_ceil(rayon::current_num_threads() * 2)
            .div_ceil(8)
            * 8
    };
    out.axis_chunks_iter_mut(Axis(0), chunk)
        .into_par_iter()
        .zip(x.axis_chunks_iter(Axis(0), chunk))
        .for_each(|(mut o, xi)| general_mat_mul(1.0, &xi, w, 0.0, &mut o));
}

fn bench_gemm(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm");
    group.sample_size(10);
    for rows in [256usize, 2048] {
        let x = Array2::from_shape_fn((rows, 256), |(i, j)| ((i * 31 + j) % 17) as f32 * 0.01);
        let w = Array2::from_shape_fn((256, 1024), |(i, j)| ((i + j * 7) % 13) as f32 * 0.01);
        let flops = 2 * rows * 256 * 1024;
        group.throughput(Throughput::Elements(flops as u64));
        group.bench_function(BenchmarkId::new(format!("{rows}x256x1024"), "dot"), |b| {
            b.iter(|| x.dot(&w))
        });
        for threads in [1usize, 2] {
            let pool = pool(threads);
            let mut out = Array2::zeros((rows, 1024));
            group.bench_function(
                BenchmarkId::new(format!("{rows}x256x1024"), format!("{threads}t")),
                |b| b.iter(|| pool.install(|| gemm(&x, &w, &mut out))),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench_tower, bench_gemm);
criterion_main!(benches);
