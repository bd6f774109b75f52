/*
 * Baseline Huffman entropy decoding in place of libjpeg's, for
 * jpeg_rows.c: see jpeg_huffman.c.
 */

#ifndef IRIS_JPEG_HUFFMAN_H
#define IRIS_JPEG_HUFFMAN_H

#include <stdint.h>
#include <stdio.h>

#include "jpeglib.h"
#include "jerror.h"

/*
 * The libjpeg-internal structure this decoder takes the place of, as
 * libjpeg-turbo 3.1 lays it out (jpegint.h, which is not installed).
 */
struct jpeg_entropy_decoder {
  void (*start_pass)(j_decompress_ptr cinfo);
  boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW *MCU_data);
  void *decode_mcus; /* lossless mode only */
  boolean (*process_restart)(j_decompress_ptr cinfo);
  boolean insufficient_data;
};

/* Bits looked up at once: codes with their extra bits up to this long
 * decode in one step (95 % of a 1080p photo's AC symbols at 10 bits, as
 * at 11). Widths from 9 to 11 measured alike inside the families bench
 * (9 slower alone); the narrower tables leave more of the L1 to the IDCT
 * and the resize. */
#define IRIS_HUFF_FAST_BITS 10
/* The same for DC differences (at most IRIS_HUFF_FAST_BITS: the DC
 * tables use the start of the same array). */
#define IRIS_HUFF_DC_FAST_BITS 10
_Static_assert(IRIS_HUFF_DC_FAST_BITS <= IRIS_HUFF_FAST_BITS,
               "DC lookups index the AC-sized table");

typedef struct iris_huff_table {
  uint32_t fast[1 << IRIS_HUFF_FAST_BITS];
  int32_t maxcode[17];
  int32_t valoffset[17];
  uint8_t huffval[256];
} iris_huff_table;

/* The bit reader's state (kept in registers while an MCU decodes). */
typedef struct iris_bitreader {
  /* Unread bits, most significant first. */
  uint64_t bits;
  const JOCTET *p;
  /* How many bits of `bits` are data; < 0 once bits past the end of the
   * data (zeros) have been read. */
  int nbits;
  /* The data ended at a marker. */
  int marker;
} iris_bitreader;

/* One block of the MCU: its tables and its component's DC prediction. */
typedef struct iris_block_plan {
  const struct iris_huff_table *dc, *ac;
  int *last_dc;
} iris_block_plan;

typedef struct iris_huffman {
  /* First, so that cinfo->entropy can point here. */
  struct jpeg_entropy_decoder pub;
  /* libjpeg's own decoder, put back if a new scan starts. */
  struct jpeg_entropy_decoder *libjpeg;
  j_decompress_ptr cinfo;
  /* The bit reader between MCUs. */
  iris_bitreader br;
  /* The end of the source's buffer. */
  const JOCTET *end;
  int last_dc[MAX_COMPS_IN_SCAN];
  unsigned int restarts_to_go;
  uint64_t mcus, total_mcus;
  /* Whether the CPU has BMI2 (shifts by a register that leave the flags
   * alone, a cycle shorter). */
  int bmi2;
  /* The MCU's blocks in order (blocks_in_MCU of them). */
  iris_block_plan plan[D_MAX_BLOCKS_IN_MCU];
  int blocks_in_mcu;
  iris_huff_table dc_tables[NUM_HUFF_TBLS], ac_tables[NUM_HUFF_TBLS];
} iris_huffman;

/*
 * After jpeg_start_decompress: decodes the scan with `h` (which must
 * outlive the decode) when it is a single sequential Huffman scan of
 * 8-bit samples. Returns 1 when installed, 0 when libjpeg keeps it.
 */
int iris_huffman_install(j_decompress_ptr cinfo, iris_huffman *h);

#endif
