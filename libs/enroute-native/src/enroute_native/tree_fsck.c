/*
 * Whether a tree is clean: one that git's fsck (fsck.c fsck_tree) finds nothing
 * in and that names no .gitmodules or .gitattributes, decided without a Python
 * object per entry.
 *
 * enroute_core.git.fsck.check_tree is the reference. This answers True only
 * for a tree the reference reads as the usual tree and finds no problem in:
 * every entry `MODE SP NAME NUL OID` with a mode git writes (40000, 100644,
 * 100755, 120000, 160000), a name of ASCII bytes without '/' that holds no '~'
 * or '\', is at most name_max bytes, is not '.' or '..' and, when it starts
 * with '.', does not start with '.git' in any case (every ASCII spelling of
 * '.git', '.gitmodules' and '.gitattributes' fsck knows (fsck.c
 * fsck_tree, path.c is_ntfs_dotgit and is_ntfs_dot_generic) starts with
 * '.git' in some case or holds '~' or '\': the NTFS short names GIT~1,
 * GITMOD~1, GI7EBA~1, GITATT~1, GI7D29~1; HFS+ spellings hold non-ASCII code
 * points; so a dotfile like '.keep' or '.github' is decided here); entries in
 * git's order (a tree's name compared as if it ended in '/') with no name
 * twice; no object id of zeros; at most entries_max entries. Anything else
 * answers False and the reference judges it, so this never finds a problem,
 * only that there is none.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define OID_BYTES 20

static int
mode_kind(const unsigned char *p, Py_ssize_t n)
{
    /* 1 a tree, 0 another mode git writes, -1 any other */
    if (n == 5 && memcmp(p, "40000", 5) == 0)
        return 1;
    if (n == 6 && (memcmp(p, "100644", 6) == 0 || memcmp(p, "100755", 6) == 0 ||
                   memcmp(p, "120000", 6) == 0 || memcmp(p, "160000", 6) == 0))
        return 0;
    return -1;
}

static int
plain_name(const unsigned char *name, Py_ssize_t n, Py_ssize_t name_max)
{
    if (n == 0 || n > name_max)
        return 0;
    if (name[0] == '.') {
        /* '.', '..' (hasDot, hasDotdot) and any '.git...' (hasDotgit, its NTFS tails, the
         * special blobs): the reference's. */
        if (n == 1 || (n == 2 && name[1] == '.'))
            return 0;
        if (n >= 4 && (name[1] | 0x20) == 'g' && (name[2] | 0x20) == 'i' && (name[3] | 0x20) == 't')
            return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = name[i];
        if (c >= 0x80 || c == '/' || c == '~' || c == '\\')
            return 0;
    }
    return 1;
}

/* <0, 0 or >0 as git orders (a, a_tree) against (b, b_tree): verify_ordered's keys. */
static int
git_order(const unsigned char *a, Py_ssize_t an, int a_tree, const unsigned char *b,
          Py_ssize_t bn, int b_tree)
{
    Py_ssize_t common = an < bn ? an : bn;
    int c = memcmp(a, b, (size_t)common);
    if (c != 0)
        return c;
    int ac = an > common ? a[common] : (a_tree ? '/' : -1);
    int bc = bn > common ? b[common] : (b_tree ? '/' : -1);
    if (ac != bc)
        return ac - bc;
    if (an == bn)
        return 0; /* the same key */
    /* one name ran out where the other's byte is '/': names hold none */
    return an < bn ? -1 : 1;
}

typedef struct {
    const unsigned char *name;
    Py_ssize_t len;
    int tree;
} Entry;

PyDoc_STRVAR(clean_doc,
"clean(body, entries_max, name_max)\n"
"--\n\n"
"True when the tree ``body`` is one fsck finds nothing in and that names no\n"
".gitmodules (see the module); False when the reference must judge it.");

/* The check, on entries parsed into ``entries`` (room for every entry the body can hold). */
static int
is_clean(const unsigned char *p, Py_ssize_t n, Py_ssize_t entries_max, Py_ssize_t name_max,
         Entry *entries)
{
    static const unsigned char zeros[OID_BYTES];
    Py_ssize_t pos = 0, count = 0;
    while (pos < n) {
        if (count >= entries_max)
            return 0;
        const unsigned char *space = memchr(p + pos, ' ', (size_t)(n - pos));
        if (space == NULL)
            return 0;
        int tree = mode_kind(p + pos, space - (p + pos));
        Py_ssize_t name_at = space - p + 1;
        const unsigned char *nul =
            name_at < n ? memchr(p + name_at, '\0', (size_t)(n - name_at)) : NULL;
        if (tree < 0 || nul == NULL || (nul - p) + 1 + OID_BYTES > n)
            return 0;
        Entry e = {p + name_at, nul - (p + name_at), tree};
        if (!plain_name(e.name, e.len, name_max) || memcmp(nul + 1, zeros, OID_BYTES) == 0)
            return 0;
        if (count > 0) {
            Entry *prev = &entries[count - 1];
            if (git_order(prev->name, prev->len, prev->tree, e.name, e.len, e.tree) >= 0)
                return 0;
        }
        if (tree) {
            /* A blob of the same name sorts before it, past names that extend it by bytes
             * below '/': all of them start with its name. */
            for (Py_ssize_t j = count - 1; j >= 0; j--) {
                Entry *o = &entries[j];
                if (o->len < e.len || memcmp(o->name, e.name, (size_t)e.len) != 0)
                    break;
                if (o->len == e.len)
                    return 0;
            }
        }
        entries[count++] = e;
        pos = (nul - p) + 1 + OID_BYTES;
    }
    return 1;
}

/* The shortest entry: a 5-byte mode, SP, a 1-byte name, NUL and the object id. */
#define ENTRY_BYTES_MIN (5 + 1 + 1 + 1 + OID_BYTES)
#define ENTRIES_ON_STACK 128

static PyObject *
clean(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer view;
    Py_ssize_t entries_max, name_max;
    if (!PyArg_ParseTuple(args, "y*nn:clean", &view, &entries_max, &name_max))
        return NULL;
    Entry local[ENTRIES_ON_STACK];
    Entry *entries = local;
    Py_ssize_t room = view.len / ENTRY_BYTES_MIN + 1;
    if (room > ENTRIES_ON_STACK) {
        entries = PyMem_Malloc((size_t)room * sizeof(Entry));
        if (entries == NULL) {
            PyBuffer_Release(&view);
            return PyErr_NoMemory();
        }
    }
    int ok = is_clean((const unsigned char *)view.buf, view.len, entries_max, name_max, entries);
    if (entries != local)
        PyMem_Free(entries);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"clean", clean, METH_VARARGS, clean_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "enroute_native.tree_fsck",
    "Whether a tree is one fsck finds nothing in.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit_tree_fsck(void)
{
    return PyModule_Create(&module);
}
