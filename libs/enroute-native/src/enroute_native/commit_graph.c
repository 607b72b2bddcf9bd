/*
 * The commit graph of a repository's first pushed layer, in one call (seed 004, "Design":
 * flat arrays per layer; docs/native.md).
 *
 * enroute_core.engine.view._first_graph is the reference: every ref of the layer's commit
 * section is a local index and the layer's ids are one run from ``first``, so each id is
 * ``first`` plus the ref and the columns map whole. The commit records come in rank order
 * (parents before children); the graph is by commit id. Generations are one more than the
 * largest parent's. A commit's segment is its member run, which must ascend strictly.
 *
 * Pure: the columns come as buffers of uint32 (times of int64) and nothing else is read.
 * Anything the reference judges otherwise than by building the same graph (a repeated
 * commit, a parent that is no earlier commit, a run outside its array, a member run that
 * does not ascend, an id past 32 bits) answers None, and the caller runs the reference,
 * which takes its own way or raises its own error. The answer is the graph's ten columns
 * as bytes, in CommitGraph's field order.
 *
 * The reference spent about 250 ms and 31 MiB of Python objects on the `large` profile's
 * 80,006 commits, the wait of the first read after the push (issue 25).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { LOCALS, TREES, TIMES, PARENT_STARTS, PARENT_COUNTS, MEMBER_STARTS, MEMBER_COUNTS,
       PARENT_REFS, MEMBER_REFS, COLUMNS };
enum { OUT_COMMITS, OUT_TREES, OUT_GENERATIONS, OUT_TIMES, OUT_PARENT_STARTS, OUT_PARENT_COUNTS,
       OUT_SEGMENT_STARTS, OUT_SEGMENT_COUNTS, OUT_PARENT_IDS, OUT_SEGMENT_IDS, OUTS };

static const char *const NAMES[COLUMNS] = {
    "local_indexes", "tree_refs",     "times",       "parent_starts", "parent_counts",
    "member_starts", "member_counts", "parent_refs", "member_refs",
};

/* A buffer of native uint32 (array('I')), or of int64 (array('q')) for the times. */
static int
get_column(PyObject *obj, Py_buffer *view, int c)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *want = c == TIMES ? "q" : "I";
    if (view->itemsize != (c == TIMES ? 8 : 4) || view->format == NULL ||
        strcmp(view->format, want) != 0) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "first_graph: %s is not an array('%s')", NAMES[c], want);
        return -1;
    }
    return 0;
}

/* A bytes object of ``n`` items of ``size`` bytes, to fill through ``*out``. */
static PyObject *
column(Py_ssize_t n, Py_ssize_t size, void **out)
{
    PyObject *b = PyBytes_FromStringAndSize(NULL, n * size);
    if (b != NULL)
        *out = PyBytes_AS_STRING(b);
    return b;
}

/* Copy the runs refs[starts[r] : starts[r] + counts[r]] for r in ``order``, each plus
 * ``first``, into ``out``; with ``ascending``, each run must ascend strictly. 0 when a
 * run leaves ``refs``, an id passes 32 bits, or a run does not ascend. */
static int
runs(const uint32_t *refs, Py_ssize_t n_refs, const uint32_t *starts, const uint32_t *counts,
     const int32_t *order, Py_ssize_t n, uint64_t first, int ascending, uint32_t *out)
{
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t r = order[i];
        uint64_t start = starts[r], count = counts[r];
        if (start + count > (uint64_t)n_refs)
            return 0;
        for (uint64_t j = 0; j < count; j++) {
            uint64_t id = first + refs[start + j];
            if (id > UINT32_MAX)
                return 0;
            if (ascending && j > 0 && id <= out[k - 1])
                return 0;
            out[k++] = (uint32_t)id;
        }
    }
    return 1;
}

PyDoc_STRVAR(first_graph_doc,
"first_graph(first, local_indexes, tree_refs, times, parent_starts, parent_counts,\n"
"            member_starts, member_counts, parent_refs, member_refs, /)\n"
"--\n\n"
"The graph of a first pushed layer whose ids are one run from ``first``: its ten\n"
"columns as bytes (uint32, the times int64) in CommitGraph's field order, or None\n"
"where view._first_graph, the reference, must decide.");

static PyObject *
first_graph(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long first;
    PyObject *objs[COLUMNS];
    if (!PyArg_ParseTuple(args, "KOOOOOOOOO:first_graph", &first, &objs[LOCALS], &objs[TREES],
                          &objs[TIMES], &objs[PARENT_STARTS], &objs[PARENT_COUNTS],
                          &objs[MEMBER_STARTS], &objs[MEMBER_COUNTS], &objs[PARENT_REFS],
                          &objs[MEMBER_REFS]))
        return NULL;
    Py_buffer col[COLUMNS];
    int held = 0;
    PyObject *outs[OUTS] = {NULL};
    PyObject *result = NULL;
    int32_t *rank_of = NULL, *order = NULL;
    uint32_t *gen_by_rank = NULL;
    for (; held < COLUMNS; held++)
        if (get_column(objs[held], &col[held], held) < 0)
            goto done;
    Py_ssize_t n = col[LOCALS].len / 4;
    for (int c = TREES; c <= MEMBER_COUNTS; c++)
        if (col[c].len / col[c].itemsize != n) {
            PyErr_SetString(PyExc_ValueError, "first_graph: the record columns differ in length");
            goto done;
        }
    if (n >= INT32_MAX || first > UINT32_MAX) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    const uint32_t *locals = col[LOCALS].buf, *trees = col[TREES].buf;
    const int64_t *times = col[TIMES].buf;
    const uint32_t *pstarts = col[PARENT_STARTS].buf, *pcounts = col[PARENT_COUNTS].buf;
    const uint32_t *mstarts = col[MEMBER_STARTS].buf, *mcounts = col[MEMBER_COUNTS].buf;
    const uint32_t *prefs = col[PARENT_REFS].buf, *mrefs = col[MEMBER_REFS].buf;
    Py_ssize_t n_prefs = col[PARENT_REFS].len / 4, n_mrefs = col[MEMBER_REFS].len / 4;

    /* Each local index's rank (-1: none); a repeated one is the reference's to skip. */
    uint32_t span = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        if (locals[r] >= INT32_MAX) { /* a layer's local indexes are below its object count */
            result = Py_NewRef(Py_None);
            goto done;
        }
        if (locals[r] >= span)
            span = locals[r] + 1;
    }
    rank_of = PyMem_Malloc(((size_t)span + 1) * sizeof(int32_t));
    order = PyMem_Malloc(((size_t)n + 1) * sizeof(int32_t));
    gen_by_rank = PyMem_Malloc(((size_t)n + 1) * sizeof(uint32_t));
    if (rank_of == NULL || order == NULL || gen_by_rank == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memset(rank_of, 0xff, (size_t)span * sizeof(int32_t));
    for (Py_ssize_t r = 0; r < n; r++) {
        if (rank_of[locals[r]] != -1) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        rank_of[locals[r]] = (int32_t)r;
    }
    /* Generations by rank: every parent an earlier commit of the layer. */
    uint64_t n_parents = 0, n_members = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        uint64_t start = pstarts[r], count = pcounts[r];
        if (start + count > (uint64_t)n_prefs) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        uint32_t generation = 1;
        for (uint64_t j = 0; j < count; j++) {
            uint32_t p = prefs[start + j];
            int32_t pr = p < span ? rank_of[p] : -1;
            if (pr < 0 || pr >= r) {
                result = Py_NewRef(Py_None);
                goto done;
            }
            if (gen_by_rank[pr] >= generation)
                generation = gen_by_rank[pr] + 1;
        }
        gen_by_rank[r] = generation;
        n_parents += count;
        n_members += mcounts[r];
    }
    /* By commit id: ascending local index. */
    Py_ssize_t k = 0;
    for (uint32_t local = 0; local < span; local++)
        if (rank_of[local] >= 0)
            order[k++] = rank_of[local];

    uint32_t *ids, *tree_ids, *gens, *ps, *pc, *ss, *sc, *pids, *sids;
    int64_t *ts;
    if ((outs[OUT_COMMITS] = column(n, 4, (void **)&ids)) == NULL ||
        (outs[OUT_TREES] = column(n, 4, (void **)&tree_ids)) == NULL ||
        (outs[OUT_GENERATIONS] = column(n, 4, (void **)&gens)) == NULL ||
        (outs[OUT_TIMES] = column(n, 8, (void **)&ts)) == NULL ||
        (outs[OUT_PARENT_STARTS] = column(n, 4, (void **)&ps)) == NULL ||
        (outs[OUT_PARENT_COUNTS] = column(n, 4, (void **)&pc)) == NULL ||
        (outs[OUT_SEGMENT_STARTS] = column(n, 4, (void **)&ss)) == NULL ||
        (outs[OUT_SEGMENT_COUNTS] = column(n, 4, (void **)&sc)) == NULL ||
        (outs[OUT_PARENT_IDS] = column((Py_ssize_t)n_parents, 4, (void **)&pids)) == NULL ||
        (outs[OUT_SEGMENT_IDS] = column((Py_ssize_t)n_members, 4, (void **)&sids)) == NULL)
        goto done;
    uint64_t at_parent = 0, at_member = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t r = order[i];
        uint64_t commit = first + locals[r], tree = first + trees[r];
        if (commit > UINT32_MAX || tree > UINT32_MAX || at_parent > UINT32_MAX ||
            at_member > UINT32_MAX) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        ids[i] = (uint32_t)commit;
        tree_ids[i] = (uint32_t)tree;
        gens[i] = gen_by_rank[r];
        ts[i] = times[r];
        ps[i] = (uint32_t)at_parent;
        pc[i] = pcounts[r];
        ss[i] = (uint32_t)at_member;
        sc[i] = mcounts[r];
        at_parent += pcounts[r];
        at_member += mcounts[r];
    }
    if (!runs(prefs, n_prefs, pstarts, pcounts, order, n, first, 0, pids) ||
        !runs(mrefs, n_mrefs, mstarts, mcounts, order, n, first, 1, sids)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyTuple_New(OUTS);
    if (result != NULL)
        for (int c = 0; c < OUTS; c++) {
            PyTuple_SET_ITEM(result, c, outs[c]);
            outs[c] = NULL;
        }
done:
    for (int c = 0; c < OUTS; c++)
        Py_XDECREF(outs[c]);
    PyMem_Free(rank_of);
    PyMem_Free(order);
    PyMem_Free(gen_by_rank);
    for (int c = 0; c < held; c++)
        PyBuffer_Release(&col[c]);
    return result;
}

static PyMethodDef methods[] = {
    {"first_graph", first_graph, METH_VARARGS, first_graph_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "enroute_native.commit_graph",
    "The commit graph of a first pushed layer, in one call.", -1, methods, NULL, NULL,
    NULL, NULL,
};

PyMODINIT_FUNC
PyInit_commit_graph(void)
{
    return PyModule_Create(&module);
}
