//! Library side of `iris preprocess --model-path DIR IMAGE [--out FILE.npy]`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use crate::config::processor_from_model_dir;
use crate::decode::{decode, probe, DecodeLimits};
use crate::error::VisionError;
use crate::npy::write_npy_f32;
use crate::processor::PreprocessOptions;

/// Decodes and preprocesses `image` with the model's processor and returns a
/// human-readable report (format, sizes, shape, grid, token count, timings).
/// With `out`, also writes `pixel_values` as a float32 `.npy`.
pub fn preprocess_report(
    model_dir: &Path,
    image: &Path,
    out: Option<&Path>,
) -> Result<String, VisionError> {
    let processor = processor_from_model_dir(model_dir)?;
    let bytes = std::fs::read(image).map_err(|e| VisionError::io(image, e))?;
    let opts = PreprocessOptions::default();
    let info = probe(&bytes)?;
    let t0 = Instant::now();
    let decoded = decode(&bytes, &DecodeLimits::default())?;
    let decode_time = t0.elapsed();
    let t1 = Instant::now();
    let output = processor.preprocess(&decoded, &opts)?;
    let preprocess_time = t1.elapsed();

    let mut report = String::new();
    let _ = writeln!(
        report,
        "processor:      {} (fingerprint {:016x})",
        processor.name(),
        processor.fingerprint(&opts)
    );
    let _ = writeln!(
        report,
        "image:          {} {}x{} ({} bytes)",
        info.format.name(),
        info.width,
        info.height,
        bytes.len()
    );
    let _ = writeln!(
        report,
        "decoded:        {}x{} (after EXIF orientation)",
        decoded.width(),
        decoded.height()
    );
    let _ = writeln!(
        report,
        "resized:        {}x{}",
        output.resized_size.0, output.resized_size.1
    );
    let _ = writeln!(
        report,
        "pixel_values:   {:?} {}",
        output.shape,
        output.pixel_values.dtype().name()
    );
    if let Some(grid) = output.image_grid_thw {
        let _ = writeln!(report, "image_grid_thw: {grid:?}");
    }
    if let Some(sizes) = output.image_sizes {
        let _ = writeln!(report, "image_sizes:    {sizes:?}");
    }
    if let Some(tiles) = output.tile_grid {
        let _ = writeln!(report, "tile_grid:      {tiles:?}");
    }
    let _ = writeln!(report, "tokens:         {}", output.num_placeholder_tokens);
    let _ = writeln!(
        report,
        "decode:         {:.2} ms",
        decode_time.as_secs_f64() * 1e3
    );
    let _ = writeln!(
        report,
        "preprocess:     {:.2} ms",
        preprocess_time.as_secs_f64() * 1e3
    );
    if let Some(path) = out {
        let file = std::fs::File::create(path).map_err(|e| VisionError::io(path, e))?;
        let values = output.pixel_values.to_f32_vec();
        write_npy_f32(
            std::io::BufWriter::new(file),
            &output.shape,
            values.into_iter(),
        )
        .map_err(|e| VisionError::io(path, e))?;
        let _ = writeln!(report, "written:        {}", path.display());
    }
    Ok(report)
}
