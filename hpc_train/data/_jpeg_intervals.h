/* Restart intervals of a baseline JPEG: find them, and cut a sub-JPEG of a box out of them.
 *
 * Why: libjpeg must Huffman-decode every MCU before the ones it outputs (jpeg_skip_scanlines
 * still entropy-decodes), and that pass is about half of a whole decode. A restart marker resets
 * the entropy decoder (the DC predictions start again at zero), so the entropy-coded bytes
 * between two markers decode on their own. Where the intervals tile the image in whole MCU rows
 * or in equal pieces of a row, the intervals that cover a box are themselves a valid JPEG: the
 * same tables and restart interval, a frame the size of those intervals, their bytes in order,
 * their markers renumbered. That sub-JPEG decodes to the same pixels as the same place of the
 * whole image, except where upsampling reads across its edges (kept out of the box by a margin).
 *
 * Shards get restart markers when they are written (_cropjpeg.c: transcode_with_restarts, a
 * lossless transcode: the DCT coefficients are copied, not re-quantised).
 */
#ifndef HPC_TRAIN_JPEG_INTERVALS_H
#define HPC_TRAIN_JPEG_INTERVALS_H

#include <stddef.h>

typedef struct {
    size_t sof;                 /* offset of the frame's height field (width follows) */
    size_t scan;                /* first entropy-coded byte */
    unsigned height, width;     /* of the image */
    unsigned mcu_width, mcu_height, mcus_per_row, mcu_rows;
    unsigned interval;          /* MCUs per restart interval */
    unsigned per_row;           /* intervals side by side in one MCU row band (1 when whole rows) */
    unsigned rows_per;          /* MCU rows in one band of intervals (1 when pieces of a row) */
    unsigned count;             /* intervals in the scan */
    size_t *starts, *ends;      /* each interval's bytes: [starts[k], ends[k]) */
} jpeg_intervals;

/* 1 and a filled `found` (free with jpeg_intervals_free) where `data` is a baseline (or
 * extended Huffman) JPEG of one interleaved scan whose restart intervals tile it as above;
 * 0 otherwise (no markers, progressive, several scans, damaged: decode the whole instead). */
int jpeg_intervals_find(const unsigned char *data, size_t size, jpeg_intervals *found);
void jpeg_intervals_free(jpeg_intervals *found);

typedef struct {
    unsigned char *data;        /* malloc'ed; free() it */
    size_t size;
    unsigned top, left;         /* the sub-JPEG's corner in the image, in source pixels */
} jpeg_cut;

/* The sub-JPEG of the intervals covering source rows [y0, y1) and columns [x0, x1). 1 on
 * success, 0 when it would be the whole image or memory ran out (decode the whole then). */
int jpeg_intervals_cut(const unsigned char *data, const jpeg_intervals *found,
                       unsigned y0, unsigned y1, unsigned x0, unsigned x1, jpeg_cut *cut);

#endif
