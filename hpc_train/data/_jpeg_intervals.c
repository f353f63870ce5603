/* Restart intervals of a baseline JPEG (see _jpeg_intervals.h). Pure byte parsing: no libjpeg. */
#include "_jpeg_intervals.h"

#include <stdlib.h>
#include <string.h>

static unsigned be16(const unsigned char *p) { return ((unsigned)p[0] << 8) | p[1]; }

static unsigned ceil_div(unsigned a, unsigned b) { return (a + b - 1) / b; }

/* The frame (SOF0/SOF1) and scan headers: 1 when they describe what jpeg_intervals can cut. */
static int read_headers(const unsigned char *d, size_t n, jpeg_intervals *f) {
    size_t p = 2;
    unsigned components = 0, hmax = 1, vmax = 1, i;

    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8)
        return 0;
    for (;;) {
        unsigned marker, length;
        if (p >= n || d[p] != 0xFF)
            return 0;
        while (p < n && d[p] == 0xFF)       /* fill bytes */
            p++;
        if (p + 3 > n)
            return 0;
        marker = d[p++];
        length = be16(d + p);
        if (length < 2 || p + length > n)
            return 0;
        if (marker == 0xC0 || marker == 0xC1) {        /* sequential, Huffman */
            if (length < 8 || d[p + 2] != 8)
                return 0;
            f->sof = p + 3;
            f->height = be16(d + p + 3);
            f->width = be16(d + p + 5);
            components = d[p + 7];
            if (components < 1 || components > 4 || length != 8 + 3 * components)
                return 0;
            for (i = 0; i < components; i++) {
                unsigned h = d[p + 9 + 3 * i] >> 4, v = d[p + 9 + 3 * i] & 15;
                if (h < 1 || h > 4 || v < 1 || v > 4)
                    return 0;
                hmax = h > hmax ? h : hmax;
                vmax = v > vmax ? v : vmax;
            }
        } else if (marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8) {
            return 0;                       /* progressive, lossless, hierarchical, arithmetic */
        } else if (marker == 0xDD) {
            if (length != 4)
                return 0;
            f->interval = be16(d + p + 2);
        } else if (marker == 0xDA) {
            /* One scan of every component: an MCU then holds a block group of each. */
            if (components == 0 || d[p + 2] != components)
                return 0;
            f->scan = p + length;
            break;
        } else if (marker == 0xD9 || marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7)) {
            return 0;
        }
        p += length;
    }
    if (f->interval == 0 || f->height == 0 || f->width == 0)   /* height 0: a DNL file */
        return 0;
    f->mcu_width = components == 1 ? 8 : 8 * hmax;
    f->mcu_height = components == 1 ? 8 : 8 * vmax;
    f->mcus_per_row = ceil_div(f->width, f->mcu_width);
    f->mcu_rows = ceil_div(f->height, f->mcu_height);
    if (f->mcus_per_row % f->interval == 0) {
        f->per_row = f->mcus_per_row / f->interval;
        f->rows_per = 1;
    } else if (f->interval % f->mcus_per_row == 0) {
        f->per_row = 1;
        f->rows_per = f->interval / f->mcus_per_row;
    } else {
        return 0;                           /* intervals that straddle rows: no box is a cut */
    }
    f->count = ceil_div(f->mcus_per_row * f->mcu_rows, f->interval);
    return 1;
}

/* Each interval's bytes, from the restart markers in the entropy-coded data. */
static int read_intervals(const unsigned char *d, size_t n, jpeg_intervals *f) {
    size_t q = f->scan;
    unsigned k = 0;

    f->starts = malloc(sizeof(size_t) * f->count);
    f->ends = malloc(sizeof(size_t) * f->count);
    if (f->starts == NULL || f->ends == NULL)
        return 0;
    f->starts[0] = q;
    for (;;) {
        const unsigned char *ff = memchr(d + q, 0xFF, n - q);
        unsigned b;
        if (ff == NULL)
            return 0;                       /* truncated: no end of scan */
        q = (size_t)(ff - d);
        if (q + 1 >= n)
            return 0;
        b = d[q + 1];
        if (b == 0x00) {                    /* a stuffed 0xFF data byte */
            q += 2;
        } else if (b == 0xFF) {             /* a fill byte before a marker */
            q += 1;
        } else if (b >= 0xD0 && b <= 0xD7) {
            if (b != 0xD0 + (k & 7) || k + 1 >= f->count)
                return 0;                   /* out of sequence, or more than the MCUs need */
            f->ends[k++] = q;
            f->starts[k] = q + 2;
            q += 2;
        } else {                            /* the end of the scan */
            f->ends[k++] = q;
            return k == f->count && b == 0xD9;   /* then EOI: one scan only */
        }
    }
}

int jpeg_intervals_find(const unsigned char *data, size_t size, jpeg_intervals *found) {
    memset(found, 0, sizeof *found);
    if (read_headers(data, size, found) && read_intervals(data, size, found))
        return 1;
    jpeg_intervals_free(found);
    return 0;
}

void jpeg_intervals_free(jpeg_intervals *found) {
    free(found->starts);
    free(found->ends);
    found->starts = found->ends = NULL;
}

int jpeg_intervals_cut(const unsigned char *data, const jpeg_intervals *f,
                       unsigned y0, unsigned y1, unsigned x0, unsigned x1, jpeg_cut *cut) {
    unsigned band_height = f->rows_per * f->mcu_height, piece_width = f->interval * f->mcu_width;
    unsigned bands = ceil_div(f->mcu_rows, f->rows_per);
    unsigned b0 = y0 / band_height, b1 = ceil_div(y1, band_height);
    unsigned j0 = f->per_row > 1 ? x0 / piece_width : 0;
    unsigned j1 = f->per_row > 1 ? ceil_div(x1, piece_width) : 1;
    unsigned b, j, written = 0, height, width;
    size_t size = f->scan + 2, at;
    unsigned char *out;

    b1 = b1 < bands ? b1 : bands;
    j1 = j1 < f->per_row ? j1 : f->per_row;
    if (b0 >= b1 || j0 >= j1 || (b0 == 0 && b1 == bands && j0 == 0 && j1 == f->per_row))
        return 0;
    for (b = b0; b < b1; b++)
        for (j = j0; j < j1; j++)
            size += f->ends[b * f->per_row + j] - f->starts[b * f->per_row + j] + 2;
    out = malloc(size);
    if (out == NULL)
        return 0;
    cut->top = b0 * band_height;
    cut->left = j0 * piece_width;
    height = (b1 * band_height < f->height ? b1 * band_height : f->height) - cut->top;
    width = (j1 * piece_width < f->width ? j1 * piece_width : f->width) - cut->left;
    memcpy(out, data, f->scan);             /* tables, restart interval, frame, scan header */
    out[f->sof] = (unsigned char)(height >> 8);
    out[f->sof + 1] = (unsigned char)height;
    out[f->sof + 2] = (unsigned char)(width >> 8);
    out[f->sof + 3] = (unsigned char)width;
    at = f->scan;
    for (b = b0; b < b1; b++) {
        for (j = j0; j < j1; j++) {
            size_t k = (size_t)b * f->per_row + j, length = f->ends[k] - f->starts[k];
            if (written > 0) {              /* markers numbered again from RST0 */
                out[at++] = 0xFF;
                out[at++] = (unsigned char)(0xD0 + ((written - 1) & 7));
            }
            memcpy(out + at, data + f->starts[k], length);
            at += length;
            written++;
        }
    }
    out[at++] = 0xFF;
    out[at++] = 0xD9;
    cut->data = out;
    cut->size = at;
    return 1;
}
