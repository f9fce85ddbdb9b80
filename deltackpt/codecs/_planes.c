/* Byte planes to elements and back, in one pass each, with the GIL released.
 *
 * A chunk of n elements of w bytes is stored as w planes of n bytes (plane k holds byte k of every
 * element: spec/FORMAT.md, byte grouping).  numpy needs several passes per plane for either
 * direction, and c-blosc's unshuffle only takes the planes back to back in a frame of its own,
 * which it first copies into a block buffer.  These loops take each plane where it lies (a raw
 * plane in the buffer the pack was read into, a decompressed one in a work buffer) and write the
 * elements straight into the destination, so a keyframe's bytes cross memory once.
 *
 * The loops are plain C for a constant width, which compilers vectorize; on x86-64 with GCC or
 * Clang each is also built for AVX2 and the loader picks the build the CPU runs (target_clones).
 *
 * Python API (deltackpt.codecs._planes):
 *   interleave(out, planes)   out[i*w + k] = planes[k][i]; w = len(planes), n = len(out) // w
 *   group(data, out, w)       out[k*n + i] = data[i*w + k]
 * Every buffer must be C-contiguous bytes (out writable); every length is checked here.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_WIDTH 16

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__APPLE__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

#define INTERLEAVE(W)                                                                               \
    CLONES static void interleave_##W(uint8_t *restrict out, const uint8_t *const *planes, size_t n) \
    {                                                                                               \
        const uint8_t *p[W];                                                                        \
        for (int k = 0; k < W; k++) p[k] = planes[k];                                               \
        for (size_t i = 0; i < n; i++)                                                              \
            for (int k = 0; k < W; k++) out[i * W + k] = p[k][i];                                   \
    }

#define GROUP(W)                                                                                    \
    CLONES static void group_##W(const uint8_t *restrict in, uint8_t *restrict out, size_t n)       \
    {                                                                                               \
        for (size_t i = 0; i < n; i++)                                                              \
            for (int k = 0; k < W; k++) out[k * n + i] = in[i * W + k];                             \
    }

INTERLEAVE(2)
INTERLEAVE(4)
INTERLEAVE(8)
GROUP(2)
GROUP(4)
GROUP(8)

static void interleave_any(uint8_t *out, const uint8_t *const *planes, size_t w, size_t n)
{
    for (size_t k = 0; k < w; k++) {
        const uint8_t *p = planes[k];
        for (size_t i = 0; i < n; i++) out[i * w + k] = p[i];
    }
}

static void group_any(const uint8_t *in, uint8_t *out, size_t w, size_t n)
{
    for (size_t k = 0; k < w; k++) {
        uint8_t *p = out + k * n;
        for (size_t i = 0; i < n; i++) p[i] = in[i * w + k];
    }
}

static void release_all(Py_buffer *views, Py_ssize_t count)
{
    for (Py_ssize_t k = 0; k < count; k++) PyBuffer_Release(&views[k]);
}

static PyObject *planes_interleave(PyObject *self, PyObject *args)
{
    PyObject *out_obj, *seq_obj;
    if (!PyArg_ParseTuple(args, "OO:interleave", &out_obj, &seq_obj)) return NULL;
    PyObject *seq = PySequence_Fast(seq_obj, "planes must be a sequence of buffers");
    if (seq == NULL) return NULL;
    Py_ssize_t w = PySequence_Fast_GET_SIZE(seq);
    if (w < 1 || w > MAX_WIDTH) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "interleave takes 1 to %d planes, got %zd", MAX_WIDTH, w);
    }
    Py_buffer out, views[MAX_WIDTH];
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t got = 0;
    const uint8_t *ptrs[MAX_WIDTH];
    size_t n = (size_t)out.len / (size_t)w;
    if (out.len % w) {
        PyErr_Format(PyExc_ValueError, "destination of %zd bytes is not %zd planes", out.len, w);
        goto fail;
    }
    for (; got < w; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got], PyBUF_C_CONTIGUOUS) < 0) goto fail;
        if ((size_t)views[got].len != n) {
            PyErr_Format(PyExc_ValueError, "plane %zd holds %zd bytes, expected %zu", got, views[got].len, n);
            got++;
            goto fail;
        }
        ptrs[got] = (const uint8_t *)views[got].buf;
    }
    Py_BEGIN_ALLOW_THREADS
    switch (w) {
    case 2: interleave_2((uint8_t *)out.buf, ptrs, n); break;
    case 4: interleave_4((uint8_t *)out.buf, ptrs, n); break;
    case 8: interleave_8((uint8_t *)out.buf, ptrs, n); break;
    default: interleave_any((uint8_t *)out.buf, ptrs, (size_t)w, n);
    }
    Py_END_ALLOW_THREADS
    release_all(views, got);
    PyBuffer_Release(&out);
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    release_all(views, got);
    PyBuffer_Release(&out);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *planes_group(PyObject *self, PyObject *args)
{
    Py_buffer in, out;
    Py_ssize_t w;
    if (!PyArg_ParseTuple(args, "y*w*n:group", &in, &out, &w)) return NULL;
    PyObject *result = NULL;
    if (w < 1 || w > MAX_WIDTH) {
        PyErr_Format(PyExc_ValueError, "group takes 1 to %d planes, got %zd", MAX_WIDTH, w);
    } else if (in.len != out.len || in.len % w) {
        PyErr_Format(PyExc_ValueError, "group of %zd bytes into %zd bytes in %zd planes", in.len, out.len, w);
    } else if (!PyBuffer_IsContiguous(&in, 'C') || !PyBuffer_IsContiguous(&out, 'C')) {
        PyErr_SetString(PyExc_ValueError, "group needs contiguous buffers");
    } else {
        size_t n = (size_t)in.len / (size_t)w;
        Py_BEGIN_ALLOW_THREADS
        switch (w) {
        case 1: memmove(out.buf, in.buf, n); break;
        case 2: group_2((const uint8_t *)in.buf, (uint8_t *)out.buf, n); break;
        case 4: group_4((const uint8_t *)in.buf, (uint8_t *)out.buf, n); break;
        case 8: group_8((const uint8_t *)in.buf, (uint8_t *)out.buf, n); break;
        default: group_any((const uint8_t *)in.buf, (uint8_t *)out.buf, (size_t)w, n);
        }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"interleave", planes_interleave, METH_VARARGS,
     "interleave(out, planes): out[i*w + k] = planes[k][i], w = len(planes)."},
    {"group", planes_group, METH_VARARGS, "group(data, out, w): out[k*n + i] = data[i*w + k]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_planes", "Byte planes to elements and back, natively.", -1, methods,
};

PyMODINIT_FUNC PyInit__planes(void)
{
    return PyModule_Create(&module);
}
