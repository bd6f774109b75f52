/*
 * Baseline Huffman entropy decoding for src/decode/jpeg_rows.c, in place
 * of libjpeg's own: the same coefficients, faster.
 *
 * libjpeg decodes one symbol at a time in two dependent steps (look the
 * code up, then read and sign-extend its extra bits). Here one lookup of
 * the next FAST_BITS bits gives the whole coefficient (run, value, length
 * of code and extra bits together) for every code whose code and extra
 * bits fit in FAST_BITS, which covers almost all of a photo's symbols; the
 * rest are decoded canonically. The bit buffer is refilled eight bytes at
 * a time when those bytes hold no 0xFF (no stuffing, no marker), and one
 * byte at a time otherwise, with libjpeg's rules: FF 00 (or several FFs
 * then 00) is a data byte FF, FF then anything else is a marker, where the
 * data ends.
 *
 * What libjpeg reports, this reports the same way (through its warning
 * hook, which jpeg_rows.c turns into an error):
 * - reading bits past a marker: JWRN_HIT_MARKER;
 * - a code that is in no table: JWRN_HUFF_BAD_CODE;
 * - running out of bytes: the source's fill_input_buffer (JWRN_JPEG_EOF);
 * - a wrong restart marker: libjpeg's own marker reader, which is given
 *   the source at each restart.
 * One case differs: bytes the data does not use before a restart marker
 * or after the last MCU are passed over silently. libjpeg drops those its
 * read-ahead has taken (up to 8 bytes) and warns JWRN_EXTRANEOUS_DATA
 * about the rest, at the next marker it has to look for; Pillow, which
 * Hugging Face decodes with, ignores them all. They carry no pixel either
 * way, and the pixels are the ones libjpeg gives when it goes on after
 * that warning.
 *
 * Installed after jpeg_start_decompress, for single-scan sequential
 * Huffman files only (iris_huffman_install checks).
 */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "jpeg_huffman.h"

/* The marker reader, for its restart method, as libjpeg-turbo 3.1 lays
 * the structure out (jpegint.h, not installed). */
struct jpeg_marker_reader {
  void (*reset_marker_reader)(j_decompress_ptr cinfo);
  int (*read_markers)(j_decompress_ptr cinfo);
  jpeg_marker_parser_method read_restart_marker;
  boolean saw_SOI;
  boolean saw_SOF;
  int next_restart_num;
  unsigned int discarded_bytes;
};

/* Zigzag index -> natural index, then 63s: a corrupt run past the end of
 * a block lands on coefficient 63, as in libjpeg, and so does the zero an
 * end of block writes (see build_fast). */
static const uint8_t NATURAL[128] = {
  0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,
  12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28,
  35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
  58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
  63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63,
  63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63,
  63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63,
  63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63
};

/* Table entries: bits 0-4 the bits to consume, 8-13 the zeros to skip,
 * 16-31 the value (KIND_COEF) or the extra-bit count (KIND_SYMBOL).
 * KIND_COEF entries are a whole step of the block: skip the zeros, store
 * the value, move on. An end of block is one too, a zero stored after 63
 * zeros (past the block's end, so the loop stops; the zero lands on a
 * coefficient still zero), and so is a run of sixteen zeros (fifteen
 * skipped, then a zero stored): one branch per symbol. */
#define KIND_COEF 0x40u   /* code and extra bits: the step */
#define KIND_SYMBOL 0x80u /* code only: read the extra bits next */
/* Neither: a code longer than FAST_BITS, decoded canonically. */

static int32_t extend(uint32_t x, int s)
{
  return (x < (1u << (s - 1))) ? (int32_t)x - (int32_t)((1u << s) - 1)
                               : (int32_t)x;
}

/* Canonical decoding limits of one table (JPEG Annex C, F.2.2.3). */
static void build_limits(iris_huff_table *t, const JHUFF_TBL *src)
{
  int32_t code = 0;
  int k = 0;
  for (int l = 1; l <= 16; l++) {
    int n = src->bits[l];
    t->valoffset[l] = k - code;
    code += n;
    k += n;
    t->maxcode[l] = n ? code - 1 : -1;
    code <<= 1;
  }
  memcpy(t->huffval, src->huffval, sizeof(t->huffval));
}

/* Fills the lookup: every FAST_BITS-bit prefix that starts with a code of
 * at most FAST_BITS bits. */
static void build_fast(iris_huff_table *t, const JHUFF_TBL *src, int ac,
                       int bits)
{
  uint32_t code = 0;
  int k = 0;
  memset(t->fast, 0, sizeof(t->fast));
  for (int l = 1; l <= bits; l++) {
    for (int i = 0; i < src->bits[l]; i++, code++) {
      int sym = src->huffval[k++];
      int run = ac ? sym >> 4 : 0, s = sym & 15;
      int spare = bits - l;
      for (uint32_t tail = 0; tail < (1u << spare); tail++) {
        uint32_t entry;
        if (ac && s == 0) {
          entry = (uint32_t)l | ((run == 15 ? 15u : 63u) << 8) | KIND_COEF;
        } else if (s == 0) {
          entry = (uint32_t)l | KIND_COEF;
        } else if (l + s <= bits) {
          uint32_t x = tail >> (spare - s);
          entry = (uint32_t)(l + s) | ((uint32_t)run << 8) | KIND_COEF |
                  ((uint32_t)(uint16_t)extend(x, s) << 16);
        } else {
          entry = (uint32_t)l | ((uint32_t)run << 8) | KIND_SYMBOL |
                  ((uint32_t)s << 16);
        }
        t->fast[(code << spare) | tail] = entry;
      }
    }
    code <<= 1;
  }
}

static void build_table(iris_huff_table *t, const JHUFF_TBL *src, int ac)
{
  build_limits(t, src);
  build_fast(t, src, ac, ac ? IRIS_HUFF_FAST_BITS : IRIS_HUFF_DC_FAST_BITS);
}

static void warn(j_decompress_ptr cinfo, int code)
{
  cinfo->err->msg_code = code;
  (*cinfo->err->emit_message)((j_common_ptr)cinfo, -1);
}

/* True when any of the eight bytes of w is 0xFF. */
static int has_ff(uint64_t w)
{
  uint64_t v = ~w;
  return ((v - 0x0101010101010101ull) & ~v & 0x8080808080808080ull) != 0;
}

/* Byte-at-a-time refill: stuffing, fill bytes, the marker where the data
 * ends, and the end of the buffer. */
static iris_bitreader refill_slow(iris_huffman *h, iris_bitreader br)
{
  j_decompress_ptr cinfo = h->cinfo;
  while (!br.marker && br.nbits <= 56) {
    unsigned c;
    const JOCTET *q;
    if (br.p >= h->end) {
      /* Out of bytes: the source decides (the memory source warns, then
       * supplies an EOI marker). */
      cinfo->src->bytes_in_buffer = 0;
      cinfo->src->next_input_byte = br.p;
      if (!(*cinfo->src->fill_input_buffer)(cinfo)) {
        br.marker = 1;
        break;
      }
      br.p = cinfo->src->next_input_byte;
      h->end = br.p + cinfo->src->bytes_in_buffer;
      continue;
    }
    c = *br.p;
    if (c == 0xFF) {
      q = br.p + 1;
      while (q < h->end && *q == 0xFF) q++;
      if (q >= h->end) {
        /* Fill bytes up to the end of the buffer. */
        br.p = h->end;
        continue;
      }
      if (*q != 0) {
        /* A marker: the data ends at its first FF, where the marker
         * reader will look. */
        br.marker = 1;
        break;
      }
      br.p = q + 1;
    } else {
      br.p++;
    }
    br.bits |= (uint64_t)c << (56 - br.nbits);
    br.nbits += 8;
  }
  return br;
}

/* Tops the buffer up to 56 bits or more (or to the end of the data).
 * Without 0xFF in the next eight bytes, this is branch-free: the usual
 * case, once per five symbols at most. */
static inline __attribute__((always_inline)) void refill(iris_huffman *h,
                                                         iris_bitreader *br)
{
  if (__builtin_expect(br->p + 8 <= h->end && !br->marker, 1)) {
    uint64_t w;
    memcpy(&w, br->p, 8);
    if (__builtin_expect(!has_ff(w), 1)) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
      w = __builtin_bswap64(w);
#endif
      br->bits |= w >> br->nbits;
      br->p += (63 - br->nbits) >> 3;
      br->nbits |= 56;
      return;
    }
  }
  if (br->nbits <= 56) *br = refill_slow(h, *br);
}

/* Drops n (0..63) bits. */
static inline __attribute__((always_inline)) void skip(iris_bitreader *br,
                                                       uint32_t n)
{
  br->bits <<= n & 63;
  br->nbits -= (int)(n & 63);
}

static inline __attribute__((always_inline)) uint32_t take(iris_bitreader *br,
                                                           int n)
{
  uint32_t x = (uint32_t)(br->bits >> (64 - n));
  skip(br, (uint32_t)n);
  return x;
}

/* A code longer than FAST_BITS: its symbol. */
static inline __attribute__((always_inline)) int decode_long(
    iris_huffman *h, iris_bitreader *br, const iris_huff_table *t, int bits)
{
  for (int l = bits + 1; l <= 16; l++) {
    int32_t code = (int32_t)(br->bits >> (64 - l));
    if (code <= t->maxcode[l]) {
      skip(br, (uint32_t)l);
      return t->huffval[(t->valoffset[l] + code) & 0xFF];
    }
  }
  warn(h->cinfo, JWRN_HUFF_BAD_CODE);
  /* If the warning returns: libjpeg goes on with symbol 0. */
  skip(br, 16);
  return 0;
}

/* One DC difference. */
static inline __attribute__((always_inline)) int32_t decode_dc(
    iris_huffman *h, iris_bitreader *br, const iris_huff_table *t)
{
  uint32_t e, s;
  refill(h, br);
  e = t->fast[br->bits >> (64 - IRIS_HUFF_DC_FAST_BITS)];
  if (e & KIND_COEF) {
    skip(br, e);
    return (int16_t)(e >> 16);
  }
  if (e & KIND_SYMBOL) {
    skip(br, e);
    s = e >> 16;
  } else {
    s = (uint32_t)decode_long(h, br, t, IRIS_HUFF_DC_FAST_BITS) & 15;
  }
  if (s == 0) return 0;
  refill(h, br);
  return extend(take(br, (int)s), (int)s);
}

/* A symbol the table does not resolve in one step (its extra bits do not
 * fit, or its code is long): decoded in parts. Returns the new k. */
static inline __attribute__((always_inline)) int decode_ac_slow(
    iris_huffman *h, iris_bitreader *br, const iris_huff_table *t, JCOEF *block,
    uint32_t e, int k)
{
  int sym = (e & KIND_SYMBOL) ? (int)(((e >> 8) & 15) << 4 | (e >> 16))
                              : decode_long(h, br, t, IRIS_HUFF_FAST_BITS);
  int r = sym >> 4, s = sym & 15;
  if (s) {
    k += r;
    refill(h, br);
    block[NATURAL[k]] = (JCOEF)extend(take(br, s), s);
    return k + 1;
  }
  return r == 15 ? k + 16 : 64;
}

/* One symbol: the step it resolves to, or its decoding in parts. True
 * when the block goes on and another symbol can be read without a refill
 * (a one-step symbol takes at most FAST_BITS). */
static inline __attribute__((always_inline)) int decode_ac_step(
    iris_huffman *h, iris_bitreader *br, const iris_huff_table *t, JCOEF *block,
    int *k)
{
  uint32_t e = t->fast[br->bits >> (64 - IRIS_HUFF_FAST_BITS)];
  skip(br, e);
  if (__builtin_expect(!(e & KIND_COEF), 0)) {
    *k = decode_ac_slow(h, br, t, block, e, *k);
    return 0;
  }
  *k += (int)((e >> 8) & 63);
  block[NATURAL[*k]] = (JCOEF)(int16_t)(e >> 16);
  return ++*k < 64;
}

/* The AC coefficients of one block (zigzag 1..63), up to five symbols
 * per refill (a refill leaves at least 56 bits, a one-step symbol takes
 * at most FAST_BITS). */
_Static_assert(5 * IRIS_HUFF_FAST_BITS <= 56,
               "five one-step symbols fit in the bits a refill leaves");
static inline __attribute__((always_inline)) void decode_ac(
    iris_huffman *h, iris_bitreader *br, const iris_huff_table *t, JCOEF *block)
{
  int k = 1;
  while (k < 64) {
    refill(h, br);
    if (decode_ac_step(h, br, t, block, &k) &&
        decode_ac_step(h, br, t, block, &k) &&
        decode_ac_step(h, br, t, block, &k) &&
        decode_ac_step(h, br, t, block, &k))
      decode_ac_step(h, br, t, block, &k);
  }
}

/* The next marker at or after `q`: its first FF (fill FFs included), or
 * the end of the buffer. Data the decoding did not use is passed over. */
static const JOCTET *next_marker(const iris_huffman *h, const JOCTET *q)
{
  while (q < h->end) {
    const JOCTET *r;
    if (*q != 0xFF) {
      q++;
      continue;
    }
    r = q + 1;
    while (r < h->end && *r == 0xFF) r++;
    if (r >= h->end || *r != 0) break;
    q = r + 1;
  }
  return q;
}

/* Hands the source back to libjpeg at the next marker. */
static void give_back(iris_huffman *h)
{
  j_decompress_ptr cinfo = h->cinfo;
  const JOCTET *q = next_marker(h, h->br.p);
  cinfo->src->bytes_in_buffer -= (size_t)(q - cinfo->src->next_input_byte);
  cinfo->src->next_input_byte = q;
}

/* Before an MCU that starts a restart interval: libjpeg's marker reader
 * checks the restart marker (and resynchronises, warning, on a wrong
 * one); then the bit reader and the DC predictions start afresh. */
static void restart(iris_huffman *h)
{
  j_decompress_ptr cinfo = h->cinfo;
  give_back(h);
  (*cinfo->marker->read_restart_marker)(cinfo);
  h->br = (iris_bitreader){0, cinfo->src->next_input_byte, 0,
                           cinfo->unread_marker != 0};
  h->end = h->br.p + cinfo->src->bytes_in_buffer;
  memset(h->last_dc, 0, sizeof(h->last_dc));
  h->restarts_to_go = cinfo->restart_interval;
}

/* libjpeg starting a new scan (never for the files installed on): its
 * own decoder takes over. */
static void start_pass(j_decompress_ptr cinfo)
{
  iris_huffman *h = (iris_huffman *)cinfo->entropy;
  cinfo->entropy = h->libjpeg;
  (*cinfo->entropy->start_pass)(cinfo);
}

/* The blocks of one MCU, with the bit reader in registers. */
static inline __attribute__((always_inline)) void decode_blocks(
    iris_huffman *h, JBLOCKROW *MCU_data)
{
  iris_bitreader br = h->br;
  const iris_block_plan *plan = h->plan, *end = plan + h->blocks_in_mcu;
  JBLOCK scratch;
  for (; plan < end; plan++) {
    /* libjpeg passes no blocks when it skips data: decoded, dropped. */
    JCOEF *block = MCU_data ? (*MCU_data++)[0] : scratch;
    int32_t dc = *plan->last_dc + decode_dc(h, &br, plan->dc);
    *plan->last_dc = dc;
    block[0] = (JCOEF)dc;
    decode_ac(h, &br, plan->ac, block);
  }
  h->br = br;
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("bmi2"))) static void decode_blocks_bmi2(
    iris_huffman *h, JBLOCKROW *MCU_data)
{
  decode_blocks(h, MCU_data);
}
#define HAVE_BMI2_PATH 1
#else
#define HAVE_BMI2_PATH 0
#endif

static void decode_blocks_plain(iris_huffman *h, JBLOCKROW *MCU_data)
{
  decode_blocks(h, MCU_data);
}

static boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data)
{
  iris_huffman *h = (iris_huffman *)cinfo->entropy;
  if (cinfo->restart_interval) {
    if (h->restarts_to_go == 0) restart(h);
    h->restarts_to_go--;
  }
#if HAVE_BMI2_PATH
  if (h->bmi2) {
    decode_blocks_bmi2(h, MCU_data);
  } else
#endif
  {
    decode_blocks_plain(h, MCU_data);
  }
  if (h->br.nbits < 0) warn(cinfo, JWRN_HIT_MARKER);
  if (++h->mcus == h->total_mcus) give_back(h);
  return TRUE;
}

int iris_huffman_install(j_decompress_ptr cinfo, iris_huffman *h)
{
  if (cinfo->progressive_mode || cinfo->arith_code || cinfo->Ss != 0 ||
      cinfo->Se != 63 || cinfo->Ah != 0 || cinfo->Al != 0 ||
      cinfo->data_precision != 8 || cinfo->comps_in_scan < 1 ||
      cinfo->comps_in_scan > MAX_COMPS_IN_SCAN ||
      cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU ||
      cinfo->entropy->insufficient_data)
    return 0;
  memset(h, 0, offsetof(iris_huffman, dc_tables));
  h->cinfo = cinfo;
  for (int ci = 0; ci < cinfo->comps_in_scan; ci++) {
    const jpeg_component_info *comp = cinfo->cur_comp_info[ci];
    int dn = comp->dc_tbl_no, an = comp->ac_tbl_no;
    const JHUFF_TBL *dc = cinfo->dc_huff_tbl_ptrs[dn];
    const JHUFF_TBL *ac = cinfo->ac_huff_tbl_ptrs[an];
    if (dc == NULL || ac == NULL) return 0;
    build_table(&h->dc_tables[dn], dc, 0);
    build_table(&h->ac_tables[an], ac, 1);
  }
  for (int b = 0; b < cinfo->blocks_in_MCU; b++) {
    int ci = cinfo->MCU_membership[b];
    const jpeg_component_info *comp = cinfo->cur_comp_info[ci];
    h->plan[b].dc = &h->dc_tables[comp->dc_tbl_no];
    h->plan[b].ac = &h->ac_tables[comp->ac_tbl_no];
    h->plan[b].last_dc = &h->last_dc[ci];
  }
  h->blocks_in_mcu = cinfo->blocks_in_MCU;
  h->br.p = cinfo->src->next_input_byte;
  h->br.marker = cinfo->unread_marker != 0;
  h->end = h->br.p + cinfo->src->bytes_in_buffer;
  h->restarts_to_go = cinfo->restart_interval;
  h->total_mcus = (uint64_t)cinfo->MCUs_per_row * cinfo->MCU_rows_in_scan;
#if HAVE_BMI2_PATH
  __builtin_cpu_init();
  h->bmi2 = __builtin_cpu_supports("bmi2");
#endif
  h->libjpeg = cinfo->entropy;
  h->pub = *cinfo->entropy;
  h->pub.start_pass = start_pass;
  h->pub.decode_mcu = decode_mcu;
  cinfo->entropy = &h->pub;
  return 1;
}
