/*
 * Chroma upsampling and YCbCr -> RGB in one pass, for jpeg_rows.c: see
 * jpeg_color.c.
 */

#ifndef IRIS_JPEG_COLOR_H
#define IRIS_JPEG_COLOR_H

#include <stdint.h>

/*
 * 3 x near + far for one row of `width` chroma samples, into sums[1 ..
 * width], with the edge samples repeated in sums[0] and sums[width + 1]
 * (libjpeg's fancy upsampling's column sums). `sums` holds width + 34.
 */
void iris_color_sums(const uint8_t *near, const uint8_t *far, int width,
                     int16_t *sums);

/*
 * One RGB row of `width` pixels from a full-size Y row and the column
 * sums of its Cb and Cr rows (iris_color_sums), upsampled two to one
 * across as libjpeg's h2v2 fancy upsampling does and converted as its
 * YCbCr -> RGB does: libjpeg's bytes. On x86-64 the caller checks that
 * the CPU has AVX-512 F, BW and VBMI (the Rust side's
 * `byte_lookup::vbmi`).
 */
void iris_color_row(const uint8_t *y, const int16_t *cb_sums,
                    const int16_t *cr_sums, uint8_t *out, int width);

#endif
