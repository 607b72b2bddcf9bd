/*
 * A commit closure in one call: the union of the segments of every ancestor of
 * the start commits (DESIGN "Layers": a commit's closure; docs/native.md).
 *
 * enroute_core.engine.view.closure_reference is the reference: a depth-first walk
 * over the view's commit graphs, each commit met once, its segment's ids and its
 * parents taken from the flat arrays of the layer whose id range holds it (binary
 * search by range, then by commit id). The result is the same set, as the ids in
 * ascending order. Pure: the graphs' arrays come as buffers of uint32 and nothing
 * else is read. Anything the reference would judge (an id that is no commit of the
 * graphs, a run outside its array, an id past ``end``) answers None, and the caller
 * runs the reference, whose errors are the ones raised.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { COMMIT_IDS, PARENT_STARTS, PARENT_COUNTS, PARENT_IDS, SEGMENT_STARTS, SEGMENT_COUNTS,
       SEGMENT_IDS, COLUMNS };

typedef struct {
    uint64_t first, end;
    Py_buffer col[COLUMNS];
    int held; /* columns acquired so far */
} Graph;

static const uint32_t *
u32(const Graph *g, int c)
{
    return (const uint32_t *)g->col[c].buf;
}

static Py_ssize_t
count(const Graph *g, int c)
{
    return g->col[c].len / 4;
}

/* A buffer of native uint32 (array('I')), or a ValueError. */
static int
get_u32(PyObject *obj, Py_buffer *view)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (view->itemsize != 4 || view->format == NULL || strcmp(view->format, "I") != 0) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "closure: a column is not an array of uint32");
        return -1;
    }
    return 0;
}

static void
release(Graph *graphs, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        for (int c = 0; c < graphs[i].held; c++)
            PyBuffer_Release(&graphs[i].col[c]);
}

/* graphs[i] = (first, end, seven columns); ranges ascending and apart. */
static int
parse_graphs(PyObject *seq, Graph *graphs, Py_ssize_t n, Py_ssize_t *parsed)
{
    *parsed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        Graph *g = &graphs[i];
        g->held = 0;
        *parsed = i + 1;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 + COLUMNS) {
            PyErr_SetString(PyExc_ValueError, "closure: a graph is (first, end, 7 columns)");
            return -1;
        }
        unsigned long long first = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 0));
        unsigned long long end = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 1));
        if (PyErr_Occurred())
            return -1;
        g->first = first;
        g->end = end;
        for (int c = 0; c < COLUMNS; c++) {
            if (get_u32(PyTuple_GET_ITEM(item, 2 + c), &g->col[c]) < 0)
                return -1;
            g->held = c + 1;
        }
        if (first > end || (i > 0 && first < graphs[i - 1].end)) {
            PyErr_SetString(PyExc_ValueError, "closure: graph ranges overlap or descend");
            return -1;
        }
        Py_ssize_t commits = count(g, COMMIT_IDS);
        if (count(g, PARENT_STARTS) != commits || count(g, PARENT_COUNTS) != commits ||
            count(g, SEGMENT_STARTS) != commits || count(g, SEGMENT_COUNTS) != commits) {
            PyErr_SetString(PyExc_ValueError, "closure: a graph's columns differ in length");
            return -1;
        }
    }
    return 0;
}

/* The rank of commit id `c` in the graph whose range holds it, or -1. */
static Py_ssize_t
locate(const Graph *graphs, Py_ssize_t n, uint32_t c, const Graph **found)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (graphs[mid].end <= c)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == n || c < graphs[lo].first)
        return -1;
    const Graph *g = &graphs[lo];
    const uint32_t *ids = u32(g, COMMIT_IDS);
    Py_ssize_t a = 0, b = count(g, COMMIT_IDS);
    while (a < b) {
        Py_ssize_t mid = a + (b - a) / 2;
        if (ids[mid] < c)
            a = mid + 1;
        else
            b = mid;
    }
    if (a == count(g, COMMIT_IDS) || ids[a] != c)
        return -1;
    *found = g;
    return a;
}

typedef struct {
    uint32_t *items;
    size_t len, cap;
} Stack;

static int
push(Stack *s, uint32_t v)
{
    if (s->len == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        uint32_t *items = realloc(s->items, cap * sizeof(uint32_t));
        if (items == NULL)
            return -1;
        s->items = items;
        s->cap = cap;
    }
    s->items[s->len++] = v;
    return 0;
}

#define TEST(bits, i) ((bits)[(i) >> 6] >> ((i) & 63) & 1)
#define SET(bits, i) ((bits)[(i) >> 6] |= (uint64_t)1 << ((i) & 63))

/* 1 walked, 0 the reference must judge, -1 out of memory. */
static int
walk(const Graph *graphs, Py_ssize_t n, const Py_buffer *starts, uint64_t end, uint64_t *seen,
     uint64_t *members)
{
    Stack stack = {NULL, 0, 0};
    int result = 1;
    const uint32_t *first = (const uint32_t *)starts->buf;
    for (Py_ssize_t i = starts->len / 4 - 1; i >= 0; i--)
        if (push(&stack, first[i]) < 0)
            goto oom;
    while (stack.len) {
        uint32_t c = stack.items[--stack.len];
        if (c >= end) {
            result = 0;
            break;
        }
        if (TEST(seen, c))
            continue;
        SET(seen, c);
        const Graph *g = NULL;
        Py_ssize_t rank = locate(graphs, n, c, &g);
        if (rank < 0) {
            result = 0;
            break;
        }
        uint64_t s = u32(g, SEGMENT_STARTS)[rank], k = u32(g, SEGMENT_COUNTS)[rank];
        if (s + k > (uint64_t)count(g, SEGMENT_IDS)) {
            result = 0;
            break;
        }
        const uint32_t *segment = u32(g, SEGMENT_IDS) + s;
        for (uint64_t j = 0; j < k; j++) {
            if (segment[j] >= end) {
                result = 0;
                goto done;
            }
            SET(members, segment[j]);
        }
        s = u32(g, PARENT_STARTS)[rank];
        k = u32(g, PARENT_COUNTS)[rank];
        if (s + k > (uint64_t)count(g, PARENT_IDS)) {
            result = 0;
            break;
        }
        const uint32_t *parents = u32(g, PARENT_IDS) + s;
        for (uint64_t j = 0; j < k; j++)
            if ((parents[j] >= end || !TEST(seen, parents[j])) && push(&stack, parents[j]) < 0)
                goto oom;
    }
done:
    free(stack.items);
    return result;
oom:
    free(stack.items);
    return -1;
}

PyDoc_STRVAR(closure_doc,
"closure(graphs, starts, end)\n"
"--\n\n"
"The ids of every segment member of the starts' ancestors, ascending, as native\n"
"uint32 bytes; None when the graphs do not answer (the reference judges).\n"
"``graphs``: a tuple of (first, end, commit_ids, parent_starts, parent_counts,\n"
"parent_ids, segment_starts, segment_counts, segment_ids), ranges ascending,\n"
"columns array('I'); ``starts``: array('I') of commit ids; ``end``: above every id.");

static PyObject *
closure(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *seq, *starts_obj;
    unsigned long long end;
    if (!PyArg_ParseTuple(args, "O!OK:closure", &PyTuple_Type, &seq, &starts_obj, &end))
        return NULL;
    if (end > ((unsigned long long)1 << 32)) {
        PyErr_SetString(PyExc_ValueError, "closure: end past 2**32");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq), parsed = 0;
    Graph *graphs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Graph));
    if (graphs == NULL)
        return PyErr_NoMemory();
    PyObject *out = NULL;
    Py_buffer starts;
    int have_starts = 0;
    uint64_t *seen = NULL, *members = NULL;
    if (parse_graphs(seq, graphs, n, &parsed) < 0 || get_u32(starts_obj, &starts) < 0)
        goto done;
    have_starts = 1;
    size_t words = (size_t)(end + 63) / 64 + 1;
    seen = calloc(words, sizeof(uint64_t));
    members = calloc(words, sizeof(uint64_t));
    if (seen == NULL || members == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int walked;
    Py_BEGIN_ALLOW_THREADS
    walked = walk(graphs, n, &starts, end, seen, members);
    Py_END_ALLOW_THREADS
    if (walked < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (walked == 0) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t total = 0;
    for (size_t w = 0; w < words; w++)
        total += __builtin_popcountll(members[w]);
    out = PyBytes_FromStringAndSize(NULL, total * 4);
    if (out == NULL)
        goto done;
    uint32_t *ids = (uint32_t *)PyBytes_AS_STRING(out);
    Py_ssize_t at = 0;
    for (size_t w = 0; w < words; w++)
        for (uint64_t bits = members[w]; bits; bits &= bits - 1)
            ids[at++] = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(bits));
done:
    free(seen);
    free(members);
    if (have_starts)
        PyBuffer_Release(&starts);
    release(graphs, parsed);
    PyMem_Free(graphs);
    return out;
}

static PyMethodDef methods[] = {
    {"closure", closure, METH_VARARGS, closure_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "enroute_native.commit_closure",
    "A commit closure over a view's commit graphs, in one call.", -1, methods, NULL, NULL,
    NULL, NULL,
};

PyMODINIT_FUNC
PyInit_commit_closure(void)
{
    return PyModule_Create(&module);
}
