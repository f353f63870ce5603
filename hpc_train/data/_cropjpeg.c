/* Crop-region JPEG decode: only the rows and columns of a box, DCT-scaled, into a caller's buffer.
 *
 * Why: RandomResizedCrop keeps on average about half of an image, and the JPEG decode is most of
 * a training sample's CPU time. libjpeg-turbo can skip the IDCT, upsampling and colour conversion
 * of columns outside a box (jpeg_crop_scanline), of rows above it (jpeg_skip_scanlines: still
 * entropy-decoded, which caps the gain) and of rows below it (stop reading, jpeg_abort).
 * Neither simplejpeg nor Pillow exposes these calls.
 *
 * Settings are simplejpeg's and Pillow's defaults (accurate integer IDCT, fancy upsampling), so
 * the box's pixels equal a full decode then crop. Two edge effects are kept out of the box:
 * - jpeg_crop_scanline widens the columns to an iMCU boundary and upsamples chroma as if the
 *   widened region's first and last columns were the image's edges; one more column is decoded
 *   on each side of the box (where the image has it), so those edge columns fall outside it.
 * - nothing at the top or bottom: libjpeg decodes the rows before the first read row with their
 *   context (measured: tests/data/test_cropjpeg.py), and rows after the box are never produced.
 * Where the file has restart markers that tile its rows (the shards do: with_restarts), only the
 * intervals covering the box, plus a margin, are decoded, as a sub-JPEG (_jpeg_intervals.c).
 *
 * Python API (hpc_train.data._cropjpeg):
 *   header(data) -> (height, width, colorspace, progressive)
 *   decode_into(data, out, top, left, scale_denom) -> bool (True: decoded from a cut)
 *       out: a writable C-contiguous uint8 buffer of height x width x 3 bytes, filled with the
 *       RGB box whose corner is (top, left) on the 1/scale_denom grid; its shape is (height,
 *       width, 3), given by out's own shape.
 *   with_restarts(data, interval) -> bytes or None: the lossless rewrite with restart markers
 *   intervals(data) -> dict or None: the restart intervals a cut would use
 *   crop_and_flip(keys, height, width, scale, ratio, flip) -> (top, left, h, w, flipped): a
 *       sample's RandomResizedCrop box and flip, the numbers numpy draws (_crop_draw.h)
 * Errors (not a JPEG, damaged, truncated, box outside the image) raise ValueError; the GIL is
 * released while libjpeg runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

#include "_crop_draw.h"
#include "_jpeg_intervals.h"

typedef struct {
    struct jpeg_error_mgr base;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} error_mgr;

static void on_error(j_common_ptr cinfo) {
    error_mgr *err = (error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

/* Warnings are ignored as Pillow and simplejpeg ignore them, except a premature end of data:
 * libjpeg would fill the rest with grey, where Pillow reports a truncated file. */
static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF)
        on_error(cinfo);
}

static const char *colorspace_name(J_COLOR_SPACE space) {
    switch (space) {
    case JCS_GRAYSCALE: return "Gray";
    case JCS_RGB: return "RGB";
    case JCS_YCbCr: return "YCbCr";
    case JCS_CMYK: return "CMYK";
    case JCS_YCCK: return "YCCK";
    default: return "unknown";
    }
}

static void setup(struct jpeg_decompress_struct *cinfo, error_mgr *err) {
    cinfo->err = jpeg_std_error(&err->base);
    err->base.error_exit = on_error;
    err->base.emit_message = on_message;
    err->message[0] = '\0';
}

static PyObject *header(PyObject *self, PyObject *args) {
    Py_buffer data;
    struct jpeg_decompress_struct cinfo;
    error_mgr err;
    int failed = 0, height = 0, width = 0, progressive = 0;
    J_COLOR_SPACE space = JCS_UNKNOWN;

    if (!PyArg_ParseTuple(args, "y*", &data))
        return NULL;
    setup(&cinfo, &err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        failed = 1;
    } else {
        jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
        jpeg_read_header(&cinfo, TRUE);
        height = (int)cinfo.image_height;
        width = (int)cinfo.image_width;
        space = cinfo.jpeg_color_space;
        progressive = cinfo.progressive_mode ? 1 : 0;
    }
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    if (failed) {
        PyErr_Format(PyExc_ValueError, "JPEG header: %s", err.message);
        return NULL;
    }
    return Py_BuildValue("(iisO)", height, width, colorspace_name(space),
                         progressive ? Py_True : Py_False);
}

typedef struct {          /* one region request, on the 1/scale grid */
    const unsigned char *data;
    unsigned long size;
    unsigned char *out;
    JDIMENSION top, left, height, width;
    int scale;
} region;

/* Decodes `r` into r->out; 0 on success, else a message in err->message. No Python calls here:
 * it runs without the GIL. */
static int decode_box(const region *r, error_mgr *err) {
    struct jpeg_decompress_struct cinfo;
    JSAMPLE *volatile rows = NULL;
    int failed = 0;

    setup(&cinfo, err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err->jump)) {
        failed = 1;
    } else {
        JDIMENSION x0, x1, xoffset, cropped, y, shift;
        jpeg_mem_src(&cinfo, r->data, r->size);
        jpeg_read_header(&cinfo, TRUE);
        cinfo.out_color_space = JCS_RGB;
        cinfo.dct_method = JDCT_ISLOW;
        cinfo.do_fancy_upsampling = TRUE;
        cinfo.scale_num = 1;
        cinfo.scale_denom = (unsigned int)r->scale;
        jpeg_start_decompress(&cinfo);
        if (r->top + r->height > cinfo.output_height || r->left + r->width > cinfo.output_width) {
            snprintf(err->message, JMSG_LENGTH_MAX,
                     "box rows %u-%u, columns %u-%u outside the %ux%u decode at 1/%d",
                     r->top, r->top + r->height, r->left, r->left + r->width,
                     cinfo.output_height, cinfo.output_width, r->scale);
            failed = 1;
        } else {
            /* One column more on each side (where there is one): see the file's comment. */
            x0 = r->left > 0 ? r->left - 1 : 0;
            x1 = r->left + r->width < cinfo.output_width ? r->left + r->width + 1
                                                          : cinfo.output_width;
            /* At least 16 columns: libjpeg-turbo 2.1's fancy upsampling of a region one chroma
             * sample wide gives wrong pixels below its first row (measured: a 1-column box at
             * the left edge, 16-19 levels off). */
            if (x1 - x0 < 16)
                x1 = x0 + 16 < cinfo.output_width ? x0 + 16 : cinfo.output_width;
            xoffset = x0;
            cropped = x1 - x0;
            if (cropped < cinfo.output_width)
                jpeg_crop_scanline(&cinfo, &xoffset, &cropped);   /* widens to an iMCU */
            shift = (r->left - xoffset) * 3;
            rows = (JSAMPLE *)malloc((size_t)cinfo.output_width * 3);
            if (rows == NULL) {
                snprintf(err->message, JMSG_LENGTH_MAX, "out of memory");
                failed = 1;
            } else {
                if (r->top > 0)
                    jpeg_skip_scanlines(&cinfo, r->top);
                for (y = 0; y < r->height; y++) {
                    JSAMPROW row = rows;
                    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
                        snprintf(err->message, JMSG_LENGTH_MAX, "no row %u", r->top + y);
                        failed = 1;
                        break;
                    }
                    memcpy(r->out + (size_t)y * r->width * 3, rows + shift, (size_t)r->width * 3);
                }
            }
        }
    }
    free(rows);
    jpeg_abort_decompress(&cinfo);   /* the rows below the box are never decoded */
    jpeg_destroy_decompress(&cinfo);
    return failed;
}

/* Source pixels kept around the box inside a cut, where the cut's edge is not the image's:
 * libjpeg's fancy upsampling (h2v1, h2v2, h1v2) reads one chroma sample across an edge, i.e.
 * the one output pixel next to it; two output pixels at the box's scale keep it out. */
#define CUT_MARGIN 2

/* `r` decoded from only the restart intervals that cover it, where the file has them (*cut set
 * to 1), else from the whole file. Same pixels either way (tests/data/test_cropjpeg.py). */
static int decode_region(const region *r, error_mgr *err, int *cut_used) {
    jpeg_intervals found;
    jpeg_cut cut;
    unsigned s = (unsigned)r->scale, margin = CUT_MARGIN * (unsigned)r->scale;
    unsigned y0, y1, x0, x1;
    region sub;
    int failed, cutting;

    *cut_used = 0;
    if (!jpeg_intervals_find(r->data, r->size, &found))
        return decode_box(r, err);
    y0 = r->top * s > margin ? r->top * s - margin : 0;
    x0 = r->left * s > margin ? r->left * s - margin : 0;
    y1 = (r->top + r->height) * s + margin;
    x1 = (r->left + r->width) * s + margin;
    y1 = y1 < found.height ? y1 : found.height;
    x1 = x1 < found.width ? x1 : found.width;
    /* Two MCUs wide at least: a cut of only the image's last, partial MCU column (4 px of a
     * 500-px 4:2:0 image) decodes 11-12 levels off there (libjpeg-turbo 2.1.5, measured). */
    if (x1 - x0 < 2 * found.mcu_width)
        x0 = x1 > 2 * found.mcu_width ? x1 - 2 * found.mcu_width : 0;
    cutting = jpeg_intervals_cut(r->data, &found, y0, y1, x0, x1, &cut);
    jpeg_intervals_free(&found);
    if (!cutting)
        return decode_box(r, err);
    sub = *r;                        /* the cut's corner is on the 1/8 grid: exact at any scale */
    sub.data = cut.data;
    sub.size = (unsigned long)cut.size;
    sub.top = r->top - cut.top / s;
    sub.left = r->left - cut.left / s;
    failed = decode_box(&sub, err);
    free(cut.data);
    *cut_used = !failed;
    return failed;
}

static PyObject *decode_into(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    PyObject *target;
    unsigned int top, left;
    int scale, failed, cut_used = 0;
    region r;
    error_mgr err;

    if (!PyArg_ParseTuple(args, "y*OIIi", &data, &target, &top, &left, &scale))
        return NULL;
    if (PyObject_GetBuffer(target, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (scale != 1 && scale != 2 && scale != 4 && scale != 8) {
        PyErr_Format(PyExc_ValueError, "scale_denom %d: expected 1, 2, 4 or 8", scale);
        failed = -1;
    } else if (out.ndim != 3 || out.shape[2] != 3 || out.itemsize != 1) {
        PyErr_SetString(PyExc_ValueError, "out: expected a C-contiguous uint8 HxWx3 buffer");
        failed = -1;
    } else {
        r.data = (const unsigned char *)data.buf;
        r.size = (unsigned long)data.len;
        r.out = (unsigned char *)out.buf;
        r.top = top;
        r.left = left;
        r.height = (JDIMENSION)out.shape[0];
        r.width = (JDIMENSION)out.shape[1];
        r.scale = scale;
        Py_BEGIN_ALLOW_THREADS
        failed = decode_region(&r, &err, &cut_used);
        Py_END_ALLOW_THREADS
        if (failed)
            PyErr_Format(PyExc_ValueError, "JPEG region: %s", err.message);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (failed)
        return NULL;
    return PyBool_FromLong(cut_used);
}

/* The largest divisor of `mcus_per_row` that is at most `wanted`: intervals then tile each row. */
static unsigned tiling_interval(unsigned mcus_per_row, unsigned wanted) {
    unsigned k;
    for (k = wanted < mcus_per_row ? wanted : mcus_per_row; k > 1; k--)
        if (mcus_per_row % k == 0)
            return k;
    return 1;
}

/* A lossless transcode: the same DCT coefficients (so the same pixels), sequential, optimal
 * Huffman tables, a restart marker every `interval` MCUs (rounded down so they tile the rows),
 * the APPn and COM markers copied. Only YCbCr and greyscale files (else *out stays NULL:
 * keep the original). 0 on success, else a message in err->message. */
static int transcode_with_restarts(const unsigned char *data, unsigned long size, unsigned interval,
                                   unsigned char **out, unsigned long *out_size, error_mgr *err) {
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    /* Our buffer, room for a rewrite a quarter larger: libjpeg's jpeg_mem_dest grows a buffer
     * it allocated itself but names the grown one only when the write completes, so after a
     * failure ours is the one that can be freed safely (a grown one, never seen, would leak). */
    unsigned long capacity = size + size / 4 + 65536;
    unsigned char *own = malloc(capacity);
    int failed = 0, m;

    *out = NULL;
    *out_size = 0;
    if (own == NULL) {
        snprintf(err->message, JMSG_LENGTH_MAX, "out of memory");
        return 1;
    }
    setup(&src, err);
    dst.err = &err->base;
    jpeg_create_decompress(&src);
    jpeg_create_compress(&dst);
    if (setjmp(err->jump)) {
        failed = 1;
    } else {
        jvirt_barray_ptr *coefficients;
        jpeg_saved_marker_ptr marker;
        unsigned block, mcus_per_row;
        jpeg_mem_src(&src, data, size);
        for (m = 0; m < 16; m++)
            jpeg_save_markers(&src, JPEG_APP0 + m, 0xFFFF);
        jpeg_save_markers(&src, JPEG_COM, 0xFFFF);
        jpeg_read_header(&src, TRUE);
        if (src.jpeg_color_space == JCS_YCbCr || src.jpeg_color_space == JCS_GRAYSCALE) {
            coefficients = jpeg_read_coefficients(&src);
            jpeg_copy_critical_parameters(&src, &dst);
            block = src.num_components == 1 ? 8 : 8 * (unsigned)src.max_h_samp_factor;
            mcus_per_row = (src.image_width + block - 1) / block;
            dst.optimize_coding = TRUE;
            dst.restart_interval = tiling_interval(mcus_per_row, interval);
            *out = own;
            *out_size = capacity;
            jpeg_mem_dest(&dst, out, out_size);
            jpeg_write_coefficients(&dst, coefficients);
            for (marker = src.marker_list; marker != NULL; marker = marker->next) {
                /* JFIF and Adobe markers: the compressor writes its own. */
                if (dst.write_JFIF_header && marker->marker == JPEG_APP0 &&
                    marker->data_length >= 5 && memcmp(marker->data, "JFIF", 5) == 0)
                    continue;
                if (dst.write_Adobe_marker && marker->marker == JPEG_APP0 + 14 &&
                    marker->data_length >= 5 && memcmp(marker->data, "Adobe", 5) == 0)
                    continue;
                jpeg_write_marker(&dst, marker->marker, marker->data, marker->data_length);
            }
            jpeg_finish_compress(&dst);
        }
    }
    jpeg_destroy_compress(&dst);
    jpeg_destroy_decompress(&src);
    if (failed || *out != own)        /* failed, not rewritten, or written into a grown buffer */
        free(own);
    if (failed) {
        *out = NULL;
        *out_size = 0;
    }
    return failed;
}

static PyObject *with_restarts(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int interval;
    unsigned char *out = NULL;
    unsigned long out_size = 0;
    error_mgr err;
    int failed;
    PyObject *result;

    if (!PyArg_ParseTuple(args, "y*I", &data, &interval))
        return NULL;
    if (interval < 1 || interval > 65535) {
        PyBuffer_Release(&data);
        return PyErr_Format(PyExc_ValueError, "restart interval %u: expected 1 to 65535 MCUs",
                            interval);
    }
    Py_BEGIN_ALLOW_THREADS
    failed = transcode_with_restarts((const unsigned char *)data.buf, (unsigned long)data.len,
                                     interval, &out, &out_size, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (failed)
        return PyErr_Format(PyExc_ValueError, "JPEG transcode: %s", err.message);
    if (out == NULL)
        Py_RETURN_NONE;
    result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)out_size);
    free(out);
    return result;
}

static PyObject *intervals(PyObject *self, PyObject *args) {
    Py_buffer data;
    jpeg_intervals found;
    int ok;

    if (!PyArg_ParseTuple(args, "y*", &data))
        return NULL;
    ok = jpeg_intervals_find((const unsigned char *)data.buf, (size_t)data.len, &found);
    PyBuffer_Release(&data);
    if (!ok)
        Py_RETURN_NONE;
    jpeg_intervals_free(&found);
    return Py_BuildValue("{sIsIsIsIsI}", "interval", found.interval, "count", found.count,
                         "per_row", found.per_row, "rows_per", found.rows_per,
                         "mcus_per_row", found.mcus_per_row);
}

static PyObject *crop_and_flip(PyObject *self, PyObject *args) {
    PyObject *keys, *flip;
    crop_draw_request r;
    crop_draw_result out;
    Py_ssize_t i;

    if (!PyArg_ParseTuple(args, "O!LL(dd)(dd)O", &PyTuple_Type, &keys, &r.height, &r.width,
                          &r.scale_lo, &r.scale_hi, &r.ratio_lo, &r.ratio_hi, &flip))
        return NULL;
    r.count = (int)PyTuple_GET_SIZE(keys);
    if (r.count < 1 || r.count > CROP_DRAW_MAX_KEYS)
        return PyErr_Format(PyExc_ValueError, "keys: 1 to %d non-negative integers, got %zd",
                            CROP_DRAW_MAX_KEYS, PyTuple_GET_SIZE(keys));
    for (i = 0; i < r.count; i++) {
        r.keys[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(keys, i));
        if (PyErr_Occurred())
            return NULL;     /* negative, not an integer, or 2^64 and above */
    }
    r.flip = PyObject_IsTrue(flip);
    if (r.flip < 0)
        return NULL;
    if (!crop_draw(&r, &out))
        return PyErr_Format(PyExc_ValueError, "image %lldx%lld: sides 1 to 2^32 - 1 expected",
                            (long long)r.height, (long long)r.width);
    return Py_BuildValue("(LLLLO)", (long long)out.top, (long long)out.left,
                         (long long)out.height, (long long)out.width,
                         out.flip ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"crop_and_flip", crop_and_flip, METH_VARARGS,
     "crop_and_flip((seed, epoch, index), height, width, (scale_lo, scale_hi), (ratio_lo, "
     "ratio_hi), flip) -> (top, left, crop_height, crop_width, flipped): the box and flip that "
     "transforms.rrc_params and Generator.random() draw from np.random.default_rng(keys)."},
    {"header", header, METH_VARARGS,
     "header(data) -> (height, width, colorspace, progressive) from the JPEG header."},
    {"decode_into", decode_into, METH_VARARGS,
     "decode_into(data, out, top, left, scale_denom): fill out (HxWx3 uint8) with the RGB box "
     "at (top, left) of the 1/scale_denom decode; True when only the restart intervals covering "
     "it were decoded."},
    {"with_restarts", with_restarts, METH_VARARGS,
     "with_restarts(data, interval) -> bytes, or None for a colour space other than YCbCr and "
     "grey: the same coefficients, a restart marker every interval MCUs (tiling the rows)."},
    {"intervals", intervals, METH_VARARGS,
     "intervals(data) -> dict (interval, count, per_row, rows_per, mcus_per_row), or None when "
     "the file's restart intervals cannot be cut."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cropjpeg",
                                    "Crop-region JPEG decode against libjpeg-turbo.", -1, methods};

PyMODINIT_FUNC PyInit__cropjpeg(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL)
        PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER",
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
                                LIBJPEG_TURBO_VERSION_NUMBER
#else
                                0
#endif
        );
    return m;
}
