/* The shuffled orders' Feistel networks in one C loop: superserial.read._feistel.
 *
 * superserial.read.order computes every position of an order from its seed: a
 * 6-round Feistel network over range(size) with cycle walking, its round keys
 * SplitMix64 of a base. In numpy that is some 200 array operations per batch of
 * positions: a windowed order (two networks per position) cost 20 ms per 60,000
 * positions, in the process that hands out a DataLoader's indices. Here the same
 * arithmetic runs per position in C with the GIL released. order.py keeps the
 * numpy version, which gives the same values where this is not built, and the
 * tests hold the two to each other.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define ROUNDS 6

static inline uint64_t mix(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline void round_keys(uint64_t base, uint64_t *keys) {
    for (uint64_t r = 0; r < ROUNDS; r++) {
        keys[r] = mix(base ^ r);
    }
}

static inline uint64_t walk_one(uint64_t v, uint64_t size, unsigned h, uint64_t mask,
                                const uint64_t *keys) {
    do {
        uint64_t left = v >> h, right = v & mask;
        for (int r = 0; r < ROUNDS; r++) {
            uint64_t next = left ^ (mix(right ^ keys[r]) & mask);
            left = right;
            right = next;
        }
        v = (left << h) | right;
    } while (v >= size);
    return v;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    unsigned long long size;
    Py_buffer x, bases, out;
    PyObject *result = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Ky*w*", &x, &size, &bases, &out)) {
        return NULL;
    }
    Py_ssize_t n = x.len / 8, nb = bases.len / 8;
    if (x.len % 8 || bases.len % 8 || out.len != x.len || (nb != 1 && nb != n)) {
        PyErr_Format(PyExc_ValueError,
                     "expected x and out of 8 bytes per position and 1 or len(x) bases, "
                     "got %zd, %zd and %zd bytes", x.len, out.len, bases.len);
        goto done;
    }
    if (size < 2 || size > (1ULL << 62)) {
        PyErr_Format(PyExc_ValueError, "expected a size in [2, 2**62], got %llu", size);
        goto done;
    }
    const uint64_t *xs = (const uint64_t *)x.buf, *bs = (const uint64_t *)bases.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v;
        memcpy(&v, xs + i, 8); /* (the buffers need not be aligned) */
        if (v >= size) {
            /* Cycle walking from outside range(size) need not end. */
            PyErr_Format(PyExc_ValueError, "expected positions below %llu, got %llu at %zd",
                         size, (unsigned long long)v, i);
            goto done;
        }
    }
    /* Half of the bits of size - 1, rounded up: the networks' domain is 2**(2h) >= size. */
    unsigned bits = 0;
    for (uint64_t m = size - 1; m; m >>= 1) {
        bits++;
    }
    unsigned h = (bits + 1) / 2;
    if (h < 1) {
        h = 1;
    }
    uint64_t mask = (1ULL << h) - 1;
    uint64_t *o = (uint64_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    uint64_t keys[ROUNDS], base;
    if (nb == 1) {
        memcpy(&base, bs, 8);
        round_keys(base, keys);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v;
        memcpy(&v, xs + i, 8);
        if (nb != 1) {
            memcpy(&base, bs + i, 8);
            round_keys(base, keys);
        }
        v = walk_one(v, size, h, mask, keys);
        memcpy(o + i, &v, 8);
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&x);
    PyBuffer_Release(&bases);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(x, size, bases, out): out[i] = the Feistel network over range(size) with cycle "
     "walking at x[i], its round keys mix(base ^ r) for r < 6, base = bases[0] or bases[i] "
     "(uint64 buffers, native byte order; order._walk_numpy computes the same)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_feistel", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__feistel(void) { return PyModule_Create(&module); }
