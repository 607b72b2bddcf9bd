/*
 * The layer writer's append of a run of entries (seed 004, "Layers": kinds
 * grouped in a pushed layer, a local delta base before its delta, REF_DELTA
 * only, a delta one deeper than its base).
 *
 * enroute_core.storage.layer.writer.LayerWriter.append_many is the caller and
 * LayerWriter._check_entry, the one home of the rule, its reference: a run is
 * taken only when _check_entry accepts every entry of it in order (usual()
 * below is its acceptance, compiled), and then this answers what the appends
 * would add to the writer's columns, as new objects the caller adds; the
 * writer's containers are only read. Anything else (a type, a size, a header,
 * an order it does not take) answers None, and the caller appends entry by
 * entry, which raises the writer's own errors. Differential test:
 * libs/enroute-core/tests/storage/test_layer_writer_deltas.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "packfmt.h"

#define KINDS 4
#define U32_MAX 0xFFFFFFFFULL

typedef struct {
    /* the run */
    PyObject *oids, *kinds, *entries, *sizes, *bases, *depths, *contexts;
    /* the writer */
    PyObject *index, *pending, *kind_type;
    const unsigned char *kind_bytes;
    Py_ssize_t kind_count;
    const uint32_t *depth_column;
    Py_ssize_t depth_count;
    Py_ssize_t first;
    int last_kind; /* the writer's last kind before the run, -1 for none */
    int merged;
    long long objects_max, object_bytes_max, depth_max;
    int pack_type[KINDS];
} Run;

/* An unsigned value of at most ``max``, or -1 (an error set only when Python failed). */
static long long
bounded(PyObject *value, long long max)
{
    if (!PyLong_Check(value))
        return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    return overflow || v < 0 || v > max ? -1 : v;
}

static int
is_oid(PyObject *value)
{
    return PyBytes_CheckExact(value) && PyBytes_GET_SIZE(value) == OID_BYTES;
}

/* pack_entry.header_is: the usual header of ``type_num`` declaring ``size`` (-1: any);
 * a REF_DELTA's names ``base`` and data follows it. */
static int
header_is(PyObject *entry, int type_num, long long size, PyObject *base)
{
    Header h;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(entry);
    Py_ssize_t n = PyBytes_GET_SIZE(entry);
    if (!parse_header(p, n, 0, &h) || h.type_num != type_num ||
        (size >= 0 && h.size != (unsigned long long)size))
        return 0;
    if (type_num == OBJ_REF_DELTA)
        return memcmp(h.base_oid, PyBytes_AS_STRING(base), OID_BYTES) == 0 && n > h.header_length;
    return 1;
}

/*
 * 1 when append would take entry j after the run's entries before it; 0 when not; -1 on
 * a Python error. ``where`` maps the run's oids before j to their local indices and
 * ``waiting`` the bases their deltas wait on; kinds and depths of the run so far are in
 * ``run_kinds`` and ``run_depths``.
 */
static int
usual(const Run *r, Py_ssize_t j, PyObject *where, PyObject *waiting,
      const unsigned char *run_kinds, const long long *run_depths, int *kind_out,
      long long *depth_out)
{
    PyObject *oid = PyList_GET_ITEM(r->oids, j);
    PyObject *kind = PyList_GET_ITEM(r->kinds, j);
    PyObject *entry = PyList_GET_ITEM(r->entries, j);
    PyObject *base = PyList_GET_ITEM(r->bases, j);
    PyObject *context = PyList_GET_ITEM(r->contexts, j);
    if (!is_oid(oid) || (PyObject *)Py_TYPE(kind) != r->kind_type || !PyBytes_Check(entry))
        return 0;
    long k = PyLong_AsLong(kind);
    if (k == -1 && PyErr_Occurred())
        return -1;
    if (k < 0 || k >= KINDS)
        return 0;
    if (!r->merged) {
        int last = j > 0 ? run_kinds[j - 1] : r->last_kind;
        if (k < last)
            return 0;
    }
    int found = PyDict_Contains(r->index, oid);
    if (found == 0)
        found = PyDict_Contains(r->pending, oid);
    if (found == 0)
        found = PyDict_Contains(where, oid);
    if (found == 0)
        found = PySet_Contains(waiting, oid);
    if (found != 0)
        return found < 0 ? -1 : 0;
    Py_ssize_t length = PyBytes_GET_SIZE(entry);
    if (length <= 0 || (unsigned long long)length > U32_MAX)
        return 0;
    long long size = bounded(PyList_GET_ITEM(r->sizes, j), r->object_bytes_max);
    long long depth = bounded(PyList_GET_ITEM(r->depths, j), r->depth_max);
    if (PyErr_Occurred())
        return -1;
    if (size < 0 || depth < 0)
        return 0;
    if (context != Py_None) {
        if (!is_oid(context))
            return 0;
        int same = PyObject_RichCompareBool(context, oid, Py_EQ);
        if (same != 0)
            return same < 0 ? -1 : 0;
    }
    *kind_out = (int)k;
    *depth_out = depth;
    if (base == Py_None)
        return depth == 0 && header_is(entry, r->pack_type[k], size, NULL);
    if (!is_oid(base) || depth < 1)
        return 0;
    int same = PyObject_RichCompareBool(base, oid, Py_EQ);
    if (same != 0)
        return same < 0 ? -1 : 0;
    if (!header_is(entry, OBJ_REF_DELTA, -1, base))
        return 0;
    PyObject *local = PyDict_GetItemWithError(r->index, base);
    if (local != NULL) {
        Py_ssize_t i = PyLong_AsSsize_t(local);
        if (i == -1 && PyErr_Occurred())
            return -1;
        if (i < 0 || i >= r->kind_count || i >= r->depth_count)
            return 0;
        return r->kind_bytes[i] == k && (long long)r->depth_column[i] + 1 == depth;
    }
    if (PyErr_Occurred())
        return -1;
    local = PyDict_GetItemWithError(where, base);
    if (local != NULL) {
        Py_ssize_t i = PyLong_AsSsize_t(local) - r->first;
        if (i < 0 || i >= j)
            return 0;
        return run_kinds[i] == k && run_depths[i] + 1 == depth;
    }
    return PyErr_Occurred() ? -1 : 1;
}

/* What the writer's appends of the taken run would add, as new objects: the packed
 * columns, the joined entries, the oids per kind, the kind runs begun, the delta bases and
 * base contexts by local index, and the bases waited on (first delta of each). The
 * writer's own containers are only read; the caller adds these to them. */
static PyObject *
take(const Run *r, PyObject *where, const unsigned char *run_kinds, const long long *run_depths,
     long long pos)
{
    Py_ssize_t n = PyList_GET_SIZE(r->oids);
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *lengths = PyBytes_FromStringAndSize(NULL, n * 4);
    PyObject *sizes = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *depths = PyBytes_FromStringAndSize(NULL, n * 4);
    PyObject *kinds = PyBytes_FromStringAndSize((const char *)run_kinds, n);
    PyObject *per_kind = PyTuple_New(KINDS);
    PyObject *kind_runs = PyList_New(0);
    PyObject *bases = PyDict_New();
    PyObject *contexts = PyDict_New();
    PyObject *waits = PyDict_New();
    PyObject *data = NULL;
    int ok = offsets != NULL && lengths != NULL && sizes != NULL && depths != NULL &&
             kinds != NULL && per_kind != NULL && kind_runs != NULL && bases != NULL &&
             contexts != NULL && waits != NULL;
    for (int k = 0; ok && k < KINDS; k++) {
        PyObject *list = PyList_New(0);
        ok = list != NULL;
        if (ok)
            PyTuple_SET_ITEM(per_kind, k, list);
    }
    long long total = 0;
    for (Py_ssize_t j = 0; ok && j < n; j++) {
        PyObject *oid = PyList_GET_ITEM(r->oids, j);
        PyObject *base = PyList_GET_ITEM(r->bases, j);
        PyObject *context = PyList_GET_ITEM(r->contexts, j);
        Py_ssize_t length = PyBytes_GET_SIZE(PyList_GET_ITEM(r->entries, j));
        uint64_t offset = (uint64_t)(pos + total), size;
        uint32_t length32 = (uint32_t)length, depth32 = (uint32_t)run_depths[j];
        size = (uint64_t)PyLong_AsUnsignedLongLong(PyList_GET_ITEM(r->sizes, j));
        memcpy(PyBytes_AS_STRING(offsets) + j * 8, &offset, 8);
        memcpy(PyBytes_AS_STRING(lengths) + j * 4, &length32, 4);
        memcpy(PyBytes_AS_STRING(sizes) + j * 8, &size, 8);
        memcpy(PyBytes_AS_STRING(depths) + j * 4, &depth32, 4);
        total += length;
        PyObject *local = PyDict_GetItem(where, oid); /* borrowed; present */
        int k = run_kinds[j];
        int last = j > 0 ? run_kinds[j - 1] : r->last_kind;
        ok = PyList_Append(PyTuple_GET_ITEM(per_kind, k), oid) == 0;
        if (ok && k != last) {
            PyObject *item = PyTuple_Pack(2, local, PyList_GET_ITEM(r->kinds, j));
            ok = item != NULL && PyList_Append(kind_runs, item) == 0;
            Py_XDECREF(item);
        }
        if (ok && base != Py_None) {
            /* a base neither stored before the run nor in it: the delta waits on it */
            int stored = PyDict_SetItem(bases, local, base) == 0 ? PyDict_Contains(r->index, base)
                                                                 : -1;
            if (stored == 0)
                stored = PyDict_Contains(where, base);
            ok = stored > 0 || (stored == 0 && PyDict_SetDefault(waits, base, local) != NULL);
        }
        if (ok && context != Py_None)
            ok = PyDict_SetItem(contexts, local, context) == 0;
    }
    if (ok && !PyErr_Occurred()) {
        data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
        ok = data != NULL;
        char *w = ok ? PyBytes_AS_STRING(data) : NULL;
        for (Py_ssize_t j = 0; ok && j < n; j++) {
            PyObject *entry = PyList_GET_ITEM(r->entries, j);
            memcpy(w, PyBytes_AS_STRING(entry), (size_t)PyBytes_GET_SIZE(entry));
            w += PyBytes_GET_SIZE(entry);
        }
    }
    if (!ok || PyErr_Occurred()) {
        PyObject *all[] = {offsets, lengths, sizes, depths, kinds, per_kind,
                           kind_runs, bases, contexts, waits, data};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            Py_XDECREF(all[i]);
        return NULL;
    }
    Py_INCREF(where);
    return Py_BuildValue("(NNNNNNNNNNNN)", kinds, offsets, lengths, sizes, depths, data, where,
                         per_kind, kind_runs, bases, contexts, waits);
}

PyDoc_STRVAR(append_run_doc,
"append_run(run, first, pos, index, pending, kind_bytes, depth_column, kind_type,\n"
"           pack_types, merged, objects_max, object_bytes_max, depth_max)\n"
"--\n\n"
"Whether LayerWriter.append would take each entry of the run (seven lists: oids,\n"
"kinds, entries, sizes, bases, depths, contexts) in order, the run's first local\n"
"index being ``first`` and its data starting at ``pos``; the writer's index,\n"
"pending bases, kind bytes and depth column are read, never changed. None when\n"
"not; otherwise what those appends add, as new objects: ``(kinds, offsets,\n"
"lengths, sizes, depths, data, where, per_kind, kind_runs, bases, contexts,\n"
"waits)``, the packed columns (native order, as ``array`` holds them), the\n"
"joined entries, oid -> local index, the oids of each kind, the kind runs\n"
"begun, local -> delta base, local -> base context, and base -> the first local\n"
"delta waiting on it.");

static PyObject *
append_run(PyObject *self, PyObject *args)
{
    (void)self;
    Run r;
    PyObject *run, *pack_types;
    Py_buffer kind_buf, depth_buf;
    long long pos;
    if (!PyArg_ParseTuple(args, "O!nLO!O!y*y*OO!pLLL:append_run", &PyTuple_Type, &run, &r.first,
                          &pos, &PyDict_Type, &r.index, &PyDict_Type, &r.pending, &kind_buf,
                          &depth_buf, &r.kind_type, &PyTuple_Type, &pack_types, &r.merged,
                          &r.objects_max, &r.object_bytes_max, &r.depth_max))
        return NULL;
    PyObject *result = NULL, *where = NULL, *waiting = NULL;
    unsigned char *run_kinds = NULL;
    long long *run_depths = NULL;
    if (PyTuple_GET_SIZE(run) != 7 || PyTuple_GET_SIZE(pack_types) != KINDS ||
        depth_buf.len % 4 != 0) {
        PyErr_SetString(PyExc_ValueError, "append_run: the writer's columns are not as expected");
        goto done;
    }
    PyObject **cols[7] = {&r.oids, &r.kinds, &r.entries, &r.sizes, &r.bases, &r.depths,
                          &r.contexts};
    for (int c = 0; c < 7; c++) {
        *cols[c] = PyTuple_GET_ITEM(run, c);
        if (!PyList_Check(*cols[c]) ||
            PyList_GET_SIZE(*cols[c]) != PyList_GET_SIZE(PyTuple_GET_ITEM(run, 0))) {
            result = Py_None; /* not lists of one length: the caller's path decides */
            Py_INCREF(result);
            goto done;
        }
    }
    for (int k = 0; k < KINDS; k++) {
        r.pack_type[k] = (int)PyLong_AsLong(PyTuple_GET_ITEM(pack_types, k));
        if (PyErr_Occurred())
            goto done;
    }
    r.kind_bytes = (const unsigned char *)kind_buf.buf;
    r.kind_count = kind_buf.len;
    r.last_kind = r.kind_count > 0 ? r.kind_bytes[r.kind_count - 1] : -1;
    r.depth_column = (const uint32_t *)depth_buf.buf;
    r.depth_count = depth_buf.len / 4;
    Py_ssize_t n = PyList_GET_SIZE(r.oids);
    if (n == 0 || r.first + n > r.objects_max) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    where = PyDict_New();
    waiting = PySet_New(NULL);
    run_kinds = PyMem_Malloc((size_t)n);
    run_depths = PyMem_Malloc((size_t)n * sizeof(long long));
    if (where == NULL || waiting == NULL || run_kinds == NULL || run_depths == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        int kind = 0;
        long long depth = 0;
        int ok = usual(&r, j, where, waiting, run_kinds, run_depths, &kind, &depth);
        if (ok < 0)
            goto done;
        if (!ok) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        run_kinds[j] = (unsigned char)kind;
        run_depths[j] = depth;
        PyObject *local = PyLong_FromSsize_t(r.first + j);
        if (local == NULL || PyDict_SetItem(where, PyList_GET_ITEM(r.oids, j), local) < 0) {
            Py_XDECREF(local);
            goto done;
        }
        Py_DECREF(local);
        PyObject *base = PyList_GET_ITEM(r.bases, j);
        if (base != Py_None) {
            int stored = PyDict_Contains(r.index, base);
            if (stored == 0)
                stored = PyDict_Contains(where, base);
            if (stored < 0 || (stored == 0 && PySet_Add(waiting, base) < 0))
                goto done;
        }
    }
    result = take(&r, where, run_kinds, run_depths, pos);
done:
    if (kind_buf.obj != NULL)
        PyBuffer_Release(&kind_buf);
    if (depth_buf.obj != NULL)
        PyBuffer_Release(&depth_buf);
    Py_XDECREF(where);
    Py_XDECREF(waiting);
    PyMem_Free(run_kinds);
    PyMem_Free(run_depths);
    return result;
}

static PyMethodDef methods[] = {
    {"append_run", append_run, METH_VARARGS, append_run_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "enroute_native.layer_append",
    "The layer writer's append of a run of entries (docs/native.md).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit_layer_append(void)
{
    return PyModule_Create(&module);
}
