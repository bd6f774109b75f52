/*
 * libjpeg's h2v2 fancy chroma upsampling and YCbCr -> RGB conversion in one
 * pass over each output row, with AVX-512, for jpeg_rows.c's raw-data
 * decoding of 4:2:0 files. libjpeg does them as two passes, the first
 * writing full-size Cb and Cr rows for the second to read.
 *
 * Upsampling (jdsample.c, h2v2_fancy_upsample; its SIMD forms give the
 * same bytes): with s[j] = 3 near[j] + far[j], near the chroma row nearest
 * the output row and far the next nearest (the output row's chroma row's
 * neighbour above for even rows, below for odd ones, the edge row itself
 * at the image's top and bottom), and s[-1] = s[0], s[w] = s[w - 1]:
 *   out[2j] = (3 s[j] + s[j - 1] + 8) >> 4
 *   out[2j + 1] = (3 s[j] + s[j + 1] + 7) >> 4
 * (libjpeg writes the first and last columns as special cases, which is
 * what the repeated edges give.)
 *
 * Conversion (jdcolor.c), with x = Cb - 128 or Cr - 128 and >> a floor
 * shift:
 *   R = clamp(Y + ((91881 Cr' + 32768) >> 16))
 *   G = clamp(Y + ((-22554 Cb' - 46802 Cr' + 32768) >> 16))
 *   B = clamp(Y + ((116130 Cb' + 32768) >> 16))
 * Each product is split so that its coefficient fits a signed 16-bit
 * multiply and the rest is a whole multiple of 65536, which leaves the
 * shift exact: 91881 = 65536 + 26345, -46802 = -65536 + 18734, 116130 =
 * 131072 - 14942. R's and B's shifts come from a 16-bit multiply's high
 * half, plus one when its low half is 32768 or more (the rounding term's
 * carry); G's two products from one pair multiply-add in 32 bits. Then
 * 16-bit lanes are clamped by a saturating pack and the three planes
 * interleaved into RGB by byte permutes, 64 pixels a step.
 *
 * Tests (`decode::jpeg_rows`): every (Y, Cb, Cr) against the formula,
 * and whole images against libjpeg's own upsampling and conversion.
 */

#include <pthread.h>
#include <string.h>

#include "jpeg_color.h"

/* One pixel, libjpeg's formula. */
static void convert_one(int y, int cb, int cr, uint8_t *out)
{
  int xb = cb - 128, xr = cr - 128;
  int r = y + ((91881 * xr + 32768) >> 16);
  int g = y + ((-22554 * xb - 46802 * xr + 32768) >> 16);
  int b = y + ((116130 * xb + 32768) >> 16);
  out[0] = (uint8_t)(r < 0 ? 0 : r > 255 ? 255 : r);
  out[1] = (uint8_t)(g < 0 ? 0 : g > 255 ? 255 : g);
  out[2] = (uint8_t)(b < 0 ? 0 : b > 255 ? 255 : b);
}

/* Upsampled chroma at pixel x from the column sums (with their edges). */
static int upsampled(const int16_t *sums, int x)
{
  const int16_t *s = sums + 1 + (x >> 1);
  return (x & 1) ? (3 * s[0] + s[1] + 7) >> 4 : (3 * s[0] + s[-1] + 8) >> 4;
}

/* Column sums from sample `j` on, and the two edges. */
static void sums_from(const uint8_t *near, const uint8_t *far, int j,
                      int width, int16_t *sums)
{
  for (; j < width; j++) sums[1 + j] = (int16_t)(3 * near[j] + far[j]);
  sums[0] = sums[1];
  sums[width + 1] = sums[width];
}

/* Pixels from `x` on, one at a time. */
static void row_from(const uint8_t *y, const int16_t *cb_sums,
                     const int16_t *cr_sums, uint8_t *out, int x, int width)
{
  for (; x < width; x++)
    convert_one(y[x], upsampled(cb_sums, x), upsampled(cr_sums, x), out + 3 * x);
}

#if defined(__x86_64__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi")))

/* The byte permutes that interleave 64 pixels' R, G and B planes: for
 * output vector v, `rg` takes R and G bytes (R from the first source, G
 * from the second), `b` the B bytes, written where `bmask` is set. */
typedef struct rgb_shuffle {
  uint8_t rg[3][64];
  uint8_t b[3][64];
  __mmask64 bmask[3];
} rgb_shuffle;

static rgb_shuffle SHUFFLE;
static pthread_once_t SHUFFLE_ONCE = PTHREAD_ONCE_INIT;

/* Where pixel p's byte lands after a saturating pack of pixels 0-31 (a)
 * and 32-63 (b): the pack interleaves the two by 128-bit lane. */
static int packed_position(int p)
{
  int half = p / 32, q = p % 32;
  return 16 * (q / 8) + 8 * half + q % 8;
}

static void build_shuffle(void)
{
  memset(&SHUFFLE, 0, sizeof(SHUFFLE));
  for (int v = 0; v < 3; v++) {
    for (int i = 0; i < 64; i++) {
      int j = 64 * v + i, p = j / 3, c = j % 3;
      int at = packed_position(p);
      if (c == 2) {
        SHUFFLE.b[v][i] = (uint8_t)at;
        SHUFFLE.bmask[v] |= (__mmask64)1 << i;
      } else {
        SHUFFLE.rg[v][i] = (uint8_t)(c == 0 ? at : 64 + at);
      }
    }
  }
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

/* 32 pixels' R, G and B as 16-bit lanes (not yet clamped) from 16-bit Y,
 * Cb and Cr. */
TARGET static inline void convert32(__m512i y, __m512i cb, __m512i cr,
                                    __m512i *r, __m512i *g, __m512i *b)
{
  __m512i half = _mm512_set1_epi16(128);
  __m512i xb = _mm512_sub_epi16(cb, half), xr = _mm512_sub_epi16(cr, half);
  *r = _mm512_add_epi16(_mm512_add_epi16(y, xr), mul_round(xr, 26345));
  *g = _mm512_add_epi16(_mm512_sub_epi16(y, xr),
                        madd_shift(xb, xr, -22554, 18734, 32768));
  *b = _mm512_add_epi16(_mm512_add_epi16(y, _mm512_add_epi16(xb, xb)),
                        mul_round(xb, -14942));
}

TARGET void iris_color_sums(const uint8_t *near, const uint8_t *far, int width,
                            int16_t *sums)
{
  int j = 0;
  for (; j + 32 <= width; j += 32) {
    __m512i n = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(near + j)));
    __m512i f = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(far + j)));
    _mm512_storeu_si512((void *)(sums + 1 + j),
                        _mm512_add_epi16(_mm512_add_epi16(n, _mm512_add_epi16(n, n)), f));
  }
  sums_from(near, far, j, width, sums);
}

/* The 64 upsampled samples of pixels 2 j .. 2 j + 63, in pixel order as
 * two vectors of 16-bit lanes. */
TARGET static inline void upsample64(const int16_t *sums, int j, __m512i *a,
                                     __m512i *b)
{
  __m512i s = _mm512_loadu_si512((const void *)(sums + 1 + j));
  __m512i left = _mm512_loadu_si512((const void *)(sums + j));
  __m512i right = _mm512_loadu_si512((const void *)(sums + 2 + j));
  __m512i s3 = _mm512_add_epi16(s, _mm512_add_epi16(s, s));
  __m512i even = _mm512_srli_epi16(
      _mm512_add_epi16(_mm512_add_epi16(s3, left), _mm512_set1_epi16(8)), 4);
  __m512i odd = _mm512_srli_epi16(
      _mm512_add_epi16(_mm512_add_epi16(s3, right), _mm512_set1_epi16(7)), 4);
  /* The unpacks interleave within 128-bit lanes; the qword permutes put
   * those lanes back in pixel order. */
  __m512i lo = _mm512_unpacklo_epi16(even, odd);
  __m512i hi = _mm512_unpackhi_epi16(even, odd);
  *a = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi);
  *b = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), hi);
}

TARGET void iris_color_row(const uint8_t *y, const int16_t *cb_sums,
                           const int16_t *cr_sums, uint8_t *out, int width)
{
  int x = 0;
  pthread_once(&SHUFFLE_ONCE, build_shuffle);
  for (; x + 64 <= width; x += 64) {
    __m512i cb0, cb1, cr0, cr1, r0, g0, b0, r1, g1, b1, r, g, b;
    upsample64(cb_sums, x / 2, &cb0, &cb1);
    upsample64(cr_sums, x / 2, &cr0, &cr1);
    convert32(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(y + x))),
              cb0, cr0, &r0, &g0, &b0);
    convert32(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(y + x + 32))),
              cb1, cr1, &r1, &g1, &b1);
    r = _mm512_packus_epi16(r0, r1);
    g = _mm512_packus_epi16(g0, g1);
    b = _mm512_packus_epi16(b0, b1);
    for (int v = 0; v < 3; v++) {
      __m512i rg = _mm512_permutex2var_epi8(
          r, _mm512_loadu_si512((const void *)SHUFFLE.rg[v]), g);
      __m512i px = _mm512_mask_permutexvar_epi8(
          rg, SHUFFLE.bmask[v], _mm512_loadu_si512((const void *)SHUFFLE.b[v]), b);
      _mm512_storeu_si512((void *)(out + 3 * x + 64 * v), px);
    }
  }
  row_from(y, cb_sums, cr_sums, out, x, width);
}

#else

void iris_color_sums(const uint8_t *near, const uint8_t *far, int width,
                     int16_t *sums)
{
  sums_from(near, far, 0, width, sums);
}

void iris_color_row(const uint8_t *y, const int16_t *cb_sums,
                    const int16_t *cr_sums, uint8_t *out, int width)
{
  row_from(y, cb_sums, cr_sums, out, 0, width);
}

#endif
