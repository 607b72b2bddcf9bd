/*
 * One pack entry, header and zlib stream, read in one call (gitformat-pack,
 * "Pack file entry" and "Deltified representation").
 *
 * enroute_core.git.pack.PackScanner is the reference: this is its loop body
 * for the usual entry, whose header is well formed, whose declared size is
 * under the caller's bound and whose whole zlib stream lies in the window it
 * was given. Anything else answers None and the scanner reads the entry
 * itself, raising the typed error of a bad one; so this code never decides
 * that input is bad, only that it is usual. Every read is bounds-checked.
 *
 * Beside it, two routines of the layer path on the same header: header_is,
 * the layer writer's check that an entry is what its caller says (reference:
 * parse_entry_header and the writer's comparisons), and as_ref_delta, ingest's
 * rewrite of an OFS_DELTA as a REF_DELTA (reference: encode_entry_header).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <zlib.h>

#include "packfmt.h"

PyDoc_STRVAR(inflate_entry_doc,
"inflate_entry(window, pos, offset, size_max)\n"
"--\n\n"
"The entry at ``window[pos:]`` (pack offset ``offset``) as\n"
"``(type, size, header_length, base_offset, base_oid, data, used)``, ``used``\n"
"being its header and zlib bytes; or None when it is not the usual entry:\n"
"a header the scanner must judge, a declared size over ``size_max``, a stream\n"
"that does not end inside ``window`` or does not inflate to exactly its size.");

static PyObject *
inflate_entry(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer window;
    Py_ssize_t pos;
    long long offset;
    unsigned long long size_max;
    if (!PyArg_ParseTuple(args, "y*nLK:inflate_entry", &window, &pos, &offset, &size_max))
        return NULL;
    PyObject *result = NULL;
    const unsigned char *base = (const unsigned char *)window.buf;
    Header h;
    if (pos < 0 || pos >= window.len || offset < PACK_HEADER_BYTES ||
        !parse_header(base + pos, window.len - pos, offset, &h) || h.size > size_max ||
        h.size >= (unsigned long long)PY_SSIZE_T_MAX)
        goto usual_no;
    Py_ssize_t in_start = pos + h.header_length;
    Py_ssize_t in_len = window.len - in_start;
    if (in_len <= 0 || in_len > (Py_ssize_t)UINT_MAX || h.size + 1 > UINT_MAX)
        goto usual_no;
    /* One byte more than declared: a stream that fills it says more than its header. */
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)h.size + 1);
    if (data == NULL)
        goto done;
    z_stream zs;
    memset(&zs, 0, sizeof(zs));
    if (inflateInit(&zs) != Z_OK) {
        Py_DECREF(data);
        PyErr_SetString(PyExc_MemoryError, "zlib could not start an inflate");
        goto done;
    }
    zs.next_in = (unsigned char *)(base + in_start);
    zs.avail_in = (uInt)in_len;
    zs.next_out = (unsigned char *)PyBytes_AS_STRING(data);
    zs.avail_out = (uInt)(h.size + 1);
    int ret;
    if (h.size >= UNLOCKED_BYTES_MIN) {
        Py_BEGIN_ALLOW_THREADS
        ret = inflate(&zs, Z_FINISH);
        Py_END_ALLOW_THREADS
    }
    else {
        ret = inflate(&zs, Z_FINISH);
    }
    unsigned long got = zs.total_out, used_in = zs.total_in;
    inflateEnd(&zs);
    if (ret != Z_STREAM_END || got != h.size) {
        Py_DECREF(data);
        goto usual_no;
    }
    if (_PyBytes_Resize(&data, (Py_ssize_t)h.size) < 0)
        goto done;
    PyObject *base_oid = Py_None;
    Py_INCREF(base_oid);
    if (h.base_oid != NULL) {
        Py_DECREF(base_oid);
        base_oid = PyBytes_FromStringAndSize((const char *)h.base_oid, OID_BYTES);
        if (base_oid == NULL) {
            Py_DECREF(data);
            goto done;
        }
    }
    result = Py_BuildValue("(iKnLNNn)", h.type_num, h.size, h.header_length, h.base_offset,
                           base_oid, data, h.header_length + (Py_ssize_t)used_in);
    goto done;
usual_no:
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&window);
    return result;
}

PyDoc_STRVAR(header_is_doc,
"header_is(entry, type_num, size, base_oid)\n"
"--\n\n"
"Whether ``entry`` starts with the usual header of an entry of ``type_num``\n"
"declaring ``size`` (-1: any size); a REF_DELTA's must name ``base_oid`` and\n"
"be followed by data. False where the header is another or not usual: the\n"
"caller's parser then judges it.");

static PyObject *
header_is(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer entry;
    int type_num, overflow;
    PyObject *size_obj, *base_oid;
    if (!PyArg_ParseTuple(args, "y*iO!O:header_is", &entry, &type_num, &PyLong_Type, &size_obj,
                          &base_oid))
        return NULL;
    long long size = PyLong_AsLongLongAndOverflow(size_obj, &overflow);
    if (size == -1 && PyErr_Occurred()) {
        PyBuffer_Release(&entry);
        return NULL;
    }
    Header h;
    int ok = !overflow && parse_header((const unsigned char *)entry.buf, entry.len, 0, &h) &&
             h.type_num == type_num && (size < 0 || h.size == (unsigned long long)size);
    if (ok && type_num == OBJ_REF_DELTA)
        ok = PyBytes_Check(base_oid) && PyBytes_GET_SIZE(base_oid) == OID_BYTES &&
             memcmp(h.base_oid, PyBytes_AS_STRING(base_oid), OID_BYTES) == 0 &&
             entry.len > h.header_length;
    PyBuffer_Release(&entry);
    return PyBool_FromLong(ok);
}

PyDoc_STRVAR(as_ref_delta_doc,
"as_ref_delta(entry, header_length, base_oid)\n"
"--\n\n"
"The OFS_DELTA ``entry`` (its header ``header_length`` bytes long) as a\n"
"REF_DELTA on ``base_oid``: the type-and-size bytes written anew, the base\n"
"oid, the same zlib bytes. None when ``entry`` is not a usual OFS_DELTA with\n"
"that header.");

static PyObject *
as_ref_delta(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer entry, base;
    Py_ssize_t header_length;
    if (!PyArg_ParseTuple(args, "y*ny*:as_ref_delta", &entry, &header_length, &base))
        return NULL;
    PyObject *result;
    if (base.len != OID_BYTES) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    result = ofs_as_ref_delta((const unsigned char *)entry.buf, entry.len, header_length,
                              (const unsigned char *)base.buf);
done:
    PyBuffer_Release(&entry);
    PyBuffer_Release(&base);
    return result;
}

static PyMethodDef methods[] = {
    {"inflate_entry", inflate_entry, METH_VARARGS, inflate_entry_doc},
    {"header_is", header_is, METH_VARARGS, header_is_doc},
    {"as_ref_delta", as_ref_delta, METH_VARARGS, as_ref_delta_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "enroute_native.pack_entry",
    "One pack entry: read (header and zlib stream) in one call, its header checked or rewritten.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit_pack_entry(void)
{
    return PyModule_Create(&module);
}
