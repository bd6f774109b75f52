/*
 * YCbCr -> RGB for src/decode/jpeg_rows.c with AVX-512 (BW and VBMI), in
 * place of libjpeg's AVX2 conversion: the same bytes, 64 pixels a step.
 *
 * libjpeg's conversion (jdcolor.c, and its SIMD forms, which give the same
 * bytes) is, with x = Cb - 128 or Cr - 128 and >> a floor shift:
 *   R = clamp(Y + ((91881 Cr' + 32768) >> 16))
 *   G = clamp(Y + ((-22554 Cb' - 46802 Cr' + 32768) >> 16))
 *   B = clamp(Y + ((116130 Cb' + 32768) >> 16))
 * Each product is split so that its coefficient fits a signed 16-bit
 * multiply-add (vpmaddwd) and the rest is a whole multiple of 65536, which
 * leaves the shift exactly:
 *   91881 = 65536 + 26345, -46802 = -65536 + 18734, 116130 = 131072 - 14942
 * so R = Y + Cr' + ((26345 Cr' + 32768) >> 16), G = Y - Cr' +
 * ((-22554 Cb' + 18734 Cr' + 32768) >> 16), B = Y + 2 Cb' + ((-14942 Cb' +
 * 32768) >> 16). R's and B's shifts come from a 16-bit multiply's high
 * half, plus one when its low half is 32768 or more (the carry of the
 * rounding term); G's two products from one pair multiply-add in 32 bits.
 * Then 16-bit lanes, clamped by a saturating pack, and the three planes
 * interleaved into RGB by byte permutes.
 *
 * A test (`decode::jpeg_rows`) compares it with libjpeg's own on all
 * 2^24 (Y, Cb, Cr).
 */

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "jpeg_color.h"

/* One pixel, libjpeg's formula. */
static void convert_one(int y, int cb, int cr, JSAMPLE *out)
{
  int xb = cb - 128, xr = cr - 128;
  int r = y + ((91881 * xr + 32768) >> 16);
  int g = y + ((-22554 * xb - 46802 * xr + 32768) >> 16);
  int b = y + ((116130 * xb + 32768) >> 16);
  out[0] = (JSAMPLE)(r < 0 ? 0 : r > 255 ? 255 : r);
  out[1] = (JSAMPLE)(g < 0 ? 0 : g > 255 ? 255 : g);
  out[2] = (JSAMPLE)(b < 0 ? 0 : b > 255 ? 255 : b);
}

#if defined(__x86_64__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi")))

/* Where pixel p's byte lands after a saturating pack of pixels 0-31 (a)
 * and 32-63 (b): the pack interleaves the two by 128-bit lane. */
static int packed_position(int p)
{
  int half = p / 32, q = p % 32;
  return 16 * (q / 8) + 8 * half + q % 8;
}

/* Permute indices building the three RGB output vectors: for vector v,
 * `rg` takes R and G bytes (R from the first source, G from the second),
 * `b` takes the B bytes, written only where `bmask` is set. */
typedef struct rgb_shuffle {
  uint8_t rg[3][64];
  uint8_t b[3][64];
  __mmask64 bmask[3];
} rgb_shuffle;

static rgb_shuffle make_shuffle(void)
{
  rgb_shuffle s;
  memset(&s, 0, sizeof(s));
  for (int v = 0; v < 3; v++) {
    for (int i = 0; i < 64; i++) {
      int j = 64 * v + i, p = j / 3, c = j % 3;
      int at = packed_position(p);
      if (c == 2) {
        s.b[v][i] = (uint8_t)at;
        s.bmask[v] |= (__mmask64)1 << i;
      } else {
        s.rg[v][i] = (uint8_t)(c == 0 ? at : 64 + at);
      }
    }
  }
  return s;
}

/* 32 chroma bytes as 16-bit x = c - 128. */
TARGET static inline __m512i centred(__m256i c)
{
  return _mm512_sub_epi16(_mm512_cvtepu8_epi16(c), _mm512_set1_epi16(128));
}

/* (a, b) pairs times (ca, cb), plus `bias`, shifted right 16 (floor), for
 * 32 lanes of a and b: 32 16-bit results, in order. */
TARGET static inline __m512i madd_shift(__m512i a, __m512i b, int ca, int cb,
                                        int bias)
{
  __m512i k = _mm512_set1_epi32((int)(((uint32_t)(uint16_t)cb << 16) |
                                      (uint16_t)ca));
  __m512i lo = _mm512_madd_epi16(_mm512_unpacklo_epi16(a, b), k);
  __m512i hi = _mm512_madd_epi16(_mm512_unpackhi_epi16(a, b), k);
  __m512i round = _mm512_set1_epi32(bias);
  lo = _mm512_srai_epi32(_mm512_add_epi32(lo, round), 16);
  hi = _mm512_srai_epi32(_mm512_add_epi32(hi, round), 16);
  return _mm512_packs_epi32(lo, hi);
}

/* (c x + 32768) >> 16 for 32 lanes of x, from the product's two halves:
 * the high half, plus one when the low half (unsigned) is 32768 or more. */
TARGET static inline __m512i mul_round(__m512i x, int c)
{
  __m512i k = _mm512_set1_epi16((short)c);
  return _mm512_add_epi16(_mm512_mulhi_epi16(x, k),
                          _mm512_srli_epi16(_mm512_mullo_epi16(x, k), 15));
}

/* 32 pixels' R, G and B as 16-bit lanes (not yet clamped). */
TARGET static inline void convert32(__m256i y8, __m256i cb8, __m256i cr8,
                                    __m512i *r, __m512i *g, __m512i *b)
{
  __m512i y = _mm512_cvtepu8_epi16(y8);
  __m512i xb = centred(cb8), xr = centred(cr8);
  *r = _mm512_add_epi16(_mm512_add_epi16(y, xr), mul_round(xr, 26345));
  *g = _mm512_add_epi16(_mm512_sub_epi16(y, xr),
                        madd_shift(xb, xr, -22554, 18734, 32768));
  *b = _mm512_add_epi16(_mm512_add_epi16(y, _mm512_add_epi16(xb, xb)),
                        mul_round(xb, -14942));
}

TARGET static void convert_row(const rgb_shuffle *s, const JSAMPLE *y,
                               const JSAMPLE *cb, const JSAMPLE *cr,
                               JSAMPLE *out, JDIMENSION n)
{
  JDIMENSION col = 0;
  for (; col + 64 <= n; col += 64) {
    __m512i r0, g0, b0, r1, g1, b1, r, g, b;
    convert32(_mm256_loadu_si256((const __m256i *)(y + col)),
              _mm256_loadu_si256((const __m256i *)(cb + col)),
              _mm256_loadu_si256((const __m256i *)(cr + col)), &r0, &g0,
              &b0);
    convert32(_mm256_loadu_si256((const __m256i *)(y + col + 32)),
              _mm256_loadu_si256((const __m256i *)(cb + col + 32)),
              _mm256_loadu_si256((const __m256i *)(cr + col + 32)), &r1,
              &g1, &b1);
    r = _mm512_packus_epi16(r0, r1);
    g = _mm512_packus_epi16(g0, g1);
    b = _mm512_packus_epi16(b0, b1);
    for (int v = 0; v < 3; v++) {
      __m512i rg = _mm512_permutex2var_epi8(
          r, _mm512_loadu_si512((const void *)s->rg[v]), g);
      __m512i px = _mm512_mask_permutexvar_epi8(
          rg, s->bmask[v], _mm512_loadu_si512((const void *)s->b[v]), b);
      _mm512_storeu_si512((void *)(out + 3 * col + 64 * v), px);
    }
  }
  for (; col < n; col++) convert_one(y[col], cb[col], cr[col], out + 3 * col);
}

static rgb_shuffle SHUFFLE;
static pthread_once_t SHUFFLE_ONCE = PTHREAD_ONCE_INIT;

static void init_shuffle(void)
{
  SHUFFLE = make_shuffle();
}

static void convert(j_decompress_ptr cinfo, JSAMPIMAGE input_buf,
                    JDIMENSION input_row, JSAMPARRAY output_buf, int num_rows)
{
  for (int i = 0; i < num_rows; i++, input_row++) {
    convert_row(&SHUFFLE, input_buf[0][input_row], input_buf[1][input_row],
                input_buf[2][input_row], output_buf[i],
                cinfo->output_width);
  }
}

int iris_color_install(j_decompress_ptr cinfo)
{
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vbmi"))
    return 0;
  if (cinfo->jpeg_color_space != JCS_YCbCr ||
      cinfo->out_color_space != JCS_EXT_RGB || cinfo->num_components != 3 ||
      cinfo->data_precision != 8 || cinfo->quantize_colors)
    return 0;
  pthread_once(&SHUFFLE_ONCE, init_shuffle);
  cinfo->cconvert->color_convert = convert;
  return 1;
}

#else

int iris_color_install(j_decompress_ptr cinfo)
{
  (void)cinfo;
  return 0;
}

#endif
