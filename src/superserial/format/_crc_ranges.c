/* CRC-32C of many ranges of one buffer in one call: superserial.format._crc_ranges.
 *
 * Checking the records of a read costs one CRC-32C per record. Called from
 * Python, each is a bytes slice (a copy) and a call: about 0.4 us a record,
 * 20-60 ms for 60,000 records, under the GIL. Here the loop runs in C with the
 * GIL released. The CRC itself is google-crc32c's own crc32c_extend (hardware
 * CRC where the CPU has it), whose address the caller finds in the library
 * google-crc32c ships (superserial.format.framing), so nothing here computes a
 * CRC or links against anything.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef uint32_t (*extend_fn)(uint32_t, const uint8_t *, size_t);

static PyObject *crc32c_ranges(PyObject *self, PyObject *args) {
    unsigned long long address;
    Py_buffer data, starts, lengths, out;
    PyObject *result = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "Ky*y*y*w*", &address, &data, &starts, &lengths, &out)) {
        return NULL;
    }
    Py_ssize_t n = starts.len / 8;
    if (starts.len % 8 || lengths.len != starts.len || out.len != n * 4) {
        PyErr_Format(PyExc_ValueError,
                     "expected starts and lengths of 8 bytes each and out of 4 per range, "
                     "got %zd, %zd and %zd bytes", starts.len, lengths.len, out.len);
        goto done;
    }
    const int64_t *s = (const int64_t *)starts.buf, *len = (const int64_t *)lengths.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t a, m;
        memcpy(&a, s + i, 8);  /* (the arrays need not be aligned) */
        memcpy(&m, len + i, 8);
        if (a < 0 || m < 0 || a > (int64_t)data.len || m > (int64_t)data.len - a) {
            PyErr_Format(PyExc_ValueError,
                         "expected range %zd within the %zd bytes, got [%lld, %lld)", i,
                         data.len, (long long)a, (long long)(a + m));
            goto done;
        }
    }
    extend_fn extend = (extend_fn)(uintptr_t)address;
    const uint8_t *base = (const uint8_t *)data.buf;
    uint8_t *o = (uint8_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t a, m;
        memcpy(&a, s + i, 8);
        memcpy(&m, len + i, 8);
        uint32_t crc = extend(0, base + a, (size_t)m);
        memcpy(o + 4 * i, &crc, 4);
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"crc32c_ranges", crc32c_ranges, METH_VARARGS,
     "crc32c_ranges(extend, data, starts, lengths, out): out[i] = CRC-32C of "
     "data[starts[i] : starts[i] + lengths[i]] (int64 starts and lengths, uint32 out, "
     "native byte order), computed by the C function at address extend."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_crc_ranges", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__crc_ranges(void) { return PyModule_Create(&module); }
