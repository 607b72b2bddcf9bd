/*
 * Ingest's plan of a run of layer entries (DESIGN "Layers": storage order, a
 * delta stored on a base of its own kind): for each object of ``order`` from
 * ``start``, its kind, stored entry bytes, size, kept base, depth and base
 * context, until the run's pack entries reach ``run_bytes_max``.
 *
 * enroute_core.engine.ingest._Plan.run is the reference, and this is its loop
 * step for step, over a pack held in memory or read entry by entry through the
 * source's ``read_at`` (a pack larger than the indexer's share stays on disk): the
 * same decisions, the same updates of ``depths`` and ``externals``, the same calls
 * of ``contains`` in the same order, the same end of a run at a full entry over
 * ``stream_bytes`` (copied in pieces by the caller). Two entries it does not make itself: a
 * delta whose base is not kept (deflated whole by the reference's
 * _full_entry) and a kept OFS_DELTA whose header it does not read as usual;
 * their places in the entries column hold None and their run positions are
 * listed, for the caller to fill with the reference's routines.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "packfmt.h"

/* The pack's entries as columns (enroute_core.git.packindexer.PackObjects.columns, the
 * order enroute_native.pack_index returns them): native byte order. */
enum { C_OFFSETS, C_OIDS, C_TYPES, C_SIZES, C_OBJECT_SIZES, C_LENGTHS, C_DEPTHS, C_BASE_OIDS,
       C_HAS_BASE, C_ENTRY_TYPES, C_HLENS, C_COUNT };

typedef struct {
    Py_ssize_t n;
    const long long *offsets, *lengths;
    const unsigned long long *object_sizes;
    const int *hlens;
    const unsigned char *base_oids, *has_base, *entry_types;
} Cols;

/* ``columns`` read into ``c``: 0, or -1 with an error when they are not the usual ones. */
static int
read_cols(PyObject *columns, Cols *c)
{
    static const Py_ssize_t width[C_COUNT] = {8, OID_BYTES, 1, 8, 8, 8, 4, OID_BYTES, 1, 1, 4};
    if (!PyTuple_Check(columns) || PyTuple_GET_SIZE(columns) != C_COUNT)
        goto bad;
    for (int k = 0; k < C_COUNT; k++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(columns, k)))
            goto bad;
    c->n = PyBytes_GET_SIZE(PyTuple_GET_ITEM(columns, C_TYPES));
    for (int k = 0; k < C_COUNT; k++)
        if (PyBytes_GET_SIZE(PyTuple_GET_ITEM(columns, k)) != c->n * width[k])
            goto bad;
#define COL(k) ((const void *)PyBytes_AS_STRING(PyTuple_GET_ITEM(columns, k)))
    c->offsets = COL(C_OFFSETS);
    c->lengths = COL(C_LENGTHS);
    c->object_sizes = COL(C_OBJECT_SIZES);
    c->hlens = COL(C_HLENS);
    c->base_oids = COL(C_BASE_OIDS);
    c->has_base = COL(C_HAS_BASE);
    c->entry_types = COL(C_ENTRY_TYPES);
#undef COL
    return 0;
bad:
    PyErr_SetString(PyExc_TypeError, "objects must be PackObjects.columns");
    return -1;
}

/* Entry ``i``'s base oid (new reference), or Py_None (new reference) for a full entry. */
static PyObject *
base_oid(const Cols *c, Py_ssize_t i)
{
    if (!c->has_base[i])
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)c->base_oids + (size_t)i * OID_BYTES,
                                     OID_BYTES);
}

typedef struct {
    PyObject *by_oid, *placed, *context, *thin, *held, *contains;
    PyObject *externals;
    int *depths; /* the planned depth by pack index, -1 while not planned */
    Cols cols;
    long depth_max;
    long long stream_bytes; /* a full entry longer than this ends the run, not read */
    const unsigned char *pack; /* the pack held in memory, or NULL: entries through read */
    Py_ssize_t pack_len;
    PyObject *read; /* read_at(offset, length) of the pack's source when it is not held */
} Plan;

/* Where entry ``i`` lies in the pack: 0, or -1 with an error when it lies outside. */
static int
entry_span(const Plan *p, Py_ssize_t i, long long *offset, long long *length)
{
    *offset = p->cols.offsets[i];
    *length = p->cols.lengths[i];
    if (*offset < 0 || *length <= 0 ||
        (p->read == NULL && (*offset > p->pack_len || *length > p->pack_len - *offset))) {
        PyErr_SetString(PyExc_ValueError, "a pack entry lies outside the pack");
        return -1;
    }
    return 0;
}

/* The entry's bytes as the pack holds them: a copy of the held pack's, or what ``read``
 * answers (checked to be that many bytes). */
static PyObject *
pack_slice(const Plan *p, Py_ssize_t i)
{
    long long offset, length;
    if (entry_span(p, i, &offset, &length) < 0)
        return NULL;
    if (p->read == NULL)
        return PyBytes_FromStringAndSize((const char *)p->pack + offset, (Py_ssize_t)length);
    PyObject *got = PyObject_CallFunction(p->read, "LL", offset, length);
    if (got != NULL && (!PyBytes_Check(got) || PyBytes_GET_SIZE(got) != length)) {
        Py_DECREF(got);
        PyErr_SetString(PyExc_ValueError, "read_at did not answer the entry's bytes");
        return NULL;
    }
    return got;
}

/* A kept OFS_DELTA as a REF_DELTA on ``base`` (packfmt.h's ofs_as_ref_delta, as
 * pack_entry.as_ref_delta); Py_None (new reference) when its header is not the usual one. */
static PyObject *
ref_delta(const Plan *p, Py_ssize_t i, PyObject *base)
{
    long long offset, length;
    if (entry_span(p, i, &offset, &length) < 0)
        return NULL;
    Py_ssize_t header_length = p->cols.hlens[i];
    if (!PyBytes_Check(base) || PyBytes_GET_SIZE(base) != OID_BYTES)
        Py_RETURN_NONE;
    const unsigned char *oid = (const unsigned char *)PyBytes_AS_STRING(base);
    if (p->read == NULL)
        return ofs_as_ref_delta(p->pack + offset, (Py_ssize_t)length, header_length, oid);
    PyObject *raw = pack_slice(p, i);
    if (raw == NULL)
        return NULL;
    PyObject *out = ofs_as_ref_delta((const unsigned char *)PyBytes_AS_STRING(raw),
                                     (Py_ssize_t)length, header_length, oid);
    Py_DECREF(raw);
    return out;
}

/* The reference's test of a base outside the layer: not placed, and thin, in the
 * snapshot by the walk's classification (``held``), or by ``contains``. 1, 0, or -1 on
 * error. */
static int
outside(const Plan *p, PyObject *base)
{
    int placed = PyDict_Contains(p->placed, base);
    if (placed != 0)
        return placed < 0 ? -1 : 0;
    int thin = PySet_Contains(p->thin, base);
    if (thin != 0)
        return thin;
    int held = PyDict_Contains(p->held, base);
    if (held != 0)
        return held;
    PyObject *r = PyObject_CallOneArg(p->contains, base);
    if (r == NULL)
        return -1;
    int yes = PyObject_IsTrue(r);
    Py_DECREF(r);
    return yes;
}

static int plan_base(const Plan *p, Py_ssize_t i, PyObject *kind, PyObject *base,
                     PyObject **base_out, long *depth_out, PyObject **entry_out);

/* Base, depth and entry of one object: new references in *base_out and *entry_out
 * (*entry_out None where the caller fills it in). 0, or -1 on error; 1 (nothing in the
 * outs) for a full entry over ``stream_bytes``, which is not read. */
static int
plan_one(const Plan *p, Py_ssize_t i, PyObject *kind, PyObject **base_out, long *depth_out,
         PyObject **entry_out)
{
    PyObject *base = base_oid(&p->cols, i);
    if (base == NULL)
        return -1;
    int status = plan_base(p, i, kind, base, base_out, depth_out, entry_out);
    Py_DECREF(base);
    return status;
}

/* plan_one with entry ``i``'s base oid (or Py_None) in ``base``, borrowed. */
static int
plan_base(const Plan *p, Py_ssize_t i, PyObject *kind, PyObject *base, PyObject **base_out,
          long *depth_out, PyObject **entry_out)
{
    long depth = 0;
    int keep = 0;
    if (base != Py_None) {
        Py_ssize_t b = -1;
        PyObject *index = PyDict_GetItemWithError(p->by_oid, base);
        if (index != NULL) {
            b = PyLong_AsSsize_t(index);
            if (b == -1 && PyErr_Occurred())
                return -1;
            if (b < 0 || b >= p->cols.n) {
                PyErr_SetString(PyExc_IndexError, "an object index outside the pack");
                return -1;
            }
        }
        else if (PyErr_Occurred())
            return -1;
        if (b >= 0 && p->depths[b] >= 0) { /* planned before it */
            depth = p->depths[b] + 1L;
            PyObject *base_kind = PyDict_GetItemWithError(p->placed, base);
            if (base_kind == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_KeyError, "a planned base is not placed");
                return -1;
            }
            int other = PyObject_RichCompareBool(base_kind, kind, Py_NE);
            if (other < 0)
                return -1;
            keep = !other && depth <= p->depth_max;
        }
        else {
            keep = outside(p, base);
            if (keep < 0)
                return -1;
            if (keep) {
                depth = 1; /* the base's depth in the snapshot is not known here */
                if (PySet_Add(p->externals, base) < 0)
                    return -1;
            }
        }
    }
    PyObject *entry;
    if (!keep) {
        depth = 0;
        if (base == Py_None && p->cols.lengths[i] > p->stream_bytes)
            return 1; /* the reference's ``large``: copied in pieces after the run */
        entry = base == Py_None ? pack_slice(p, i) : (Py_INCREF(Py_None), Py_None);
    }
    else {
        long entry_type = p->cols.entry_types[i];
        entry = entry_type == OBJ_REF_DELTA ? pack_slice(p, i) : ref_delta(p, i, base);
    }
    if (entry == NULL)
        return -1;
    *entry_out = entry;
    *base_out = keep ? base : Py_None;
    Py_INCREF(*base_out);
    *depth_out = depth;
    return 0;
}

PyDoc_STRVAR(plan_run_doc,
"plan_run(pack, order, start, run_bytes_max, by_oid, columns, placed, context, thin,\n"
"         held, contains, depth_max, depths, externals, stream_bytes)\n"
"--\n\n"
"``(stop, (oids, kinds, entries, sizes, bases, depths, contexts), redo, large)`` for\n"
"``order[start:stop]``: ingest._Plan.run over the pack held in ``pack`` (bytes), or\n"
"read entry by entry through ``pack`` (a source's ``read_at(offset, length)``).\n"
"``redo`` lists the run positions whose entry is None: a delta stored whole (its\n"
"base is None) or a kept OFS_DELTA with a header this does not read as usual.\n"
"``large`` is True when ``order[stop - 1]`` is a full entry over ``stream_bytes``,\n"
"outside the run, for the caller to copy in pieces.");

static PyObject *
plan_run(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer pack = {0}, depths;
    PyObject *pack_or_read, *order, *columns;
    Py_ssize_t start;
    long long run_bytes_max;
    Plan p;
    if (!PyArg_ParseTuple(args, "OO!nLO!O!O!O!O!O!Olw*O!L:plan_run", &pack_or_read, &PyList_Type,
                          &order, &start, &run_bytes_max, &PyDict_Type, &p.by_oid, &PyTuple_Type,
                          &columns, &PyDict_Type, &p.placed, &PyDict_Type, &p.context,
                          &PySet_Type, &p.thin, &PyDict_Type, &p.held, &p.contains, &p.depth_max,
                          &depths, &PySet_Type, &p.externals, &p.stream_bytes))
        return NULL;
    p.read = PyCallable_Check(pack_or_read) ? pack_or_read : NULL;
    if (p.read == NULL && PyObject_GetBuffer(pack_or_read, &pack, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&depths);
        return NULL;
    }
    if (read_cols(columns, &p.cols) < 0 || depths.len != p.cols.n * (Py_ssize_t)sizeof(int) ||
        depths.itemsize != (Py_ssize_t)sizeof(int)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "depths must be an array('i') of one item per entry");
        PyBuffer_Release(&pack);
        PyBuffer_Release(&depths);
        return NULL;
    }
    p.depths = (int *)depths.buf;
    p.pack = (const unsigned char *)pack.buf;
    p.pack_len = pack.len;
    PyObject *cols[7] = {NULL};
    PyObject *redo = PyList_New(0);
    PyObject *result = NULL;
    int ok = redo != NULL;
    for (int c = 0; c < 7 && ok; c++)
        ok = (cols[c] = PyList_New(0)) != NULL;
    Py_ssize_t n = PyList_GET_SIZE(order);
    Py_ssize_t stop = start < 0 ? 0 : start;
    long long run_bytes = 0;
    int large = 0;
    while (ok && !large && stop < n && run_bytes < run_bytes_max) {
        ok = 0;
        PyObject *oid = PyList_GET_ITEM(order, stop);
        Py_INCREF(oid);
        stop++;
        PyObject *index = PyDict_GetItemWithError(p.by_oid, oid);
        PyObject *kind = index == NULL ? NULL : PyDict_GetItemWithError(p.placed, oid);
        Py_ssize_t i = index == NULL ? -1 : PyLong_AsSsize_t(index);
        int found = 0;
        if (kind == NULL || i == -1) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, oid);
        }
        else if (i < 0 || i >= p.cols.n)
            PyErr_SetString(PyExc_IndexError, "an object index outside the pack");
        else
            found = 1;
        PyObject *base = NULL, *entry = NULL, *depth_obj = NULL, *ctx = NULL, *size = NULL;
        long depth = 0;
        int planned = found ? plan_one(&p, i, kind, &base, &depth, &entry) : -1;
        if (planned == 1) {
            p.depths[i] = 0;
            ok = large = 1;
        }
        else if (planned == 0 && (depth_obj = PyLong_FromLong(depth)) != NULL &&
                 (size = PyLong_FromUnsignedLongLong(p.cols.object_sizes[i])) != NULL) {
            ctx = PyDict_GetItemWithError(p.context, oid);
            if (ctx == NULL && !PyErr_Occurred())
                ctx = Py_None;
            Py_ssize_t at = PyList_GET_SIZE(cols[0]);
            PyObject *index_obj = entry == Py_None ? PyLong_FromSsize_t(at) : NULL;
            ok = ctx != NULL && (entry != Py_None || index_obj != NULL) &&
                 PyList_Append(cols[0], oid) == 0 && PyList_Append(cols[1], kind) == 0 &&
                 PyList_Append(cols[2], entry) == 0 &&
                 PyList_Append(cols[3], size) == 0 &&
                 PyList_Append(cols[4], base) == 0 && PyList_Append(cols[5], depth_obj) == 0 &&
                 PyList_Append(cols[6], ctx) == 0 &&
                 (index_obj == NULL || PyList_Append(redo, index_obj) == 0);
            if (ok)
                p.depths[i] = (int)depth;
            Py_XDECREF(index_obj);
            run_bytes += p.cols.lengths[i];
        }
        Py_XDECREF(size);
        Py_XDECREF(base);
        Py_XDECREF(entry);
        Py_XDECREF(depth_obj);
        Py_DECREF(oid);
    }
    if (ok) {
        PyObject *run = PyTuple_New(7);
        if (run != NULL) {
            for (int c = 0; c < 7; c++) {
                PyTuple_SET_ITEM(run, c, cols[c]);
                cols[c] = NULL;
            }
            result = Py_BuildValue("(nNOO)", stop, run, redo, large ? Py_True : Py_False);
        }
    }
    for (int c = 0; c < 7; c++)
        Py_XDECREF(cols[c]);
    Py_XDECREF(redo);
    PyBuffer_Release(&pack); /* nothing when the pack is read through read_at */
    PyBuffer_Release(&depths);
    return result;
}

/* The pack index of ``oid`` (by ``by_oid``), or -1 with an error. */
static Py_ssize_t
index_of(PyObject *by_oid, const Cols *cols, PyObject *oid)
{
    PyObject *index = PyDict_GetItemWithError(by_oid, oid);
    if (index == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, oid);
        return -1;
    }
    Py_ssize_t i = PyLong_AsSsize_t(index);
    if (i == -1 && PyErr_Occurred())
        return -1;
    if (i < 0 || i >= cols->n) {
        PyErr_SetString(PyExc_IndexError, "an object index outside the pack");
        return -1;
    }
    return i;
}

/* 1 when ``oid`` equals an item of ``chain``, 0 if not, -1 on error. */
static int
in_chain(PyObject *chain, PyObject *oid)
{
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(chain); k++) {
        int same = PyObject_RichCompareBool(PyList_GET_ITEM(chain, k), oid, Py_EQ);
        if (same != 0)
            return same;
    }
    return 0;
}

/* 1 when ``oid`` is placed with ``kind``, 0 if not, -1 on error. */
static int
of_kind(PyObject *placed, PyObject *kind, PyObject *oid)
{
    PyObject *found = PyDict_GetItemWithError(placed, oid);
    if (found == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return PyObject_RichCompareBool(found, kind, Py_EQ);
}

PyDoc_STRVAR(bases_first_doc,
"bases_first(order, by_oid, columns, placed, kind)\n"
"--\n\n"
"``order`` with each delta's chain of bases of ``kind`` (``placed[base] == kind``)\n"
"not yet placed moved just before it; otherwise unchanged. ingest._bases_first is\n"
"the reference. What is placed is marked in a byte per pack entry, not a set of\n"
"oids (on the large profile the two sets of trees were the storage order's peak).");

static PyObject *
bases_first(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *order, *by_oid, *columns, *placed, *kind;
    Cols cols;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O:bases_first", &PyList_Type, &order, &PyDict_Type,
                          &by_oid, &PyTuple_Type, &columns, &PyDict_Type, &placed, &kind))
        return NULL;
    if (read_cols(columns, &cols) < 0)
        return NULL;
    unsigned char *emitted = PyMem_Calloc(cols.n ? (size_t)cols.n : 1, 1);
    /* chain_at[k]: the pack index of chain[k], found as the chain grows */
    Py_ssize_t *chain_at = PyMem_Malloc((cols.n ? (size_t)cols.n : 1) * sizeof(Py_ssize_t));
    PyObject *out = PyList_New(0);
    PyObject *chain = PyList_New(0);
    int ok = emitted != NULL && chain_at != NULL && out != NULL && chain != NULL;
    if (emitted == NULL || chain_at == NULL)
        PyErr_NoMemory();
    for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(order); i++) {
        PyObject *oid = PyList_GET_ITEM(order, i);
        Py_ssize_t at = index_of(by_oid, &cols, oid);
        if (at < 0) {
            ok = 0;
            break;
        }
        if (emitted[at])
            continue;
        ok = PyList_SetSlice(chain, 0, PyList_GET_SIZE(chain), NULL) == 0 &&
             PyList_Append(chain, oid) == 0;
        chain_at[0] = at;
        PyObject *base = ok ? base_oid(&cols, at) : NULL;
        ok = base != NULL;
        while (ok && base != Py_None) {
            int member = of_kind(placed, kind, base);
            Py_ssize_t b = member > 0 ? index_of(by_oid, &cols, base) : 0;
            int again = member > 0 && b >= 0 && !emitted[b] ? in_chain(chain, base) : 0;
            if (member < 0 || b < 0 || again < 0) {
                ok = 0;
                break;
            }
            if (!member || emitted[b] || again)
                break;
            if (PyList_GET_SIZE(chain) >= cols.n) { /* only if by_oid names one entry twice */
                PyErr_SetString(PyExc_ValueError, "bases_first: a chain longer than the pack");
                ok = 0;
                break;
            }
            chain_at[PyList_GET_SIZE(chain)] = b;
            ok = PyList_Append(chain, base) == 0;
            PyObject *next = ok ? base_oid(&cols, b) : NULL;
            Py_DECREF(base);
            base = next;
            ok = ok && base != NULL;
        }
        Py_XDECREF(base);
        for (Py_ssize_t k = PyList_GET_SIZE(chain) - 1; ok && k >= 0; k--) {
            ok = PyList_Append(out, PyList_GET_ITEM(chain, k)) == 0;
            if (ok)
                emitted[chain_at[k]] = 1;
        }
    }
    PyMem_Free(emitted);
    PyMem_Free(chain_at);
    Py_XDECREF(chain);
    if (!ok) {
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"plan_run", plan_run, METH_VARARGS, plan_run_doc},
    {"bases_first", bases_first, METH_VARARGS, bases_first_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "enroute_native.entry_plan",
    "Ingest's plan of a run of layer entries (docs/native.md).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit_entry_plan(void)
{
    return PyModule_Create(&module);
}
