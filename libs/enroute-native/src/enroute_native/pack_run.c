/*
 * The serving writer's run of stored entries (seed 004, "Layers": entries are
 * stored as pack entries in id order, so serving copies them): consecutive
 * local entries of a single-run layer that lie back to back, copied from one
 * read, each REF_DELTA whose base is written earlier in the pack rewritten as
 * an OFS_DELTA when the client said ofs-delta (gitformat-pack, "Deltified
 * representation": the type bits and the base distance instead of the base
 * oid, the same zlib bytes).
 *
 * enroute_core.engine.serve._write_run_reference is the reference, step for
 * step: the same extent (back to back, within the local bytes, no base that
 * cannot be sent), the same calls of ``outside`` in the same order, then the
 * one ``read`` of the run, and the same bytes, pack offsets and counts. Where
 * the reference raises CorruptData (a delta record on an entry that is not a
 * REF_DELTA, a header longer than ten bytes or with no room for the base oid)
 * or would fail otherwise, this answers None and the reference runs, raising
 * it; so this code never decides that input is bad. Every read is checked
 * against the bytes it reads; nothing is written into a caller's buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "packfmt.h"

/* The object table's base refs (enroute_core.storage.layer.format). */
#define REF_NONE 0xFFFFFFFFLL
#define REF_EXTERNAL 0x80000000LL
/* What ``outside`` answers besides a pack offset (serve._OUTSIDE_KEPT, serve._OUTSIDE_NO). */
#define OUTSIDE_KEPT (-1LL)
#define OUTSIDE_NO (-2LL)
/* Here only: the base is an earlier entry of the run. */
#define IN_RUN (-3LL)

typedef struct {
    long long off, length, base, base_offset;
} Entry;

/* The OFS_DELTA distance (gitformat-pack, "offset encoding"), most significant byte first,
 * into the end of ``tmp``; answers its length. git.pack.encode_ofs_distance is the reference. */
static int
encode_distance(unsigned long long d, unsigned char tmp[OFS_BYTES_MAX])
{
    int pos = OFS_BYTES_MAX - 1;
    tmp[pos] = (unsigned char)(d & 0x7F);
    while (d >>= 7) {
        d -= 1;
        tmp[--pos] = (unsigned char)(0x80 | (d & 0x7F));
    }
    return OFS_BYTES_MAX - pos;
}

/* The object table's record (enroute_core.storage.layer.format.RECORD, "<20sQIQIII",
 * little-endian): the entry's stored offset (8 bytes) at 20, its length (4) at 28, its
 * base ref (4) at 40. The serving writer reads a slab of the table as these bytes
 * (storage.layer.reader.EntryRows), not as a tuple per record. */
#define RECORD_BYTES 52
#define RECORD_OFFSET_AT 20
#define RECORD_LENGTH_AT 28
#define RECORD_BASE_AT 40

static inline unsigned long long
le_uint(const unsigned char *p, int n)
{
    unsigned long long v = 0;
    for (int k = n - 1; k >= 0; k--)
        v = v << 8 | p[k];
    return v;
}

/* The row ``(offset, length, base ref)`` of record ``k`` of ``table``; -1 with an
 * exception set. */
static int
read_row(const unsigned char *table, Py_ssize_t k, Entry *e)
{
    const unsigned char *rec = table + k * RECORD_BYTES;
    unsigned long long off = le_uint(rec + RECORD_OFFSET_AT, 8);
    if (off > (1ULL << 62)) {
        PyErr_SetString(PyExc_ValueError, "write_run: a row out of range");
        return -1;
    }
    e->off = (long long)off;
    e->length = (long long)le_uint(rec + RECORD_LENGTH_AT, 4);
    e->base = (long long)le_uint(rec + RECORD_BASE_AT, 4);
    return 0;
}

/* The pack offset of a base outside the run, or OUTSIDE_KEPT / OUTSIDE_NO; -3 with an
 * exception set. A local base below ``start`` is read from ``offsets`` at ``rank0 + base``
 * when ``rank0`` >= 0 (the caller saw every id of the layer below ``start`` planned). */
static long long
outside_base(long long base, const unsigned char *offsets, Py_ssize_t n_offsets,
             Py_ssize_t rank0, PyObject *outside)
{
    if (!(base & REF_EXTERNAL) && rank0 >= 0) {
        if (base >= (long long)(n_offsets - rank0)) {
            PyErr_SetString(PyExc_ValueError, "write_run: a base past the written offsets");
            return -3;
        }
        uint64_t at;
        memcpy(&at, offsets + (size_t)(rank0 + base) * 8, 8);
        return (long long)at;
    }
    PyObject *got = PyObject_CallFunction(outside, "L", base);
    if (got == NULL)
        return -3;
    long long r = PyLong_AsLongLong(got);
    Py_DECREF(got);
    if (r == -1 && PyErr_Occurred())
        return -3;
    if (r < OUTSIDE_NO) {
        PyErr_SetString(PyExc_ValueError, "write_run: outside() answered below -2");
        return -3;
    }
    return r;
}

typedef struct {
    Py_ssize_t written, copied, rewritten, thin_kept;
    int unusual;
} Counts;

/* The bytes of ``count`` entries from ``data`` (stored offset ``off0``) into ``out``, their
 * pack offsets from ``pos0`` into ``run_offs``. No Python object is touched: the caller may
 * let other threads run meanwhile. ``unusual`` is set where the reference decides. */
static Counts
rewrite(const Entry *ents, Py_ssize_t count, long long start, const unsigned char *data,
        long long data_len, long long off0, long long pos0, int ofs, unsigned char *out,
        uint64_t *run_offs)
{
    Counts c = {0, 0, 0, 0, 0};
    long long shift = pos0 - off0; /* pack offset minus stored offset, so far */
    long long pending = 0;          /* start (in data) of bytes not yet copied */
    for (Py_ssize_t k = 0; k < count; k++) {
        const Entry *e = &ents[k];
        long long here = e->off + shift;
        run_offs[k] = (uint64_t)here;
        if (e->base == REF_NONE) {
            c.copied++;
            continue;
        }
        long long s = e->off - off0;
        if (e->length < 1 || ((data[s] >> 4) & 7) != OBJ_REF_DELTA)
            goto unusual;
        long long base_offset = e->base_offset;
        if (base_offset == IN_RUN) {
            long long at = e->base - start;
            if (at < 0 || at >= k)
                goto unusual;
            base_offset = (long long)run_offs[at];
        }
        if (base_offset == OUTSIDE_KEPT || !ofs) {
            c.copied++;
            c.thin_kept += base_offset == OUTSIDE_KEPT;
            continue;
        }
        long long hlen = 1;
        while (data[s + hlen - 1] & 0x80) {
            hlen++;
            if (hlen > SIZE_BYTES_MAX || hlen + OID_BYTES > e->length)
                goto unusual;
        }
        if (hlen + OID_BYTES > e->length || here <= base_offset)
            goto unusual;
        memcpy(out + c.written, data + pending, (size_t)(s - pending));
        c.written += s - pending;
        out[c.written++] = data[s] ^ 0x10; /* type 7 (REF_DELTA) becomes 6 (OFS_DELTA) */
        memcpy(out + c.written, data + s + 1, (size_t)(hlen - 1));
        c.written += hlen - 1;
        unsigned char tmp[OFS_BYTES_MAX];
        int n = encode_distance((unsigned long long)(here - base_offset), tmp);
        memcpy(out + c.written, tmp + OFS_BYTES_MAX - n, (size_t)n);
        c.written += n;
        shift -= OID_BYTES - n;
        pending = s + hlen + OID_BYTES;
        c.rewritten++;
    }
    memcpy(out + c.written, data + pending, (size_t)(data_len - pending));
    c.written += data_len - pending;
    return c;
unusual:
    c.unusual = 1;
    return c;
}

PyDoc_STRVAR(write_run_doc,
"write_run(table, i, last, start, limit, pos0, ofs, offsets, rank0, outside, read)\n"
"--\n\n"
"The run of records ``i`` to ``last`` of ``table`` (object table records, of which\n"
"the offset, length and base ref are read; record ``i`` is local ``start``) as far as the entries lie back to back, end within the stored offset\n"
"``limit`` (the first may pass it) and need no resolving: ``outside(base)`` answers\n"
"for a base ref outside the run (a pack offset, -1 kept as stored, -2 not sendable:\n"
"the run stops before it), except a local one when ``rank0`` >= 0, whose offset is\n"
"``offsets[rank0 + base]``. Then ``read(offset, length)`` gives the run's stored\n"
"bytes once. Answers ``(entries, bytes, pack offsets as array('Q') bytes, copied,\n"
"rewritten, thin_kept)``, the run starting at pack offset ``pos0``; entries 0 for\n"
"fewer than two; None where the reference decides (an entry it finds corrupt).");

static PyObject *
write_run(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *outside, *read;
    Py_ssize_t i, last, rank0;
    long long start, limit, pos0;
    int ofs;
    Py_buffer table, offsets;
    if (!PyArg_ParseTuple(args, "y*nnLLLpy*nOO:write_run", &table, &i, &last, &start, &limit,
                          &pos0, &ofs, &offsets, &rank0, &outside, &read))
        return NULL;
    PyObject *result = NULL, *data_obj = NULL, *out = NULL, *offs = NULL;
    Entry *ents = NULL;
    Py_buffer data = {0};
    int have_data = 0;
    if (table.len % RECORD_BYTES != 0 || i < 0 || i > last ||
        last > table.len / RECORD_BYTES || offsets.len % 8 != 0 || start < 0 || pos0 < 0) {
        PyErr_SetString(PyExc_ValueError, "write_run: arguments out of range");
        goto done;
    }
    Py_ssize_t n_offsets = offsets.len / 8;
    ents = PyMem_Malloc(sizeof(Entry) * (size_t)(last - i + 1));
    if (ents == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* 1. The extent, as the reference's first loop. */
    Py_ssize_t count = 0;
    long long off0 = 0, expect = 0;
    for (Py_ssize_t k = i; k < last; k++) {
        Entry e;
        if (read_row((const unsigned char *)table.buf, k, &e) < 0)
            goto done;
        if (k == i)
            off0 = expect = e.off;
        if (e.off != expect || (e.off + e.length > limit && k > i))
            break;
        e.base_offset = OUTSIDE_KEPT;
        if (e.base != REF_NONE) {
            if ((e.base & REF_EXTERNAL) || e.base < start) {
                long long r = outside_base(e.base, (const unsigned char *)offsets.buf,
                                           n_offsets, rank0, outside);
                if (r == -3)
                    goto done;
                if (r == OUTSIDE_NO)
                    break;
                e.base_offset = r;
            }
            else {
                e.base_offset = IN_RUN;
            }
        }
        ents[count++] = e;
        expect = e.off + e.length;
    }
    if (count < 2) {
        result = Py_BuildValue("(nyyiii)", (Py_ssize_t)0, "", "", 0, 0, 0);
        goto done;
    }
    /* 2. One read of the run, then its bytes: slices, each REF_DELTA header rewritten or kept. */
    data_obj = PyObject_CallFunction(read, "LL", off0, expect - off0);
    if (data_obj == NULL || PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0)
        goto done;
    have_data = 1;
    if (data.len != expect - off0) {
        PyErr_SetString(PyExc_ValueError, "write_run: read() gave another length");
        goto done;
    }
    /* A rewrite only shortens an entry (an oid of 20 bytes becomes a distance of at most 10). */
    out = PyBytes_FromStringAndSize(NULL, data.len);
    offs = PyBytes_FromStringAndSize(NULL, count * 8);
    if (out == NULL || offs == NULL)
        goto done;
    const unsigned char *src = (const unsigned char *)data.buf;
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    uint64_t *run_offs = (uint64_t *)PyBytes_AS_STRING(offs);
    Counts c;
    Py_BEGIN_ALLOW_THREADS
    c = rewrite(ents, count, start, src, data.len, off0, pos0, ofs, dst, run_offs);
    Py_END_ALLOW_THREADS
    if (c.unusual) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    if (_PyBytes_Resize(&out, c.written) < 0)
        goto done; /* out is NULL now */
    result = Py_BuildValue("(nOOnnn)", count, out, offs, c.copied, c.rewritten, c.thin_kept);
done:
    PyMem_Free(ents);
    if (have_data)
        PyBuffer_Release(&data);
    Py_XDECREF(data_obj);
    Py_XDECREF(out);
    Py_XDECREF(offs);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&table);
    return result;
}

PyDoc_STRVAR(check_rows_doc,
"check_rows(table, start, data_end, externals)\n"
"--\n\n"
"The first record of ``table`` (object table records from local ``start``) that\n"
"fails the reader's checks, as its position in ``table``, or -1: a length of 0 or\n"
"an extent past ``data_end``, or a base ref that is neither none, an external\n"
"index below ``externals`` nor an earlier local index.\n"
"storage.layer.reader.bad_row is the reference and words the failure.");

static PyObject *
check_rows(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer table;
    long long start, data_end, externals;
    if (!PyArg_ParseTuple(args, "y*LLL:check_rows", &table, &start, &data_end, &externals))
        return NULL;
    if (table.len % RECORD_BYTES != 0 || start < 0 || data_end < 0 || externals < 0) {
        PyBuffer_Release(&table);
        PyErr_SetString(PyExc_ValueError, "check_rows: arguments out of range");
        return NULL;
    }
    const unsigned char *rec = (const unsigned char *)table.buf;
    Py_ssize_t n = table.len / RECORD_BYTES, bad = -1;
    for (Py_ssize_t k = 0; k < n; k++, rec += RECORD_BYTES) {
        unsigned long long off = le_uint(rec + RECORD_OFFSET_AT, 8);
        unsigned long long length = le_uint(rec + RECORD_LENGTH_AT, 4);
        long long base = (long long)le_uint(rec + RECORD_BASE_AT, 4);
        if (length == 0 || off > (unsigned long long)data_end ||
            length > (unsigned long long)data_end - off) {
            bad = k;
            break;
        }
        if (base != REF_NONE &&
            !((base & REF_EXTERNAL) ? (base & ~REF_EXTERNAL) < externals : base < start + k)) {
            bad = k;
            break;
        }
    }
    PyBuffer_Release(&table);
    return PyLong_FromSsize_t(bad);
}

static PyMethodDef methods[] = {
    {"write_run", write_run, METH_VARARGS, write_run_doc},
    {"check_rows", check_rows, METH_VARARGS, check_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "enroute_native.pack_run",
    "The serving writer's run of stored entries, REF_DELTA headers rewritten, in one call.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit_pack_run(void)
{
    return PyModule_Create(&module);
}
