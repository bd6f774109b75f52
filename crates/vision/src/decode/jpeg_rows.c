/*
 * Row-by-row JPEG decoding through libjpeg's scanline API, for
 * src/decode/jpeg_rows.rs.
 *
 * Decodes exactly as TurboJPEG's tj3Decompress8 does with TJPF_RGB (the
 * whole-image path): output colour space JCS_EXT_RGB, ISLOW IDCT, fancy
 * upsampling, every libjpeg warning turned into an error (the
 * TJPARAM_STOPONWARNING the whole-image path sets). 4:2:0 files may be
 * decoded as raw data instead, their rows then made by jpeg_color.c with
 * libjpeg's arithmetic (see iris_raw below). Only single-scan
 * files are streamed; iris_jpeg_rows_start reports multi-scan
 * (progressive) files so the caller falls back to the whole-image path.
 *
 * libjpeg reports errors by calling error_exit, which must not return:
 * every entry point below sets its own setjmp target, so the longjmp
 * never leaves C frames.
 */

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jpeg_color.h"
#include "jpeg_huffman.h"

/*
 * 4:2:0 files decoded as raw data (libjpeg's IDCT output, no upsampling or
 * colour conversion), each RGB row made from it by jpeg_color.c in one
 * pass. Two iMCU rows are kept: an output row's chroma may lie in the
 * iMCU row after its own (the next nearest chroma row of its last row).
 */
typedef struct iris_raw {
  int on;
  int y_pitch, c_pitch;     /* the components' row lengths in the buffers */
  int c_width, c_height;    /* the chroma planes' real size */
  int decoded;              /* iMCU rows read */
  int next_row;             /* the next output row */
  JSAMPLE *y, *cb, *cr;     /* two iMCU rows of each component */
  int16_t *cb_sums, *cr_sums;
} iris_raw;

typedef struct iris_jpeg_rows {
  struct jpeg_decompress_struct cinfo;
  struct jpeg_error_mgr jerr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  int created;
  /* Tests: libjpeg's warning about unused bytes is not an error. */
  int past_extraneous;
  iris_huffman huffman;
  iris_raw raw;
  /* What iris_jpeg_rows_start was given (a crop restarts without raw). */
  const unsigned char *data;
  unsigned long len;
  int flags;
} iris_jpeg_rows;

/* iris_jpeg_rows_start's flags. */
#define IRIS_ROWS_OWN_HUFFMAN 1   /* jpeg_huffman.c decodes the data */
#define IRIS_ROWS_PAST_EXTRANEOUS 2 /* tests: see past_extraneous */
/* jpeg_color.c upsamples and converts (the caller checks the CPU: see
 * iris_color_row) */
#define IRIS_ROWS_OWN_COLOR 4

static void iris_error_exit(j_common_ptr cinfo)
{
  iris_jpeg_rows *self = (iris_jpeg_rows *)cinfo->client_data;
  (*cinfo->err->format_message)(cinfo, self->message);
  longjmp(self->jump, 1);
}

static void iris_emit_message(j_common_ptr cinfo, int msg_level)
{
  iris_jpeg_rows *self = (iris_jpeg_rows *)cinfo->client_data;
  if (msg_level < 0 && !(self->past_extraneous &&
                         cinfo->err->msg_code == JWRN_EXTRANEOUS_DATA)) {
    /* A warning (corrupt data, premature end): an error here. */
    (*cinfo->err->format_message)(cinfo, self->message);
    longjmp(self->jump, 1);
  }
}

static void iris_output_message(j_common_ptr cinfo)
{
  (void)cinfo;
}

/* Creates the libjpeg object; 0, or -1 if libjpeg fails. */
static int create(iris_jpeg_rows *self)
{
  if (setjmp(self->jump)) return -1;
  jpeg_create_decompress(&self->cinfo);
  self->created = 1;
  return 0;
}

/* A decoder, or NULL when out of memory. */
iris_jpeg_rows *iris_jpeg_rows_new(void)
{
  iris_jpeg_rows *self = (iris_jpeg_rows *)calloc(1, sizeof(iris_jpeg_rows));
  if (self == NULL) return NULL;
  self->cinfo.err = jpeg_std_error(&self->jerr);
  self->jerr.error_exit = iris_error_exit;
  self->jerr.emit_message = iris_emit_message;
  self->jerr.output_message = iris_output_message;
  self->cinfo.client_data = self;
  strcpy(self->message, "unknown libjpeg error");
  if (create(self) != 0) {
    free(self);
    return NULL;
  }
  return self;
}

static void raw_free(iris_raw *raw)
{
  free(raw->y);
  free(raw->cb);
  free(raw->cr);
  free(raw->cb_sums);
  free(raw->cr_sums);
  memset(raw, 0, sizeof(*raw));
}

void iris_jpeg_rows_free(iris_jpeg_rows *self)
{
  if (self == NULL) return;
  if (self->created) jpeg_destroy_decompress(&self->cinfo);
  raw_free(&self->raw);
  free(self);
}

/* Whether the header read is one jpeg_color.c decodes from raw data: YCbCr
 * 4:2:0 whose chroma libjpeg upsamples with its h2v2 fancy method (more
 * than two chroma columns). */
static int raw_fits(j_decompress_ptr cinfo)
{
  const jpeg_component_info *c = cinfo->comp_info;
  return cinfo->jpeg_color_space == JCS_YCbCr && cinfo->num_components == 3 &&
         c[0].h_samp_factor == 2 && c[0].v_samp_factor == 2 &&
         c[1].h_samp_factor == 1 && c[1].v_samp_factor == 1 &&
         c[2].h_samp_factor == 1 && c[2].v_samp_factor == 1 &&
         cinfo->image_width > 4;
}

/* After jpeg_start_decompress with raw_data_out: the buffers. 0, or -1
 * when out of memory. */
static int raw_setup(iris_raw *raw, j_decompress_ptr cinfo)
{
  const jpeg_component_info *c = cinfo->comp_info;
  raw->y_pitch = (int)c[0].width_in_blocks * DCTSIZE;
  raw->c_pitch = (int)c[1].width_in_blocks * DCTSIZE;
  raw->c_width = (int)c[1].downsampled_width;
  raw->c_height = (int)c[1].downsampled_height;
  raw->decoded = 0;
  raw->next_row = 0;
  raw->y = (JSAMPLE *)malloc((size_t)raw->y_pitch * 2 * 2 * DCTSIZE);
  raw->cb = (JSAMPLE *)malloc((size_t)raw->c_pitch * 2 * DCTSIZE);
  raw->cr = (JSAMPLE *)malloc((size_t)raw->c_pitch * 2 * DCTSIZE);
  /* The sums with their two edges, and room for a vector's read past. */
  raw->cb_sums = (int16_t *)malloc(((size_t)raw->c_width + 2 + 32) * sizeof(int16_t));
  raw->cr_sums = (int16_t *)malloc(((size_t)raw->c_width + 2 + 32) * sizeof(int16_t));
  if (!raw->y || !raw->cb || !raw->cr || !raw->cb_sums || !raw->cr_sums) return -1;
  raw->on = 1;
  return 0;
}

/* Reads the next iMCU row into its slot of the buffers (slot = row & 1). */
static void raw_read_imcu(iris_raw *raw, j_decompress_ptr cinfo)
{
  JSAMPROW y[2 * DCTSIZE], cb[DCTSIZE], cr[DCTSIZE];
  JSAMPARRAY planes[3] = {y, cb, cr};
  int slot = raw->decoded & 1;
  for (int i = 0; i < 2 * DCTSIZE; i++)
    y[i] = raw->y + (size_t)raw->y_pitch * (slot * 2 * DCTSIZE + i);
  for (int i = 0; i < DCTSIZE; i++) {
    cb[i] = raw->cb + (size_t)raw->c_pitch * (slot * DCTSIZE + i);
    cr[i] = raw->cr + (size_t)raw->c_pitch * (slot * DCTSIZE + i);
  }
  if (jpeg_read_raw_data(cinfo, planes, 2 * DCTSIZE) == 0)
    ERREXIT(cinfo, JERR_INPUT_EMPTY);
  raw->decoded++;
}

/* Row `row` of a component whose iMCU rows are `height` rows of `pitch`
 * bytes, in its buffer (the row's iMCU row must be one of the two kept). */
static const JSAMPLE *kept_row(const JSAMPLE *plane, int pitch, int height,
                               int row)
{
  return plane + (size_t)pitch * (((row / height) & 1) * height + row % height);
}

/* Up to `max_rows` (at most 16) RGB rows from raw data: the count
 * written. */
static int raw_rows(iris_raw *raw, j_decompress_ptr cinfo, unsigned char *dst,
                    unsigned long pitch, int max_rows)
{
  int done = 0;
  if (max_rows > 16) max_rows = 16;
  for (; done < max_rows && raw->next_row < (int)cinfo->output_height; done++) {
    int row = raw->next_row, near = row / 2;
    /* The next nearest chroma row: above for even rows, below for odd;
     * libjpeg repeats the first and last rows at the edges. */
    int far = (row & 1) ? near + 1 : near - 1;
    int needed;
    if (far < 0) far = 0;
    if (far > raw->c_height - 1) far = raw->c_height - 1;
    needed = (far > near ? far : near) / DCTSIZE + 1;
    while (raw->decoded < needed) raw_read_imcu(raw, cinfo);
    iris_color_sums(kept_row(raw->cb, raw->c_pitch, DCTSIZE, near),
                    kept_row(raw->cb, raw->c_pitch, DCTSIZE, far), raw->c_width,
                    raw->cb_sums);
    iris_color_sums(kept_row(raw->cr, raw->c_pitch, DCTSIZE, near),
                    kept_row(raw->cr, raw->c_pitch, DCTSIZE, far), raw->c_width,
                    raw->cr_sums);
    iris_color_row(kept_row(raw->y, raw->y_pitch, 2 * DCTSIZE, row), raw->cb_sums,
                   raw->cr_sums, dst + (unsigned long)done * pitch,
                   (int)cinfo->output_width);
    raw->next_row++;
  }
  return done;
}

const char *iris_jpeg_rows_message(const iris_jpeg_rows *self)
{
  return self->message;
}

/*
 * Reads the headers of `data` (which must outlive the decoder) and starts
 * decompression, with `flags` (IRIS_ROWS_*): the entropy decoding is
 * jpeg_huffman.c's with IRIS_ROWS_OWN_HUFFMAN where the file allows,
 * libjpeg's otherwise (the same coefficients); with IRIS_ROWS_OWN_COLOR,
 * 4:2:0 files on CPUs that can are decoded as raw data and upsampled and
 * converted by jpeg_color.c (the same bytes). Returns 1 when started
 * (size in *width, *height), 0 when the file has several scans (not
 * streamed; nothing started), -1 on error
 * (see iris_jpeg_rows_message).
 */
int iris_jpeg_rows_start(iris_jpeg_rows *self, const unsigned char *data,
                         unsigned long len, int flags,
                         unsigned int *width, unsigned int *height)
{
  j_decompress_ptr cinfo = &self->cinfo;
  if (setjmp(self->jump)) {
    jpeg_abort_decompress(cinfo);
    return -1;
  }
  self->past_extraneous = (flags & IRIS_ROWS_PAST_EXTRANEOUS) != 0;
  self->data = data;
  self->len = len;
  self->flags = flags;
  raw_free(&self->raw);
  jpeg_mem_src(cinfo, data, len);
  jpeg_read_header(cinfo, TRUE);
  if (jpeg_has_multiple_scans(cinfo) || cinfo->data_precision != 8) {
    jpeg_abort_decompress(cinfo);
    return 0;
  }
  cinfo->out_color_space = JCS_EXT_RGB;
  cinfo->dct_method = JDCT_ISLOW;
  cinfo->do_fancy_upsampling = TRUE;
  cinfo->scale_num = 1;
  cinfo->scale_denom = 1;
  cinfo->raw_data_out = (flags & IRIS_ROWS_OWN_COLOR) && raw_fits(cinfo);
  jpeg_start_decompress(cinfo);
  if (cinfo->raw_data_out && raw_setup(&self->raw, cinfo) != 0)
    ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 0);
  if (flags & IRIS_ROWS_OWN_HUFFMAN)
    iris_huffman_install(cinfo, &self->huffman);
  *width = cinfo->output_width;
  *height = cinfo->output_height;
  return 1;
}

/*
 * After iris_jpeg_rows_start and before any row: decodes only the columns
 * *xoffset .. *xoffset + *width, which libjpeg widens to whole iMCU
 * columns and writes back (rows are then *width pixels wide). Returns 0,
 * or -1 on error.
 */
int iris_jpeg_rows_crop(iris_jpeg_rows *self, unsigned int *xoffset,
                        unsigned int *width)
{
  j_decompress_ptr cinfo = &self->cinfo;
  JDIMENSION x = *xoffset, w = *width;
  unsigned int full_width, full_height;
  if (self->raw.on) {
    /* libjpeg crops only its own output: start again without raw data. */
    jpeg_abort_decompress(cinfo);
    if (iris_jpeg_rows_start(self, self->data, self->len,
                             self->flags & ~IRIS_ROWS_OWN_COLOR, &full_width,
                             &full_height) != 1)
      return -1;
  }
  if (setjmp(self->jump)) {
    jpeg_abort_decompress(cinfo);
    return -1;
  }
  jpeg_crop_scanline(cinfo, &x, &w);
  *xoffset = x;
  *width = w;
  return 0;
}

/*
 * Decodes up to `max_rows` (at most 16) rows into `dst` (rows `pitch`
 * bytes apart, each holding output_width RGB pixels). Returns the number
 * of rows written (0 once every row has been read), or -1 on error.
 */
static int read_rows(j_decompress_ptr cinfo, unsigned char *dst,
                     unsigned long pitch, int max_rows)
{
  JSAMPROW rows[16];
  int i, done = 0;
  if (max_rows > 16) max_rows = 16;
  while (done < max_rows && cinfo->output_scanline < cinfo->output_height) {
    int want = max_rows - done;
    JDIMENSION got;
    for (i = 0; i < want; i++) rows[i] = dst + (unsigned long)(done + i) * pitch;
    got = jpeg_read_scanlines(cinfo, rows, (JDIMENSION)want);
    if (got == 0) break;
    done += (int)got;
  }
  return done;
}

int iris_jpeg_rows_read(iris_jpeg_rows *self, unsigned char *dst,
                        unsigned long pitch, int max_rows)
{
  if (setjmp(self->jump)) {
    jpeg_abort_decompress(&self->cinfo);
    return -1;
  }
  if (self->raw.on)
    return raw_rows(&self->raw, &self->cinfo, dst, pitch, max_rows);
  return read_rows(&self->cinfo, dst, pitch, max_rows);
}

/*
 * After the last row: reads the rest of the stream up to EOI (a warning
 * there, such as trailing garbage inside the scan, is an error as in the
 * whole-image path). Returns 0, or -1 on error.
 */
int iris_jpeg_rows_finish(iris_jpeg_rows *self)
{
  j_decompress_ptr cinfo = &self->cinfo;
  if (setjmp(self->jump)) {
    jpeg_abort_decompress(cinfo);
    return -1;
  }
  jpeg_finish_decompress(cinfo);
  return 0;
}

/* For tests: whether rows come from raw data through jpeg_color.c. */
int iris_jpeg_rows_is_raw(const iris_jpeg_rows *self)
{
  return self->raw.on;
}
