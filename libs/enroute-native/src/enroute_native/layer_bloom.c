/*
 * The Bloom filter of a layer's index region, built in one call (seed 004,
 * "Layers": about 10 bits per object; docs/formats/layer.md).
 *
 * enroute_core.storage.layer.bloom.build_bloom_py is the reference: double
 * hashing on the oid's own bytes, h1 = u64le(oid[0:8]), h2 = u64le(oid[8:16]) | 1,
 * probe i sets bit (h1 + i*h2) mod m computed exactly (here as a running sum mod
 * m, which never wraps: both terms are below m < 2**63), bit b being bit b & 7 of
 * byte b >> 3. Pure: the oids come joined, 20 bytes each.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define OID_BYTES 20

static uint64_t
u64le(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

PyDoc_STRVAR(build_doc,
"build(oids, bits, probes)\n"
"--\n\n"
"The filter bytes (bits / 8 of them) for ``oids``, the 20-byte oids joined;\n"
"``bits`` a positive multiple of 64, below 2**62.");

static PyObject *
build(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer oids;
    long long bits;
    int probes;
    if (!PyArg_ParseTuple(args, "y*Li:build", &oids, &bits, &probes))
        return NULL;
    PyObject *out = NULL;
    if (bits <= 0 || bits % 64 != 0 || bits >= ((long long)1 << 62) || probes < 0 ||
        oids.len % OID_BYTES != 0) {
        PyErr_SetString(PyExc_ValueError, "bloom: bits, probes or oids out of range");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(bits / 8));
    if (out == NULL)
        goto done;
    unsigned char *filter = (unsigned char *)PyBytes_AS_STRING(out);
    memset(filter, 0, (size_t)(bits / 8));
    const unsigned char *p = (const unsigned char *)oids.buf;
    uint64_t m = (uint64_t)bits;
    for (Py_ssize_t at = 0; at < oids.len; at += OID_BYTES) {
        uint64_t pos = u64le(p + at) % m;
        uint64_t step = (u64le(p + at + 8) | 1) % m;
        for (int i = 0; i < probes; i++) {
            filter[pos >> 3] |= (unsigned char)(1u << (pos & 7));
            pos += step;
            if (pos >= m)
                pos -= m;
        }
    }
done:
    PyBuffer_Release(&oids);
    return out;
}

static PyMethodDef methods[] = {
    {"build", build, METH_VARARGS, build_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "enroute_native.layer_bloom",
    "A layer's Bloom filter, built in one call.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit_layer_bloom(void)
{
    return PyModule_Create(&module);
}
