/*
 * The segment diff of one commit (DESIGN "Layers": segments; seed 004, "Layers").
 *
 * enroute_core.engine.segments.commit_segment is the reference: the same
 * members in the same order, and the same visits. This is its loop over raw
 * tree bodies, so that a push pays no Python object per tree entry; only the
 * members it finds become bytes objects. Trees are read through callbacks:
 * nothing here does I/O or knows where a body comes from.
 *
 * Bodies are parsed as git writes them ("MODE SP NAME NUL OID", MODE one of
 * the six git writes). Any other body is handed to `unusual`, which parses it
 * strictly (raising the typed error of a bad tree) and answers it in that form.
 * Input is untrusted: every read is bounds-checked against the body's length.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define OID_BYTES 20
/* Shortest entry: a 5-byte mode, SP, an empty name (only from `unusual`), NUL, an oid. */
#define ENTRY_BYTES_MIN (5 + 1 + 0 + 1 + OID_BYTES)

enum { FLAG_BLOB = 0, FLAG_TREE = 1, FLAG_GITLINK = 2 };

typedef struct {
    const unsigned char *name;
    Py_ssize_t name_len;
    const unsigned char *oid;
    int flag;
} Entry;

typedef struct {
    PyObject *body; /* owns the bytes the entries point into */
    Entry *entries;
    Py_ssize_t count;
    Py_ssize_t *slots; /* open addressing by name: entry index + 1, 0 empty */
    size_t mask;
} Tree;

static int
mode_flag(const unsigned char *p, Py_ssize_t n)
{
    if (n == 5)
        return memcmp(p, "40000", 5) == 0 ? FLAG_TREE : -1;
    if (n != 6)
        return -1;
    if (memcmp(p, "100644", 6) == 0 || memcmp(p, "100755", 6) == 0 ||
        memcmp(p, "120000", 6) == 0 || memcmp(p, "100664", 6) == 0)
        return FLAG_BLOB;
    if (memcmp(p, "160000", 6) == 0)
        return FLAG_GITLINK;
    return -1;
}

/* 1 parsed, 0 not in git's own form (or over entries_max); -1 with an exception set. */
static int
parse_body(Tree *t, Py_ssize_t entries_max, int allow_empty_names)
{
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(t->body);
    Py_ssize_t n = PyBytes_GET_SIZE(t->body);
    Py_ssize_t room = n / ENTRY_BYTES_MIN + 1;
    Py_ssize_t pos = 0;
    t->count = 0;
    t->entries = PyMem_New(Entry, room);
    if (t->entries == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    while (pos < n) {
        Py_ssize_t left = n - pos;
        const unsigned char *sp = memchr(b + pos, ' ', left < 7 ? left : 7);
        if (sp == NULL)
            return 0;
        int flag = mode_flag(b + pos, sp - (b + pos));
        if (flag < 0)
            return 0;
        const unsigned char *name = sp + 1;
        const unsigned char *nul = memchr(name, 0, (b + n) - name);
        if (nul == NULL || (nul == name && !allow_empty_names))
            return 0;
        if ((b + n) - (nul + 1) < OID_BYTES)
            return 0;
        if (t->count >= entries_max || t->count >= room)
            return 0;
        Entry *e = &t->entries[t->count++];
        e->name = name;
        e->name_len = nul - name;
        e->oid = nul + 1;
        e->flag = flag;
        pos = (nul + 1 + OID_BYTES) - b;
    }
    return 1;
}

static void
tree_clear(Tree *t)
{
    Py_CLEAR(t->body);
    PyMem_Free(t->entries);
    PyMem_Free(t->slots);
    t->entries = NULL;
    t->slots = NULL;
    t->count = 0;
}

/* `fn(oid)` into t->body; it must answer bytes. */
static int
call_for_body(Tree *t, PyObject *fn, PyObject *oid)
{
    t->body = PyObject_CallOneArg(fn, oid);
    if (t->body == NULL)
        return -1;
    if (!PyBytes_Check(t->body)) {
        PyErr_Format(PyExc_TypeError, "%R must return bytes", fn);
        return -1;
    }
    return 0;
}

/* The entries of tree `oid`: `body(oid)`, or `unusual(oid)` when it is not in git's form. */
static int
tree_load(Tree *t, PyObject *oid, PyObject *body, PyObject *unusual, Py_ssize_t entries_max)
{
    memset(t, 0, sizeof(*t));
    if (call_for_body(t, body, oid) < 0)
        return -1;
    int parsed = parse_body(t, entries_max, 0);
    if (parsed != 0)
        return parsed > 0 ? 0 : -1;
    tree_clear(t);
    if (call_for_body(t, unusual, oid) < 0)
        return -1;
    parsed = parse_body(t, PY_SSIZE_T_MAX, 1);
    if (parsed == 0)
        PyErr_SetString(PyExc_ValueError, "unusual() answered a body not in git's form");
    return parsed > 0 ? 0 : -1;
}

static size_t
name_hash(const unsigned char *p, Py_ssize_t n)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return (size_t)h;
}

/* Index the entries by name; a repeated name keeps its last entry, as a dict would. */
static int
tree_index(Tree *t)
{
    size_t cap = 8;
    while (cap < (size_t)t->count * 2)
        cap <<= 1;
    t->slots = PyMem_Calloc(cap, sizeof(Py_ssize_t));
    if (t->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->mask = cap - 1;
    for (Py_ssize_t i = 0; i < t->count; i++) {
        const Entry *e = &t->entries[i];
        size_t s = name_hash(e->name, e->name_len) & t->mask;
        while (t->slots[s] != 0) {
            const Entry *o = &t->entries[t->slots[s] - 1];
            if (o->name_len == e->name_len && memcmp(o->name, e->name, e->name_len) == 0)
                break;
            s = (s + 1) & t->mask;
        }
        t->slots[s] = i + 1;
    }
    return 0;
}

static const Entry *
tree_find(const Tree *t, const Entry *want)
{
    size_t s = name_hash(want->name, want->name_len) & t->mask;
    while (t->slots[s] != 0) {
        const Entry *o = &t->entries[t->slots[s] - 1];
        if (o->name_len == want->name_len && memcmp(o->name, want->name, want->name_len) == 0)
            return o;
        s = (s + 1) & t->mask;
    }
    return NULL;
}

/* `items` without repeats, first occurrence kept: dict.fromkeys, linear in the count. */
static PyObject *
unique_tuple(PyObject *items)
{
    PyObject *seen = PyDict_New();
    if (seen == NULL)
        return NULL;
    PyObject *iter = PyObject_GetIter(items);
    PyObject *item;
    while (iter != NULL && (item = PyIter_Next(iter)) != NULL) {
        int rc = PyDict_SetDefault(seen, item, Py_None) == NULL ? -1 : 0;
        Py_DECREF(item);
        if (rc < 0)
            Py_CLEAR(iter);
    }
    PyObject *out = NULL;
    if (iter != NULL && !PyErr_Occurred()) {
        PyObject *keys = PyDict_Keys(seen);
        if (keys != NULL) {
            out = PyList_AsTuple(keys);
            Py_DECREF(keys);
        }
    }
    Py_XDECREF(iter);
    Py_DECREF(seen);
    return out;
}

typedef struct {
    PyObject *body, *unusual, *visit, *too_deep;
    Py_ssize_t depth_max, entries_max;
    PyObject *members; /* ordered: member -> first named as a tree (True), a blob, the commit */
    PyObject *diffed;  /* set of (tree, parent subtrees) already diffed */
    PyObject *stack;   /* list of (tree, parent subtrees, depth) */
} Walk;

/* The parents' subtrees at `e`'s name, without repeats, in parent order. */
static PyObject *
subtrees_below(const Tree *olds, Py_ssize_t n_olds, const Entry *e)
{
    if (n_olds == 1) { /* the usual commit: no repeats to drop */
        const Entry *o = tree_find(&olds[0], e);
        if (o == NULL || o->flag != FLAG_TREE)
            return PyTuple_New(0);
        PyObject *oid = PyBytes_FromStringAndSize((const char *)o->oid, OID_BYTES);
        if (oid == NULL)
            return NULL;
        PyObject *out = PyTuple_Pack(1, oid);
        Py_DECREF(oid);
        return out;
    }
    PyObject *found = PyList_New(0);
    if (found == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < n_olds; j++) {
        const Entry *o = tree_find(&olds[j], e);
        if (o == NULL || o->flag != FLAG_TREE)
            continue;
        PyObject *oid = PyBytes_FromStringAndSize((const char *)o->oid, OID_BYTES);
        if (oid == NULL || PyList_Append(found, oid) < 0) {
            Py_XDECREF(oid);
            Py_DECREF(found);
            return NULL;
        }
        Py_DECREF(oid);
    }
    PyObject *out = unique_tuple(found);
    Py_DECREF(found);
    return out;
}

/* `visit(oid, is_tree, current)` for entry `e`. */
static int
call_visit(Walk *w, PyObject *oid, const Entry *e, PyObject *current)
{
    PyObject *r = PyObject_CallFunctionObjArgs(
        w->visit, oid, e->flag == FLAG_TREE ? Py_True : Py_False, current, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* One changed entry of `current`: a member if new; a subtree to diff if a tree. A member
 * is kept with the type it was first named as (True a tree, False a blob, None the
 * commit); named again as another type, it is visited again, for the caller to refuse. */
static int
step_entry(Walk *w, PyObject *current, const Tree *olds, Py_ssize_t n_olds, const Entry *e,
           Py_ssize_t depth, PyObject *subtrees)
{
    PyObject *oid = PyBytes_FromStringAndSize((const char *)e->oid, OID_BYTES);
    if (oid == NULL)
        return -1;
    int rc = -1;
    PyObject *below = NULL, *key = NULL;
    PyObject *named_as = e->flag == FLAG_TREE ? Py_True : Py_False;
    PyObject *known = PyDict_GetItemWithError(w->members, oid); /* borrowed */
    if (known == NULL) {
        if (PyErr_Occurred() || PyDict_SetItem(w->members, oid, named_as) < 0)
            goto done;
    }
    if (known != named_as && call_visit(w, oid, e, current) < 0)
        goto done;
    if (e->flag != FLAG_TREE) {
        rc = 0;
        goto done;
    }
    below = subtrees_below(olds, n_olds, e);
    if (below == NULL)
        goto done;
    key = PyTuple_Pack(2, oid, below);
    if (key == NULL)
        goto done;
    int seen = PySet_Contains(w->diffed, key);
    if (seen < 0)
        goto done;
    if (seen) {
        rc = 0;
        goto done;
    }
    if (depth + 1 > w->depth_max) {
        PyObject *r = PyObject_CallFunction(w->too_deep, "nO", depth + 1, oid);
        if (r != NULL) {
            Py_DECREF(r);
            PyErr_SetString(PyExc_RuntimeError, "too_deep() must raise");
        }
        goto done;
    }
    if (PySet_Add(w->diffed, key) < 0)
        goto done;
    PyObject *item = Py_BuildValue("(OOn)", oid, below, depth + 1);
    if (item == NULL)
        goto done;
    rc = PyList_Append(subtrees, item);
    Py_DECREF(item);
done:
    Py_XDECREF(key);
    Py_XDECREF(below);
    Py_DECREF(oid);
    return rc;
}

/* Diff `current` against its parents' trees at the same path; push its changed subtrees. */
static int
step(Walk *w, PyObject *current, PyObject *parents, Py_ssize_t depth)
{
    Py_ssize_t n_olds = PyTuple_GET_SIZE(parents);
    Tree cur;
    Tree *olds = PyMem_Calloc(n_olds ? n_olds : 1, sizeof(Tree));
    PyObject *subtrees = PyList_New(0);
    int rc = -1;
    memset(&cur, 0, sizeof(cur));
    if (olds == NULL || subtrees == NULL) {
        if (olds == NULL)
            PyErr_NoMemory();
        goto done;
    }
    /* The parents first, as the reference reads them: the same tree fails first. */
    for (Py_ssize_t j = 0; j < n_olds; j++) {
        if (tree_load(&olds[j], PyTuple_GET_ITEM(parents, j), w->body, w->unusual,
                      w->entries_max) < 0 ||
            tree_index(&olds[j]) < 0)
            goto done;
    }
    if (tree_load(&cur, current, w->body, w->unusual, w->entries_max) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < cur.count; i++) {
        const Entry *e = &cur.entries[i];
        int same = 0, retyped = 0;
        for (Py_ssize_t j = 0; j < n_olds && !same; j++) {
            const Entry *o = tree_find(&olds[j], e);
            same = o != NULL && memcmp(o->oid, e->oid, OID_BYTES) == 0;
            retyped = same && o->flag != e->flag;
        }
        if (e->flag == FLAG_GITLINK)
            continue;
        if (same) {
            /* The parent names the same object here as another type (a mode of another
             * kind, the same id): not a member, but visited as named, for the caller to
             * refuse. */
            if (retyped) {
                PyObject *oid = PyBytes_FromStringAndSize((const char *)e->oid, OID_BYTES);
                int failed = oid == NULL || call_visit(w, oid, e, current) < 0;
                Py_XDECREF(oid);
                if (failed)
                    goto done;
            }
            continue;
        }
        if (step_entry(w, current, olds, n_olds, e, depth, subtrees) < 0)
            goto done;
    }
    for (Py_ssize_t i = PyList_GET_SIZE(subtrees) - 1; i >= 0; i--) {
        if (PyList_Append(w->stack, PyList_GET_ITEM(subtrees, i)) < 0)
            goto done;
    }
    rc = 0;
done:
    tree_clear(&cur);
    if (olds != NULL) {
        for (Py_ssize_t j = 0; j < n_olds; j++)
            tree_clear(&olds[j]);
        PyMem_Free(olds);
    }
    Py_XDECREF(subtrees);
    return rc;
}

static PyObject *
walk_commit(Walk *w, PyObject *commit, PyObject *tree, PyObject *parent_trees)
{
    if (PyDict_SetItem(w->members, commit, Py_None) < 0)
        return NULL;
    int unchanged = PySequence_Contains(parent_trees, tree);
    if (unchanged < 0)
        return NULL;
    if (unchanged)
        return PyDict_Keys(w->members);
    if (PyDict_SetItem(w->members, tree, Py_True) < 0)
        return NULL;
    PyObject *r = PyObject_CallFunctionObjArgs(w->visit, tree, Py_True, commit, NULL);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    PyObject *parents = unique_tuple(parent_trees);
    if (parents == NULL)
        return NULL;
    PyObject *first = PyTuple_Pack(2, tree, parents);
    PyObject *item = Py_BuildValue("(OOn)", tree, parents, (Py_ssize_t)0);
    Py_DECREF(parents);
    if (first == NULL || item == NULL || PySet_Add(w->diffed, first) < 0 ||
        PyList_Append(w->stack, item) < 0) {
        Py_XDECREF(first);
        Py_XDECREF(item);
        return NULL;
    }
    Py_DECREF(first);
    Py_DECREF(item);
    while (PyList_GET_SIZE(w->stack) > 0) {
        Py_ssize_t last = PyList_GET_SIZE(w->stack) - 1;
        PyObject *top = PyList_GET_ITEM(w->stack, last);
        Py_INCREF(top);
        if (PyList_SetSlice(w->stack, last, last + 1, NULL) < 0) {
            Py_DECREF(top);
            return NULL;
        }
        int rc = step(w, PyTuple_GET_ITEM(top, 0), PyTuple_GET_ITEM(top, 1),
                      PyLong_AsSsize_t(PyTuple_GET_ITEM(top, 2)));
        Py_DECREF(top);
        if (rc < 0)
            return NULL;
    }
    return PyDict_Keys(w->members);
}

PyDoc_STRVAR(segment_doc,
"segment(commit, tree, parent_trees, body, unusual, visit, too_deep, depth_max, entries_max)\n"
"--\n\n"
"The members of ``commit``'s segment in walk order (preorder, tree order), no\n"
"repeats; as enroute_core.engine.segments.commit_segment. ``body(oid)`` gives a\n"
"tree's body; ``unusual(oid)`` the same tree in git's own form when its body is\n"
"not (or has over ``entries_max`` entries), raising for a bad one;\n"
"``visit(oid, is_tree, via)`` is called once per member below the commit, and\n"
"again where a tree names a member, or the object its parent names at the same\n"
"path, as another type (for the caller to refuse);\n"
"``too_deep(depth, oid)`` raises for a subtree nested over ``depth_max``.");

static PyObject *
segment(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *commit, *tree, *parent_trees;
    Walk w;
    memset(&w, 0, sizeof(w));
    if (!PyArg_ParseTuple(args, "SSOOOOOnn:segment", &commit, &tree, &parent_trees, &w.body,
                          &w.unusual, &w.visit, &w.too_deep, &w.depth_max, &w.entries_max))
        return NULL;
    w.members = PyDict_New();
    w.diffed = PySet_New(NULL);
    w.stack = PyList_New(0);
    PyObject *out = NULL;
    if (w.members != NULL && w.diffed != NULL && w.stack != NULL)
        out = walk_commit(&w, commit, tree, parent_trees);
    Py_XDECREF(w.members);
    Py_XDECREF(w.diffed);
    Py_XDECREF(w.stack);
    return out;
}

static PyMethodDef methods[] = {
    {"segment", segment, METH_VARARGS, segment_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "enroute_native.segment_diff",
    "The segment diff of one commit over raw tree bodies.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit_segment_diff(void)
{
    return PyModule_Create(&module);
}
