/*
 * Row-by-row JPEG decoding through libjpeg's scanline API, for
 * src/decode/jpeg_rows.rs.
 *
 * Decodes exactly as TurboJPEG's tj3Decompress8 does with TJPF_RGB (the
 * whole-image path): output colour space JCS_EXT_RGB, ISLOW IDCT, fancy
 * upsampling, every libjpeg warning turned into an error (the
 * TJPARAM_STOPONWARNING the whole-image path sets). Only single-scan
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

#include "jpeg_huffman.h"

typedef struct iris_jpeg_rows {
  struct jpeg_decompress_struct cinfo;
  struct jpeg_error_mgr jerr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  int created;
  /* Tests: libjpeg's warning about unused bytes is not an error. */
  int past_extraneous;
  iris_huffman huffman;
} iris_jpeg_rows;

/* iris_jpeg_rows_start's flags. */
#define IRIS_ROWS_OWN_HUFFMAN 1   /* jpeg_huffman.c decodes the data */
#define IRIS_ROWS_PAST_EXTRANEOUS 2 /* tests: see past_extraneous */

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

void iris_jpeg_rows_free(iris_jpeg_rows *self)
{
  if (self == NULL) return;
  if (self->created) jpeg_destroy_decompress(&self->cinfo);
  free(self);
}

const char *iris_jpeg_rows_message(const iris_jpeg_rows *self)
{
  return self->message;
}

/*
 * Reads the headers of `data` (which must outlive the decoder) and starts
 * decompression, with `flags` (IRIS_ROWS_*): the entropy decoding is
 * jpeg_huffman.c's with IRIS_ROWS_OWN_HUFFMAN where the file allows,
 * libjpeg's otherwise (the same coefficients). Returns 1 when started
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
  jpeg_start_decompress(cinfo);
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
