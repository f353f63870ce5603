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
 *
 * Python API (hpc_train.data._cropjpeg):
 *   header(data) -> (height, width, colorspace, progressive)
 *   decode_into(data, out, top, left, scale_denom) -> None
 *       out: a writable C-contiguous uint8 buffer of height x width x 3 bytes, filled with the
 *       RGB box whose corner is (top, left) on the 1/scale_denom grid; its shape is (height,
 *       width, 3), given by out's own shape.
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
static int decode_region(const region *r, error_mgr *err) {
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

static PyObject *decode_into(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    PyObject *target;
    unsigned int top, left;
    int scale, failed;
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
        failed = decode_region(&r, &err);
        Py_END_ALLOW_THREADS
        if (failed)
            PyErr_Format(PyExc_ValueError, "JPEG region: %s", err.message);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"header", header, METH_VARARGS,
     "header(data) -> (height, width, colorspace, progressive) from the JPEG header."},
    {"decode_into", decode_into, METH_VARARGS,
     "decode_into(data, out, top, left, scale_denom): fill out (HxWx3 uint8) with the RGB box "
     "at (top, left) of the 1/scale_denom decode."},
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
