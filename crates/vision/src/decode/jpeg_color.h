/*
 * YCbCr -> RGB with AVX-512 in place of libjpeg's, for jpeg_rows.c: see
 * jpeg_color.c.
 */

#ifndef IRIS_JPEG_COLOR_H
#define IRIS_JPEG_COLOR_H

#include <stdio.h>

#include "jpeglib.h"

/* The colour deconverter's first two methods, as libjpeg-turbo 3.1 lays
 * the structure out (jpegint.h, not installed); only these are touched. */
struct jpeg_color_deconverter {
  void (*start_pass)(j_decompress_ptr cinfo);
  void (*color_convert)(j_decompress_ptr cinfo, JSAMPIMAGE input_buf,
                        JDIMENSION input_row, JSAMPARRAY output_buf,
                        int num_rows);
};

/*
 * After jpeg_start_decompress: converts YCbCr to RGB (JCS_EXT_RGB) with
 * AVX-512 when the CPU has BW and VBMI. Returns 1 when installed, 0 when
 * libjpeg keeps its own.
 */
int iris_color_install(j_decompress_ptr cinfo);

#endif
