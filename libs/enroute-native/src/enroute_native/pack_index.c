/*
 * Index a whole pack in one call: every entry's object id, type, sizes, delta
 * base and depth (gitformat-pack, "Pack file entry", "Deltified
 * representation"; what git index-pack computes).
 *
 * enroute_core.git.packindexer.PackIndexer is the reference, and this is its
 * algorithm step for step: one pass in pack order, deltas applied when their
 * base is resolved and otherwise kept waiting under it (by entry or by oid)
 * and re-read when it arrives, depth first; bases outside the pack asked of
 * the caller after the pass, in the order first needed; bodies in an LRU
 * bounded in bytes, a base that fell out rebuilt along its chain. So objects
 * reach ``on_object`` in the reference's order.
 *
 * It reads only the usual pack. Anything the reference would judge (a header
 * it must parse, a size over a bound, a stream that does not inflate to its
 * size, a delta that does not apply, a base that is not an entry, a chain
 * too deep, a base nobody has) makes it give up and answer None: the caller
 * then runs the reference from the start, which raises the typed error. So
 * this code never decides that input is bad. Errors raised by the callbacks
 * (a typed error of on_object, of the caller's store, of the trailer check)
 * are the reference's own and pass through.
 *
 * I/O is the caller's: ``read_seq(offset, length)`` reads the pack in order,
 * from offset 0 to the entry region's end, a window at a time (the caller
 * hashes what it gives for the trailer); ``read_at`` re-reads an entry's
 * zlib bytes. Object ids are hashed with the caller's ``sha1`` (hashlib's).
 *
 * A full blob entry over ``stream_min`` is inflated through a fixed buffer and hashed
 * piece by piece, never held (git's index-pack does so above core.bigFileThreshold):
 * ``on_object`` gets None for its body, and it enters no cache. A delta on it rebuilds
 * it whole from the pack, as a base that fell out of the cache is.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "packfmt.h"

#define ENTRY_HEADER_BYTES_MAX 30
#define PACK_TRAILER_BYTES 20
#define OBJ_BLOB 3
#define NO_BASE (-1)
#define EXTERNAL_BASE (-2)
#define NONE (-1)
/* Bodies up to this size are hashed with their header joined: one call. */
#define HASH_JOIN_BYTES_MAX (64 * 1024)
/* An inflate starts with room for this much output (or the size, if less), then doubles. */
#define OUTPUT_BYTES_FIRST (1024 * 1024)
/* A streamed blob is inflated this much at a time (the reference's STREAM_PIECE_BYTES). */
#define STREAM_PIECE_BYTES (1024 * 1024)

enum { GAVE_UP = 0, DONE = 1, FAILED = -1 };

typedef struct {
    unsigned char oid[OID_BYTES];
    int head, tail; /* children waiting, linked through next[] */
    int live;
} OidWait;

typedef struct {
    int child;
    int base_type;
    int base_depth;
    PyObject *base_body; /* owned */
} Pending;

typedef struct Pipe Pipe;

typedef struct {
    /* the caller's */
    PyObject *read_seq, *read_at, *on_object, *sha1, *find;
    long long end;
    int count;
    unsigned long long size_max, object_bytes_max, free_bytes, ratio_max, stream_min;
    long depth_max;
    long long cache_max;
    Py_ssize_t window;
    /* result bytes the deltas read so far declare, and what the pack's size allows */
    unsigned long long declared, expansion_max;
    /* streamed: the pack is still arriving; ``end`` is a bound until read_seq answers short,
     * and the deltas may declare what the bytes read so far allow (free + ratio per byte) */
    int streamed;
    unsigned long long expansion_free, expansion_ratio;
    /* the sequential window */
    PyObject *win;
    long long win_start, read_pos;
    /* per entry, in pack order */
    int n;
    long long *offsets, *ends;
    unsigned long long *sizes, *object_sizes;
    int *hlens, *depths, *bases, *next;
    unsigned char *types, *entry_types, *has_base_oid;
    unsigned char *oids, *base_oids;
    /* oid -> first entry (index + 1; 0 empty) */
    int *by_oid;
    size_t by_oid_mask;
    /* waiting on an entry: lists by base index */
    int *wait_head, *wait_tail;
    /* waiting on an oid, in the order first needed; table: slot -> record + 1 */
    OidWait *waits;
    int waits_n, waits_cap;
    int *wait_table;
    size_t wait_mask;
    /* the LRU of bodies by entry */
    PyObject **bodies;
    int *lru_prev, *lru_next;
    int lru_head, lru_tail;
    long long cached;
    /* the settle stack */
    Pending *stack;
    int stack_n, stack_cap;
    int *scratch; /* one list reversed */
    /* the worker threads' queue (threads > 1), or NULL: all in the calling thread */
    Pipe *pipe;
    int ref_waits; /* REF_DELTA lookups that waited for queued tasks (pipe_serial) */
} Run;

static PyObject *str_update, *str_digest;
static const char *const type_names[] = {NULL, "commit", "tree", "blob", "tag"};

/* -- tables ------------------------------------------------------------------------------ */

static size_t
oid_hash(const unsigned char *oid)
{
    /* Keyed by the interpreter's randomised hash: a pack names base oids of its choice. */
    return (size_t)_Py_HashBytes(oid, OID_BYTES);
}

static size_t
table_size(int count)
{
    size_t size = 16;
    while (size < (size_t)count * 2 + 2)
        size <<= 1;
    return size;
}

static int
lookup_oid(Run *r, const unsigned char *oid)
{
    size_t i = oid_hash(oid) & r->by_oid_mask;
    for (;;) {
        int slot = r->by_oid[i];
        if (slot == 0)
            return NONE;
        if (memcmp(r->oids + (size_t)(slot - 1) * OID_BYTES, oid, OID_BYTES) == 0)
            return slot - 1;
        i = (i + 1) & r->by_oid_mask;
    }
}

/* Record ``index`` as the first entry of its oid; 0 when one came before. */
static int
insert_oid(Run *r, int index)
{
    const unsigned char *oid = r->oids + (size_t)index * OID_BYTES;
    size_t i = oid_hash(oid) & r->by_oid_mask;
    for (;;) {
        int slot = r->by_oid[i];
        if (slot == 0) {
            r->by_oid[i] = index + 1;
            return 1;
        }
        if (memcmp(r->oids + (size_t)(slot - 1) * OID_BYTES, oid, OID_BYTES) == 0)
            return 0;
        i = (i + 1) & r->by_oid_mask;
    }
}

static int
find_wait(Run *r, const unsigned char *oid, size_t *slot_out)
{
    size_t i = oid_hash(oid) & r->wait_mask;
    for (;;) {
        int slot = r->wait_table[i];
        if (slot == 0) {
            if (slot_out != NULL)
                *slot_out = i;
            return NONE;
        }
        if (memcmp(r->waits[slot - 1].oid, oid, OID_BYTES) == 0)
            return slot - 1;
        i = (i + 1) & r->wait_mask;
    }
}

/* Make ``*items`` (``*cap`` of ``size`` bytes each) hold at least ``need``, doubling. */
static int
grow(void **items, int *cap, int need, size_t size)
{
    if (need <= *cap)
        return DONE;
    int room = *cap ? *cap : 16;
    while (room < need)
        room *= 2;
    void *grown = PyMem_Realloc(*items, (size_t)room * size);
    if (grown == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    *items = grown;
    *cap = room;
    return DONE;
}

static int
wait_on_oid(Run *r, const unsigned char *oid, int child)
{
    size_t slot;
    int w = find_wait(r, oid, &slot);
    if (w == NONE) {
        if (grow((void **)&r->waits, &r->waits_cap, r->waits_n + 1, sizeof(OidWait)) != DONE)
            return FAILED;
        w = r->waits_n++;
        memcpy(r->waits[w].oid, oid, OID_BYTES);
        r->waits[w].head = r->waits[w].tail = NONE;
        r->waits[w].live = 1;
        r->wait_table[slot] = w + 1;
    }
    OidWait *rec = &r->waits[w];
    /* Each oid waits at most once: resolved, it is in by_oid and nothing waits on it again. */
    r->next[child] = NONE;
    if (rec->tail == NONE)
        rec->head = child;
    else
        r->next[rec->tail] = child;
    rec->tail = child;
    return DONE;
}

static void
wait_on_index(Run *r, int base, int child)
{
    r->next[child] = NONE;
    if (r->wait_tail[base] == NONE)
        r->wait_head[base] = child;
    else
        r->next[r->wait_tail[base]] = child;
    r->wait_tail[base] = child;
}

/* -- the body cache (the reference's _BaseCache, by entry) -------------------------------- */

static void
lru_unlink(Run *r, int i)
{
    int p = r->lru_prev[i], n = r->lru_next[i];
    if (p == NONE)
        r->lru_head = n;
    else
        r->lru_next[p] = n;
    if (n == NONE)
        r->lru_tail = p;
    else
        r->lru_prev[n] = p;
}

static void
lru_append(Run *r, int i)
{
    r->lru_prev[i] = r->lru_tail;
    r->lru_next[i] = NONE;
    if (r->lru_tail == NONE)
        r->lru_head = i;
    else
        r->lru_next[r->lru_tail] = i;
    r->lru_tail = i;
}

/* A borrowed reference to the cached body of entry ``i``, or NULL. */
static PyObject *
cache_get(Run *r, int i)
{
    PyObject *body = r->bodies[i];
    if (body != NULL && r->lru_tail != i) {
        lru_unlink(r, i);
        lru_append(r, i);
    }
    return body;
}

static void
cache_put(Run *r, int i, PyObject *body)
{
    long long size = (long long)PyBytes_GET_SIZE(body);
    if (size > r->cache_max || r->bodies[i] != NULL)
        return;
    r->cached += size;
    while (r->cached > r->cache_max && r->lru_head != NONE) {
        int old = r->lru_head;
        lru_unlink(r, old);
        r->cached -= (long long)PyBytes_GET_SIZE(r->bodies[old]);
        Py_CLEAR(r->bodies[old]);
    }
    Py_INCREF(body);
    r->bodies[i] = body;
    lru_append(r, i);
}

/* -- reading --------------------------------------------------------------------------------- */

static PyObject *
call_read(PyObject *fn, long long offset, long long length)
{
    PyObject *chunk = PyObject_CallFunction(fn, "LL", offset, length);
    if (chunk != NULL && (!PyBytes_Check(chunk) || PyBytes_GET_SIZE(chunk) != length)) {
        Py_DECREF(chunk);
        PyErr_SetString(PyExc_ValueError, "a pack read returned other than the bytes asked");
        return NULL;
    }
    return chunk;
}

/* A streamed pack's sequential read: at most ``length`` bytes and at least ``minimum``, fewer
 * only where the entry region ends (known once the body ended). */
static PyObject *
call_read_upto(PyObject *fn, long long offset, long long length, long long minimum)
{
    PyObject *chunk = PyObject_CallFunction(fn, "LLL", offset, length, minimum);
    if (chunk != NULL && (!PyBytes_Check(chunk) || PyBytes_GET_SIZE(chunk) > length)) {
        Py_DECREF(chunk);
        PyErr_SetString(PyExc_ValueError, "a pack read returned other than the bytes asked");
        return NULL;
    }
    return chunk;
}

/* Make the window hold [pos, pos + need), clipped to the entry region: the scanner's _fill. */
static int
fill(Run *r, long long pos, long long need)
{
    Py_ssize_t have = r->win == NULL ? 0 : PyBytes_GET_SIZE(r->win);
    long long buf_end = r->win_start + have;
    long long want_end = pos + need < r->end ? pos + need : r->end;
    if (pos >= r->win_start && want_end <= buf_end)
        return DONE;
    Py_ssize_t keep = (r->win_start <= pos && pos < buf_end) ? (Py_ssize_t)(buf_end - pos) : 0;
    long long start = pos + keep;
    if (start != r->read_pos)
        return GAVE_UP; /* not sequential: never for the usual pack */
    long long length = want_end - start > r->window ? want_end - start : r->window;
    if (length > r->end - start)
        length = r->end - start;
    /* Streamed, the read answers what has arrived: at least what is needed (no more than an
     * entry header's worth), or less where the entry region ends. */
    long long minimum = want_end - start < ENTRY_HEADER_BYTES_MAX ? want_end - start
                                                                  : ENTRY_HEADER_BYTES_MAX;
    PyObject *chunk = length > 0 ? (r->streamed ? call_read_upto(r->read_seq, start, length, minimum)
                                               : call_read(r->read_seq, start, length))
                                 : PyBytes_FromString("");
    if (chunk == NULL)
        return FAILED;
    if (PyBytes_GET_SIZE(chunk) < length) { /* streamed: what has arrived */
        length = PyBytes_GET_SIZE(chunk);
        if (length < minimum)
            r->end = start + length; /* the entry region ends here */
    }
    r->read_pos = start + length;
    if (keep > 0) {
        PyObject *joined = PyBytes_FromStringAndSize(NULL, keep + (Py_ssize_t)length);
        if (joined == NULL) {
            Py_DECREF(chunk);
            return FAILED;
        }
        memcpy(PyBytes_AS_STRING(joined), PyBytes_AS_STRING(r->win) + (have - keep), keep);
        memcpy(PyBytes_AS_STRING(joined) + keep, PyBytes_AS_STRING(chunk), (size_t)length);
        Py_DECREF(chunk);
        chunk = joined;
    }
    Py_XSETREF(r->win, chunk);
    r->win_start = pos;
    return DONE;
}

/* The output a stream of ``size`` bytes may reach once ``fed`` input bytes went in: the
 * size, or past the free bytes the zlib-bomb ratio's cap (the reference's rule). */
static unsigned long long
output_cap(const Run *r, unsigned long long size, unsigned long long fed)
{
    if (size <= r->free_bytes || !r->ratio_max)
        return size;
    if (fed >= (size - r->free_bytes) / r->ratio_max + 1)
        return size;
    unsigned long long ratio_cap = r->free_bytes + r->ratio_max * fed;
    return ratio_cap < size ? ratio_cap : size;
}

/*
 * Inflate the zlib stream at ``pos`` to exactly ``size`` bytes into a new bytes object.
 * Sequential reads go through the window; otherwise through read_at, at most a window a
 * time, up to ``stop``. ``*used`` is the stream's length. The reference's zlib-bomb rule
 * (past free_bytes, output at most ratio_max times the input so far) is checked here
 * after every step; where it would judge, this gives up.
 */
static int
inflate_stream(Run *r, long long pos, long long stop, unsigned long long size, int sequential,
               PyObject **out, long long *used)
{
    *out = NULL;
    if (size >= (unsigned long long)UINT_MAX || size >= (unsigned long long)PY_SSIZE_T_MAX)
        return GAVE_UP;
    /* The output grows as it comes: a declared size may be a lie. */
    Py_ssize_t room = size + 1 < OUTPUT_BYTES_FIRST ? (Py_ssize_t)size + 1 : OUTPUT_BYTES_FIRST;
    PyObject *data = PyBytes_FromStringAndSize(NULL, room);
    if (data == NULL)
        return FAILED;
    z_stream zs;
    memset(&zs, 0, sizeof(zs));
    if (inflateInit(&zs) != Z_OK) {
        Py_DECREF(data);
        PyErr_SetString(PyExc_MemoryError, "zlib could not start an inflate");
        return FAILED;
    }
    int status = GAVE_UP;
    long long at = pos;
    PyObject *chunk = NULL;
    for (;;) {
        const unsigned char *in = NULL;
        long long avail;
        if (sequential) {
            if (at >= r->end)
                break; /* the stream does not end in the region */
            if (at >= r->win_start + PyBytes_GET_SIZE(r->win)) {
                int filled = fill(r, at, r->window);
                if (filled != DONE) {
                    status = filled;
                    break;
                }
            }
            avail = r->win_start + PyBytes_GET_SIZE(r->win) - at;
            in = (const unsigned char *)PyBytes_AS_STRING(r->win) + (at - r->win_start);
        }
        else {
            avail = stop - at < r->window ? stop - at : r->window;
            if (avail > 0) {
                Py_XSETREF(chunk, call_read(r->read_at, at, avail));
                if (chunk == NULL) {
                    status = FAILED;
                    break;
                }
                in = (const unsigned char *)PyBytes_AS_STRING(chunk);
            }
        }
        if (avail <= 0 || avail > (long long)UINT_MAX)
            break;
        unsigned long long cap = output_cap(r, size, (unsigned long long)(at + avail - pos));
        if ((Py_ssize_t)zs.total_out == room && (unsigned long long)room <= cap) {
            room = (unsigned long long)room * 2 > cap + 1 ? (Py_ssize_t)cap + 1 : room * 2;
            if (_PyBytes_Resize(&data, room) < 0) {
                status = FAILED;
                break;
            }
        }
        zs.next_out = (unsigned char *)PyBytes_AS_STRING(data) + zs.total_out;
        zs.next_in = (unsigned char *)in;
        zs.avail_in = (uInt)avail;
        zs.avail_out = (uInt)((unsigned long long)room < cap + 1 ? (unsigned long long)room - zs.total_out
                                                                   : cap + 1 - zs.total_out);
        int ret;
        if (size >= UNLOCKED_BYTES_MIN) {
            Py_BEGIN_ALLOW_THREADS
            ret = inflate(&zs, Z_NO_FLUSH);
            Py_END_ALLOW_THREADS
        }
        else
            ret = inflate(&zs, Z_NO_FLUSH);
        at += avail - (long long)zs.avail_in;
        if ((unsigned long long)zs.total_out > cap)
            break; /* past the size, or a zlib bomb: the reference judges */
        if (ret == Z_STREAM_END) {
            if (zs.total_out == size)
                status = DONE;
            break;
        }
        if (ret != Z_OK)
            break;
    }
    Py_XDECREF(chunk);
    inflateEnd(&zs);
    if (status != DONE) {
        Py_XDECREF(data);
        return status;
    }
    if (_PyBytes_Resize(&data, (Py_ssize_t)size) < 0)
        return FAILED;
    *out = data;
    *used = at - pos;
    return DONE;
}

/* An entry's inflated data again (a full entry's body, a delta's delta). */
static int
reload(Run *r, int i, PyObject **out)
{
    long long used;
    long long start = r->offsets[i] + r->hlens[i];
    /* The stream the pass read, read again: it ends where it ended then. */
    return inflate_stream(r, start, r->ends[i], r->sizes[i], 0, out, &used);
}

/* -- deltas (enroute_core.git.delta: git's patch-delta.c checks) -------------------------- */

static int
read_size(const unsigned char *d, Py_ssize_t n, Py_ssize_t *pos, unsigned long long *value)
{
    unsigned long long v = 0;
    int shift = 0;
    for (;;) {
        if (*pos >= n || shift > 56) /* nine bytes hold 63 bits; a longer size is judged there */
            return 0;
        unsigned char byte = d[(*pos)++];
        v |= (unsigned long long)(byte & 0x7F) << shift;
        if (!(byte & 0x80))
            break;
        shift += 7;
    }
    *value = v;
    return 1;
}

/* A delta's header checked against its base before anything is written (_check_header):
 * DONE with the result's size and where the instructions start, or GAVE_UP. */
static int
delta_header(const Run *r, const unsigned char *d, Py_ssize_t n, Py_ssize_t base_len,
             unsigned long long *dst_size_out, Py_ssize_t *pos_out)
{
    Py_ssize_t pos = 0;
    unsigned long long src_size, dst_size;
    if (n < 4 || !read_size(d, n, &pos, &src_size) || !read_size(d, n, &pos, &dst_size))
        return GAVE_UP;
    if (src_size != (unsigned long long)base_len || dst_size > r->object_bytes_max ||
        dst_size >= (unsigned long long)PY_SSIZE_T_MAX)
        return GAVE_UP;
    /* No output sized from a lie: what the instructions could ever write (_check_header). */
    unsigned long long rest = (unsigned long long)(n - pos);
    if (dst_size > rest * 0x7F) {
        unsigned long long per_byte = src_size > 0x7F ? src_size : 0x7F;
        if (per_byte > 0xFFFFFF)
            per_byte = 0xFFFFFF;
        if (dst_size > rest * per_byte)
            return GAVE_UP;
    }
    *dst_size_out = dst_size;
    *pos_out = pos;
    return DONE;
}

/* The instructions ``d[pos:n]`` applied to ``base`` (``src_size`` bytes) into ``dst``: 1 when
 * they write exactly ``dst_size`` bytes as git's patch-delta.c allows, 0 otherwise. No
 * Python object: a worker thread runs it without the interpreter lock. */
static int
apply_raw(const unsigned char *base, unsigned long long src_size, const unsigned char *d,
          Py_ssize_t n, Py_ssize_t pos, unsigned char *dst, unsigned long long dst_size)
{
    unsigned long long written = 0;
    while (pos < n) {
        unsigned char op = d[pos++];
        if (op & 0x80) {
            unsigned long long offset = 0, length = 0;
            for (int b = 0; b < 4; b++) {
                if (op & (1 << b)) {
                    if (pos >= n)
                        return 0;
                    offset |= (unsigned long long)d[pos++] << (8 * b);
                }
            }
            for (int b = 0; b < 3; b++) {
                if (op & (0x10 << b)) {
                    if (pos >= n)
                        return 0;
                    length |= (unsigned long long)d[pos++] << (8 * b);
                }
            }
            if (length == 0)
                length = 0x10000;
            if (offset + length > src_size || length > dst_size - written)
                return 0;
            memcpy(dst + written, base + offset, (size_t)length);
            written += length;
        }
        else if (op) {
            if ((Py_ssize_t)op > n - pos || op > dst_size - written)
                return 0;
            memcpy(dst + written, d + pos, op);
            pos += op;
            written += op;
        }
        else
            return 0;
    }
    return written == dst_size;
}

static int
apply_delta(Run *r, PyObject *base_obj, PyObject *delta_obj, PyObject **out)
{
    *out = NULL;
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(delta_obj);
    Py_ssize_t base_len = PyBytes_GET_SIZE(base_obj), n = PyBytes_GET_SIZE(delta_obj), pos;
    unsigned long long dst_size;
    if (delta_header(r, d, n, base_len, &dst_size, &pos) != DONE)
        return GAVE_UP;
    PyObject *target = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)dst_size);
    if (target == NULL)
        return FAILED;
    if (!apply_raw((const unsigned char *)PyBytes_AS_STRING(base_obj),
                   (unsigned long long)base_len, d, n, pos,
                   (unsigned char *)PyBytes_AS_STRING(target), dst_size)) {
        Py_DECREF(target);
        return GAVE_UP;
    }
    *out = target;
    return DONE;
}

/* -- resolution ------------------------------------------------------------------------------ */

static int
hash_object(Run *r, int type_num, PyObject *body, unsigned char *oid)
{
    char head[40];
    Py_ssize_t size = PyBytes_GET_SIZE(body);
    int hlen = snprintf(head, sizeof(head), "%s %zd", type_names[type_num], size) + 1;
    PyObject *sha;
    if (size <= HASH_JOIN_BYTES_MAX) {
        PyObject *joined = PyBytes_FromStringAndSize(NULL, hlen + size);
        if (joined == NULL)
            return FAILED;
        memcpy(PyBytes_AS_STRING(joined), head, (size_t)hlen);
        memcpy(PyBytes_AS_STRING(joined) + hlen, PyBytes_AS_STRING(body), (size_t)size);
        sha = PyObject_CallOneArg(r->sha1, joined);
        Py_DECREF(joined);
        if (sha == NULL)
            return FAILED;
    }
    else {
        PyObject *prefix = PyBytes_FromStringAndSize(head, hlen);
        if (prefix == NULL)
            return FAILED;
        sha = PyObject_CallOneArg(r->sha1, prefix);
        Py_DECREF(prefix);
        if (sha == NULL)
            return FAILED;
        PyObject *none = PyObject_CallMethodOneArg(sha, str_update, body);
        if (none == NULL) {
            Py_DECREF(sha);
            return FAILED;
        }
        Py_DECREF(none);
    }
    PyObject *digest = PyObject_CallMethodNoArgs(sha, str_digest);
    Py_DECREF(sha);
    if (digest == NULL)
        return FAILED;
    if (!PyBytes_Check(digest) || PyBytes_GET_SIZE(digest) != OID_BYTES) {
        Py_DECREF(digest);
        PyErr_SetString(PyExc_ValueError, "sha1 gave other than 20 bytes");
        return FAILED;
    }
    memcpy(oid, PyBytes_AS_STRING(digest), OID_BYTES);
    Py_DECREF(digest);
    return DONE;
}

/*
 * Inflate the blob at ``pos`` through the window and hash it a piece at a time into
 * ``oid``, never holding it (the reference's PackScanner._inflate with a sink); ``*used``
 * is the stream's length. The zlib-bomb rule is inflate_stream's; where the reference
 * would judge, this gives up.
 */
static int
hash_streamed(Run *r, long long pos, unsigned long long size, unsigned char *oid, long long *used)
{
    if (size >= (unsigned long long)PY_SSIZE_T_MAX)
        return GAVE_UP;
    char head[40];
    int hlen = snprintf(head, sizeof(head), "blob %llu", size) + 1;
    PyObject *prefix = PyBytes_FromStringAndSize(head, hlen);
    if (prefix == NULL)
        return FAILED;
    PyObject *sha = PyObject_CallOneArg(r->sha1, prefix);
    Py_DECREF(prefix);
    if (sha == NULL)
        return FAILED;
    unsigned char *piece = PyMem_Malloc(STREAM_PIECE_BYTES);
    if (piece == NULL) {
        Py_DECREF(sha);
        PyErr_NoMemory();
        return FAILED;
    }
    z_stream zs;
    memset(&zs, 0, sizeof(zs));
    if (inflateInit(&zs) != Z_OK) {
        PyMem_Free(piece);
        Py_DECREF(sha);
        PyErr_SetString(PyExc_MemoryError, "zlib could not start an inflate");
        return FAILED;
    }
    int status = GAVE_UP, ended = 0;
    long long at = pos;
    while (!ended && status == GAVE_UP) {
        if (at >= r->end)
            break; /* the stream does not end in the region */
        if (at >= r->win_start + PyBytes_GET_SIZE(r->win)) {
            int filled = fill(r, at, r->window);
            if (filled != DONE) {
                status = filled;
                break;
            }
        }
        long long avail = r->win_start + PyBytes_GET_SIZE(r->win) - at;
        if (avail <= 0 || avail > (long long)UINT_MAX)
            break;
        unsigned long long cap = output_cap(r, size, (unsigned long long)(at + avail - pos));
        zs.next_in = (unsigned char *)PyBytes_AS_STRING(r->win) + (at - r->win_start);
        zs.avail_in = (uInt)avail;
        int ret;
        /* A full piece may leave input unread or output pending in zlib: go on. */
        do {
            unsigned long long room = cap + 1 - zs.total_out; /* total_out <= cap here */
            if (room > STREAM_PIECE_BYTES)
                room = STREAM_PIECE_BYTES;
            zs.next_out = piece;
            zs.avail_out = (uInt)room;
            Py_BEGIN_ALLOW_THREADS
            ret = inflate(&zs, Z_NO_FLUSH);
            Py_END_ALLOW_THREADS
            if ((unsigned long long)zs.total_out > cap) {
                ret = Z_DATA_ERROR; /* past the size, or a zlib bomb: the reference judges */
                break;
            }
            size_t produced = (size_t)room - zs.avail_out;
            if (produced) {
                PyObject *view = PyMemoryView_FromMemory((char *)piece, (Py_ssize_t)produced,
                                                         PyBUF_READ);
                PyObject *none = view == NULL ? NULL
                                              : PyObject_CallMethodOneArg(sha, str_update, view);
                Py_XDECREF(view);
                if (none == NULL) {
                    status = FAILED;
                    break;
                }
                Py_DECREF(none);
            }
        } while (ret == Z_OK && zs.avail_out == 0);
        at = (long long)((const unsigned char *)zs.next_in -
                         (const unsigned char *)PyBytes_AS_STRING(r->win)) + r->win_start;
        if (status == FAILED)
            break;
        if (ret == Z_STREAM_END) {
            ended = 1;
            if (zs.total_out == size)
                status = DONE;
        }
        else if (ret != Z_OK && ret != Z_BUF_ERROR)
            break;
    }
    inflateEnd(&zs);
    PyMem_Free(piece);
    if (status == DONE) {
        PyObject *digest = PyObject_CallMethodNoArgs(sha, str_digest);
        if (digest == NULL)
            status = FAILED;
        else if (!PyBytes_Check(digest) || PyBytes_GET_SIZE(digest) != OID_BYTES) {
            PyErr_SetString(PyExc_ValueError, "sha1 gave other than 20 bytes");
            status = FAILED;
        }
        else
            memcpy(oid, PyBytes_AS_STRING(digest), OID_BYTES);
        Py_XDECREF(digest);
    }
    Py_DECREF(sha);
    *used = at - pos;
    return status;
}

/*
 * Store what entry ``index`` resolved to (the reference's _record); ``*waiting`` gets the
 * head of the deltas that waited on it, linked through next[]: by entry, then by oid.
 * ``body`` NULL: a streamed blob, its oid and size already recorded (hash_streamed).
 * ``hashed``: its oid is in oids[] already (a worker hashed it).
 */
static int
record(Run *r, int index, int type_num, PyObject *body, int depth, int hashed, int *waiting)
{
    *waiting = NONE;
    if (depth) {
        if (depth > r->depth_max)
            return GAVE_UP;
        int base = r->bases[index];
        if (base >= 0) {
            memcpy(r->base_oids + (size_t)index * OID_BYTES, r->oids + (size_t)base * OID_BYTES,
                   OID_BYTES);
            r->has_base_oid[index] = 1;
        }
    }
    unsigned char *oid = r->oids + (size_t)index * OID_BYTES;
    if (body != NULL) {
        if (!hashed && hash_object(r, type_num, body, oid) != DONE)
            return FAILED;
        r->object_sizes[index] = (unsigned long long)PyBytes_GET_SIZE(body);
        cache_put(r, index, body);
    }
    r->types[index] = (unsigned char)type_num;
    r->depths[index] = depth;
    if (r->on_object != Py_None) {
        PyObject *args[4];
        args[0] = PyLong_FromLong(index);
        args[1] = PyBytes_FromStringAndSize((const char *)oid, OID_BYTES);
        args[2] = PyLong_FromLong(type_num);
        args[3] = body != NULL ? body : Py_None;
        PyObject *got = NULL;
        if (args[0] != NULL && args[1] != NULL)
            got = PyObject_Vectorcall(r->on_object, args, 4, NULL);
        Py_XDECREF(args[0]);
        Py_XDECREF(args[1]);
        if (got == NULL)
            return FAILED;
        Py_DECREF(got);
    }
    int head = r->wait_head[index], tail = r->wait_tail[index];
    r->wait_head[index] = r->wait_tail[index] = NONE;
    if (insert_oid(r, index) && r->waits_n) {
        int w = find_wait(r, oid, NULL);
        if (w != NONE && r->waits[w].live) {
            OidWait *rec = &r->waits[w];
            rec->live = 0;
            for (int c = rec->head; c != NONE; c = r->next[c])
                r->bases[c] = index;
            if (head == NONE)
                head = rec->head;
            else
                r->next[tail] = rec->head;
        }
    }
    *waiting = head;
    return DONE;
}

/* Push the children of list ``head`` so that the first is popped first. */
static int
push_children(Run *r, int head, int base_type, PyObject *base_body, int base_depth)
{
    int k = 0;
    for (int c = head; c != NONE; c = r->next[c])
        r->scratch[k++] = c; /* a child is in one list: k <= count */
    if (grow((void **)&r->stack, &r->stack_cap, r->stack_n + k, sizeof(Pending)) != DONE)
        return FAILED;
    while (k > 0) {
        Pending *p = &r->stack[r->stack_n++];
        p->child = r->scratch[--k];
        p->base_type = base_type;
        p->base_depth = base_depth;
        Py_INCREF(base_body);
        p->base_body = base_body;
    }
    return DONE;
}

/* Record a resolved entry, then every delta waiting on it, depth first (_settle). */
static int
settle_as(Run *r, int index, int type_num, PyObject *body, int depth, int hashed)
{
    int waiting;
    int status = record(r, index, type_num, body, depth, hashed, &waiting);
    if (status != DONE || waiting == NONE)
        return status;
    PyObject *loaded = NULL;
    if (body == NULL) { /* a streamed blob that deltas waited on: they need it whole */
        status = reload(r, index, &loaded);
        if (status != DONE)
            return status;
        body = loaded;
    }
    int floor = r->stack_n;
    status = push_children(r, waiting, type_num, body, depth);
    Py_XDECREF(loaded);
    while (status == DONE && r->stack_n > floor) {
        Pending p = r->stack[--r->stack_n];
        PyObject *delta, *target = NULL;
        status = reload(r, p.child, &delta);
        if (status == DONE) {
            status = apply_delta(r, p.base_body, delta, &target);
            Py_DECREF(delta);
        }
        if (status == DONE)
            status = record(r, p.child, p.base_type, target, p.base_depth + 1, 0, &waiting);
        if (status == DONE && waiting != NONE)
            status = push_children(r, waiting, p.base_type, target, p.base_depth + 1);
        Py_XDECREF(target);
        Py_DECREF(p.base_body);
    }
    while (r->stack_n > floor)
        Py_DECREF(r->stack[--r->stack_n].base_body);
    return status;
}

static int
settle(Run *r, int index, int type_num, PyObject *body, int depth)
{
    return settle_as(r, index, type_num, body, depth, 0);
}

/* (type, body) of an oid outside the pack from the caller's store; GAVE_UP when absent. */
static int
find_external(Run *r, const unsigned char *oid, int *type_num, PyObject **body)
{
    PyObject *key = PyBytes_FromStringAndSize((const char *)oid, OID_BYTES);
    if (key == NULL)
        return FAILED;
    PyObject *found = PyObject_CallOneArg(r->find, key);
    Py_DECREF(key);
    if (found == NULL)
        return FAILED;
    if (found == Py_None) {
        Py_DECREF(found);
        return GAVE_UP;
    }
    long t;
    PyObject *b;
    if (!PyArg_ParseTuple(found, "lO!", &t, &PyBytes_Type, &b) || t < 1 || t > 4) {
        Py_DECREF(found);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "an external base is not (type, body)");
        return FAILED;
    }
    Py_INCREF(b);
    Py_DECREF(found);
    *type_num = (int)t;
    *body = b;
    return DONE;
}

/* The body of a resolved entry that fell out of the cache, rebuilt along its chain (_body). */
static int
rebuild(Run *r, int index, PyObject **out)
{
    *out = NULL;
    int k = 0, i = index, status;
    PyObject *body = NULL;
    for (;;) {
        int base = r->bases[i];
        if (base == NO_BASE) {
            status = reload(r, i, &body);
            if (status != DONE)
                return status;
            break;
        }
        r->scratch[k++] = i;
        if (base == EXTERNAL_BASE) {
            int type_num;
            status = find_external(r, r->base_oids + (size_t)i * OID_BYTES, &type_num, &body);
            if (status != DONE)
                return status;
            break;
        }
        i = base;
        PyObject *cached = cache_get(r, i);
        if (cached != NULL) {
            Py_INCREF(cached);
            body = cached;
            break;
        }
    }
    while (k > 0) {
        PyObject *delta, *target;
        status = reload(r, r->scratch[--k], &delta);
        if (status == DONE) {
            status = apply_delta(r, body, delta, &target);
            Py_DECREF(delta);
        }
        Py_DECREF(body);
        if (status != DONE)
            return status;
        body = target;
    }
    cache_put(r, index, body);
    *out = body;
    return DONE;
}

/* -- worker threads ----------------------------------------------------------------------------
 *
 * With ``threads`` > 1 the pass hands the per-object work that needs no Python (applying a
 * delta to its base, hashing the body) to threads - 1 workers, which run without the
 * interpreter lock (git's index-pack resolves deltas in threads). The calling thread still
 * reads and inflates in pack order, charges each delta, and records every object in the
 * order the one-thread pass does: a task is delivered (recorded, ``on_object`` called,
 * what waited on it settled) strictly in the order it was queued, and before anything is
 * decided that a delivery could change (a REF_DELTA's lookup by oid, a base that is
 * neither resolved nor queued, a streamed blob, the end of the pass) every queued task is
 * delivered first. So the objects, their order and the result are the one-thread pass's.
 * Only an entry whose base is resolved or queued, and a full entry, are queued; a worker
 * whose base is another task's waits for it (tasks are claimed in queue order, so the
 * base's is claimed first). The queue holds at most TASKS_MAX tasks and about a quarter
 * of ``cache_max`` bytes of their data, results and bases (at least one task).
 *
 * The workers hash with OpenSSL's SHA-1 through the library hashlib itself loaded
 * (looked up in ``_hashlib``'s module, whose dependency it is; nothing for the build to
 * find); where it cannot be found, the pass runs in the calling thread alone.
 */

#define TASKS_MAX 256 /* a power of two */
#define THREADS_MAX 64
#define PIPE_SHARE 4 /* the queue's bytes: cache_max / PIPE_SHARE */
#define REF_WAITS_MIN 64 /* pipe_serial: REF_DELTA lookups that waited, at least */
#define REF_WAIT_SHARE 8 /* pipe_serial: and more than one entry in this many */
/* An idle worker is woken once this many tasks wait, or when the calling thread waits for
 * one: a wake-up per task cost more CPU than the work it handed over. */
#define WAKE_TASKS 16
enum { TASK_QUEUED = 0, TASK_DONE = 1, TASK_BAD = 2 };

typedef struct {
    int index, type_num, depth;
    int wait_for;   /* the entry whose task makes the base, or NONE */
    PyObject *data; /* owned: the entry's inflated bytes (a body, or a delta) */
    PyObject *base; /* owned: a delta's base body (a task's result, possibly not made yet) */
    PyObject *out;  /* owned: the body (``data`` for a full entry; a delta's, written by a worker) */
    Py_ssize_t pos; /* a delta's first instruction */
    long long bytes;
    unsigned char oid[OID_BYTES];
    int state;
} Task;

struct Pipe {
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    pthread_t threads[THREADS_MAX];
    int started, idle, waiting, stop; /* under lock */
    Task *ring;
    int head, claimed, tail; /* queue positions; claimed and tail under lock */
    long long bytes, bytes_max; /* the calling thread's */
    unsigned char *ready; /* per entry: its task's state (under lock) */
    int *task_of;         /* per entry: its queue position + 1 while queued (calling thread) */
};

typedef void *(*md_fetch_fn)(void *, const char *, const char *);
typedef void *(*ctx_new_fn)(void);
typedef void (*ctx_free_fn)(void *);
typedef int (*digest_init_fn)(void *, const void *, const void *);
typedef int (*digest_update_fn)(void *, const void *, size_t);
typedef int (*digest_final_fn)(void *, unsigned char *, unsigned int *);

static struct {
    int tried;
    void *md; /* OpenSSL's EVP_MD for SHA-1, fetched once (thread-safe to share) */
    ctx_new_fn ctx_new;
    ctx_free_fn ctx_free;
    digest_init_fn init;
    digest_update_fn update;
    digest_final_fn final;
} evp;

static void *
symbol(void *handle, const char *name)
{
    return dlsym(handle, name);
}

/* Whether the workers can hash: OpenSSL 3's EVP calls, from the copy hashlib loaded. */
static int
load_sha1(void)
{
    if (evp.tried)
        return evp.md != NULL;
    evp.tried = 1;
    PyObject *mod = PyImport_ImportModule("_hashlib");
    PyObject *file = mod == NULL ? NULL : PyObject_GetAttrString(mod, "__file__");
    const char *path = file != NULL && PyUnicode_Check(file) ? PyUnicode_AsUTF8(file) : NULL;
    void *handle = path == NULL ? NULL : dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    Py_XDECREF(file);
    Py_XDECREF(mod);
    PyErr_Clear();
    if (handle == NULL)
        return 0;
    md_fetch_fn fetch;
    *(void **)&fetch = symbol(handle, "EVP_MD_fetch");
    *(void **)&evp.ctx_new = symbol(handle, "EVP_MD_CTX_new");
    *(void **)&evp.ctx_free = symbol(handle, "EVP_MD_CTX_free");
    *(void **)&evp.init = symbol(handle, "EVP_DigestInit_ex2");
    *(void **)&evp.update = symbol(handle, "EVP_DigestUpdate");
    *(void **)&evp.final = symbol(handle, "EVP_DigestFinal_ex");
    if (fetch == NULL || evp.ctx_new == NULL || evp.ctx_free == NULL || evp.init == NULL ||
        evp.update == NULL || evp.final == NULL)
        return 0; /* the handle stays open: the library is hashlib's, loaded for good */
    evp.md = fetch(NULL, "SHA1", NULL);
    return evp.md != NULL;
}

/* sha1(b"<type> <size>\0" + body) into ``oid`` (hash_object's), without Python: 1 when done. */
static int
hash_raw(void *ctx, int type_num, const unsigned char *body, size_t size, unsigned char *oid)
{
    char head[40];
    int hlen = snprintf(head, sizeof(head), "%s %zu", type_names[type_num], size) + 1;
    unsigned int length = 0;
    return ctx != NULL && evp.init(ctx, evp.md, NULL) == 1 &&
           evp.update(ctx, head, (size_t)hlen) == 1 && evp.update(ctx, body, size) == 1 &&
           evp.final(ctx, oid, &length) == 1 && length == OID_BYTES;
}

static void *
work(void *arg)
{
    Pipe *p = arg;
    void *ctx = evp.ctx_new();
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        if (p->claimed == p->tail) {
            p->idle++;
            pthread_cond_wait(&p->work, &p->lock);
            p->idle--;
            continue;
        }
        Task *t = &p->ring[p->claimed++ & (TASKS_MAX - 1)];
        while (t->wait_for != NONE && p->ready[t->wait_for] == TASK_QUEUED && !p->stop) {
            p->waiting++;
            pthread_cond_wait(&p->done, &p->lock);
            p->waiting--;
        }
        int ok = t->wait_for == NONE || p->ready[t->wait_for] == TASK_DONE;
        pthread_mutex_unlock(&p->lock);
        /* The task's objects stay alive and unresized until it is delivered or dropped,
         * which waits for its state: only their bytes are read and written here. */
        unsigned char *out = (unsigned char *)PyBytes_AS_STRING(t->out);
        size_t size = (size_t)PyBytes_GET_SIZE(t->out);
        if (ok && t->base != NULL)
            ok = apply_raw((const unsigned char *)PyBytes_AS_STRING(t->base),
                           (unsigned long long)PyBytes_GET_SIZE(t->base),
                           (const unsigned char *)PyBytes_AS_STRING(t->data),
                           PyBytes_GET_SIZE(t->data), t->pos, out, size);
        if (ok)
            ok = hash_raw(ctx, t->type_num, out, size, t->oid);
        pthread_mutex_lock(&p->lock);
        t->state = ok ? TASK_DONE : TASK_BAD;
        p->ready[t->index] = (unsigned char)t->state;
        if (p->waiting)
            pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->lock);
    if (ctx != NULL)
        evp.ctx_free(ctx);
    return NULL;
}

/* The cores this process may run on: workers past that would only take turns. */
static int
cores_usable(void)
{
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
#endif
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? (int)online : 1;
}

/* Start threads - 1 workers (at most one thread per usable core); with none (or no SHA-1
 * to give them), the pass stays serial. */
static int
pipe_start(Run *r, int threads)
{
    int cores = cores_usable();
    if (threads > cores)
        threads = cores;
    if (threads <= 1 || r->count < 2 || !load_sha1())
        return DONE;
    if (threads > THREADS_MAX)
        threads = THREADS_MAX;
    Pipe *p = PyMem_Calloc(1, sizeof(Pipe));
    if (p == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    p->ring = PyMem_Calloc(TASKS_MAX, sizeof(Task));
    p->ready = PyMem_Calloc((size_t)r->count, 1);
    p->task_of = PyMem_Calloc((size_t)r->count, sizeof(int));
    if (p->ring == NULL || p->ready == NULL || p->task_of == NULL) {
        PyMem_Free(p->ring);
        PyMem_Free(p->ready);
        PyMem_Free(p->task_of);
        PyMem_Free(p);
        PyErr_NoMemory();
        return FAILED;
    }
    p->bytes_max = r->cache_max / PIPE_SHARE;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 0; i < threads - 1; i++) {
        if (pthread_create(&p->threads[p->started], NULL, work, p) != 0)
            break; /* fewer workers: the results are the same */
        p->started++;
    }
    r->pipe = p;
    return DONE;
}

/* Stop the workers and drop the tasks not delivered (an error, or giving up). */
static void
pipe_stop(Run *r)
{
    Pipe *p = r->pipe;
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_cond_broadcast(&p->done);
    pthread_mutex_unlock(&p->lock);
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < p->started; i++)
        pthread_join(p->threads[i], NULL);
    Py_END_ALLOW_THREADS
    for (int seq = p->head; seq < p->tail; seq++) {
        Task *t = &p->ring[seq & (TASKS_MAX - 1)];
        Py_CLEAR(t->data);
        Py_CLEAR(t->base);
        Py_CLEAR(t->out);
    }
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->lock);
    PyMem_Free(p->ring);
    PyMem_Free(p->ready);
    PyMem_Free(p->task_of);
    PyMem_Free(p);
    r->pipe = NULL;
}

/* The oldest task, once its worker is done: recorded with the oid it found, and what waited
 * on it settled, as the serial pass settles it. */
static int
deliver(Run *r)
{
    Pipe *p = r->pipe;
    Task *t = &p->ring[p->head & (TASKS_MAX - 1)];
    pthread_mutex_lock(&p->lock);
    int state = t->state;
    pthread_mutex_unlock(&p->lock);
    if (state == TASK_QUEUED) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&p->lock);
        if (p->idle && p->claimed < p->tail)
            pthread_cond_broadcast(&p->work);
        while (t->state == TASK_QUEUED) {
            p->waiting++;
            pthread_cond_wait(&p->done, &p->lock);
            p->waiting--;
        }
        state = t->state;
        pthread_mutex_unlock(&p->lock);
        Py_END_ALLOW_THREADS
    }
    if (state != TASK_DONE)
        return GAVE_UP; /* the delta did not apply: the reference judges */
    p->head++;
    p->bytes -= t->bytes;
    p->task_of[t->index] = 0;
    memcpy(r->oids + (size_t)t->index * OID_BYTES, t->oid, OID_BYTES);
    int status = settle_as(r, t->index, t->type_num, t->out, t->depth, 1);
    Py_CLEAR(t->data);
    Py_CLEAR(t->base);
    Py_CLEAR(t->out);
    return status;
}

/* Every queued task delivered: the state is the serial pass's at this entry. */
static int
drain(Run *r)
{
    int status = DONE;
    while (status == DONE && r->pipe != NULL && r->pipe->head < r->pipe->tail)
        status = deliver(r);
    return status;
}

/*
 * A REF_DELTA's lookup by oid waits for every queued task (drain). In a pack of REF_DELTAs
 * (a client that does not send OFS_DELTA, as libgit2's pack builder) nearly every entry
 * waits so: the calling thread and a worker then hand each task back and forth, and the
 * pass took three times the serial pass's time (the large profile's 504,433 entries:
 * 31.4 s against 10.5 s, most of it futex calls). Once such waits are at least
 * REF_WAITS_MIN and more than one entry in REF_WAIT_SHARE so far, the workers stop and the
 * pass goes on serially; right after a drain the state is the serial pass's, so the
 * result and the calls stay the same.
 */
static void
pipe_serial(Run *r, int index, int waited)
{
    if (r->pipe == NULL || !waited)
        return;
    r->ref_waits++;
    if (r->ref_waits >= REF_WAITS_MIN && r->ref_waits > index / REF_WAIT_SHARE)
        pipe_stop(r);
}

/* Whether entry ``i`` is resolved, or queued (and so resolved when its task is delivered). */
static int
resolved_or_queued(const Run *r, int i)
{
    return r->types[i] || (r->pipe != NULL && r->pipe->task_of[i]);
}

/* Queue entry ``index``: a full entry of ``type_num`` (``base`` NONE) whose body is ``data``,
 * or a delta ``data`` on entry ``base``, resolved or queued. */
static int
schedule(Run *r, int index, int type_num, PyObject *data, int base)
{
    Pipe *p = r->pipe;
    long long need = (long long)PyBytes_GET_SIZE(data);
    if (base != NONE) {
        /* its result and base, as the header declares them (checked below) */
        const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
        Py_ssize_t pos = 0;
        unsigned long long src_size = 0, dst_size = 0;
        if (read_size(d, PyBytes_GET_SIZE(data), &pos, &src_size) &&
            read_size(d, PyBytes_GET_SIZE(data), &pos, &dst_size) &&
            src_size <= r->object_bytes_max && dst_size <= r->object_bytes_max)
            need += (long long)(src_size + dst_size);
    }
    /* Room first: a delivery may resolve the base or drop its body from the cache. */
    while (p->tail - p->head >= TASKS_MAX || (p->tail > p->head && p->bytes + need > p->bytes_max)) {
        int status = deliver(r);
        if (status != DONE)
            return status;
    }
    PyObject *base_body = NULL, *out;
    int depth = 0, wait_for = NONE;
    Py_ssize_t pos = 0;
    if (base != NONE) {
        if (p->task_of[base]) {
            Task *b = &p->ring[(p->task_of[base] - 1) & (TASKS_MAX - 1)];
            type_num = b->type_num;
            depth = b->depth + 1;
            base_body = b->out;
            Py_INCREF(base_body);
            wait_for = base;
        }
        else {
            type_num = r->types[base];
            depth = r->depths[base] + 1;
            base_body = cache_get(r, base);
            if (base_body != NULL)
                Py_INCREF(base_body);
            else {
                int status = rebuild(r, base, &base_body);
                if (status != DONE)
                    return status;
            }
        }
        unsigned long long dst_size;
        if (delta_header(r, (const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                         PyBytes_GET_SIZE(base_body), &dst_size, &pos) != DONE) {
            Py_DECREF(base_body);
            return GAVE_UP; /* the delta does not apply: the reference judges */
        }
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)dst_size);
        if (out == NULL) {
            Py_DECREF(base_body);
            return FAILED;
        }
    }
    else {
        out = data;
        Py_INCREF(out);
    }
    Task *t = &p->ring[p->tail & (TASKS_MAX - 1)];
    t->index = index;
    t->type_num = type_num;
    t->depth = depth;
    t->wait_for = wait_for;
    Py_INCREF(data);
    t->data = data;
    t->base = base_body;
    t->out = out;
    t->pos = pos;
    t->bytes = need;
    t->state = TASK_QUEUED;
    p->task_of[index] = p->tail + 1;
    p->bytes += need;
    pthread_mutex_lock(&p->lock);
    p->tail++;
    if (p->idle && p->tail - p->claimed >= WAKE_TASKS)
        pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->lock);
    return DONE;
}

static int
lower_bound(const long long *offsets, int n, long long offset)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (offsets[mid] < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && offsets[lo] == offset ? lo : NONE;
}

/*
 * Charge the result size a delta's header declares before it is applied (the reference's
 * charge_delta): over object_bytes_max, or the pack's deltas over expansion_max, gives up.
 * A header that does not parse is charged nothing; applying it gives up.
 */
static int
charge(Run *r, PyObject *delta)
{
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(delta);
    Py_ssize_t n = PyBytes_GET_SIZE(delta), pos = 0;
    unsigned long long src_size, dst_size;
    if (!read_size(d, n, &pos, &src_size) || !read_size(d, n, &pos, &dst_size))
        return DONE;
    if (dst_size > r->object_bytes_max)
        return GAVE_UP;
    /* dst_size < 2^63 (read_size) and declared <= expansion_max < 2^63: no overflow */
    r->declared += dst_size;
    if (r->declared > r->expansion_max)
        return GAVE_UP;
    if (r->streamed && r->expansion_ratio) {
        /* The pack is at least what was read and its trailer: what that size allows is at
         * most what the whole pack's allows, so this never passes what the reference refuses
         * (over it, the reference judges the whole pack). */
        unsigned long long bytes = (unsigned long long)r->read_pos + PACK_TRAILER_BYTES;
        if (bytes <= (r->expansion_max - r->expansion_free) / r->expansion_ratio
            && r->declared > r->expansion_free + r->expansion_ratio * bytes)
            return GAVE_UP;
    }
    return DONE;
}

/* The pass over the entries in pack order (the reference's run loop). */
static int
scan(Run *r, long long *pos_out)
{
    long long pos = PACK_HEADER_BYTES;
    int status = fill(r, 0, PACK_HEADER_BYTES);
    for (int index = 0; status == DONE && index < r->count; index++) {
        if (pos >= r->end)
            return GAVE_UP;
        status = fill(r, pos, ENTRY_HEADER_BYTES_MAX);
        if (status != DONE)
            return status;
        Header h;
        Py_ssize_t rel = (Py_ssize_t)(pos - r->win_start);
        const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(r->win) + rel;
        if (!parse_header(p, PyBytes_GET_SIZE(r->win) - rel, pos, &h) || h.size > r->size_max)
            return GAVE_UP;
        r->offsets[index] = pos;
        r->hlens[index] = (int)h.header_length;
        r->sizes[index] = h.size;
        r->entry_types[index] = (unsigned char)h.type_num;
        if (h.base_oid != NULL) {
            memcpy(r->base_oids + (size_t)index * OID_BYTES, h.base_oid, OID_BYTES);
            r->has_base_oid[index] = 1;
        }
        PyObject *data;
        long long used;
        if (h.type_num == OBJ_BLOB && h.size > r->stream_min) {
            status = drain(r); /* its on_object comes after theirs */
            if (status != DONE)
                return status;
            status = hash_streamed(r, pos + h.header_length, h.size,
                                   r->oids + (size_t)index * OID_BYTES, &used);
            if (status != DONE)
                return status;
            pos += h.header_length + used;
            r->ends[index] = pos;
            r->n = index + 1;
            r->object_sizes[index] = h.size;
            status = settle(r, index, h.type_num, NULL, 0);
            continue;
        }
        status = inflate_stream(r, pos + h.header_length, r->end, h.size, 1, &data, &used);
        if (status != DONE)
            return status;
        pos += h.header_length + used;
        r->ends[index] = pos;
        r->n = index + 1;
        if (h.type_num < OBJ_OFS_DELTA) {
            if (r->pipe != NULL)
                status = schedule(r, index, h.type_num, data, NONE);
            else
                status = settle(r, index, h.type_num, data, 0);
        }
        else if (charge(r, data) != DONE)
            status = GAVE_UP; /* a delta bomb, or a result over object_bytes_max: the reference says */
        else {
            int base;
            if (h.type_num == OBJ_OFS_DELTA) {
                base = lower_bound(r->offsets, index, h.base_offset);
                if (base == NONE)
                    status = GAVE_UP;
            }
            else {
                int waited = r->pipe != NULL && r->pipe->head < r->pipe->tail;
                status = drain(r); /* the oids of every entry before it */
                if (status == DONE)
                    pipe_serial(r, index, waited);
                base = lookup_oid(r, r->base_oids + (size_t)index * OID_BYTES);
                if (base == NONE)
                    base = EXTERNAL_BASE;
            }
            /* A base neither resolved nor queued waits, unless a delivery resolves it. */
            if (status == DONE && base >= 0 && !resolved_or_queued(r, base))
                status = drain(r);
            if (status == DONE) {
                r->bases[index] = base;
                if (r->pipe != NULL && base >= 0 && resolved_or_queued(r, base))
                    status = schedule(r, index, 0, data, base);
                else if (base >= 0 && r->types[base]) {
                    PyObject *body = cache_get(r, base), *target = NULL;
                    if (body != NULL)
                        Py_INCREF(body);
                    else
                        status = rebuild(r, base, &body);
                    if (status == DONE) {
                        status = apply_delta(r, body, data, &target);
                        Py_DECREF(body);
                    }
                    if (status == DONE) {
                        status = settle(r, index, r->types[base], target, r->depths[base] + 1);
                        Py_DECREF(target);
                    }
                }
                else if (base >= 0)
                    wait_on_index(r, base, index);
                else
                    status = wait_on_oid(r, r->base_oids + (size_t)index * OID_BYTES, index);
            }
        }
        Py_DECREF(data);
    }
    if (status == DONE)
        status = drain(r);
    *pos_out = pos;
    return status;
}

/* Bases the pack left out, asked of the caller in the order first needed (_resolve_external). */
static int
resolve_external(Run *r)
{
    int n = r->waits_n; /* resolving adds no waits: the pass is over */
    for (int w = 0; w < n; w++) {
        if (!r->waits[w].live)
            continue;
        int type_num;
        PyObject *body;
        int status = find_external(r, r->waits[w].oid, &type_num, &body);
        if (status == GAVE_UP)
            continue;
        if (status != DONE)
            return status;
        r->waits[w].live = 0;
        int c = r->waits[w].head;
        while (status == DONE && c != NONE) {
            int after = r->next[c]; /* the child's own waiters relink next[] of others only */
            PyObject *delta, *target = NULL;
            status = reload(r, c, &delta);
            if (status == DONE) {
                status = apply_delta(r, body, delta, &target);
                Py_DECREF(delta);
            }
            if (status == DONE) {
                status = settle(r, c, type_num, target, 1);
                Py_DECREF(target);
            }
            c = after;
        }
        Py_DECREF(body);
        if (status != DONE)
            return status;
    }
    for (int w = 0; w < n; w++)
        if (r->waits[w].live)
            return GAVE_UP; /* nobody has it: the reference says which */
    for (int i = 0; i < r->count; i++)
        if (!r->types[i])
            return GAVE_UP;
    return DONE;
}

/* A column of ``n`` items of ``width`` bytes each, gathered from ``get(r, i, out)``. */
static PyObject *
column(Run *r, Py_ssize_t width, void (*get)(const Run *, int, unsigned char *))
{
    PyObject *col = PyBytes_FromStringAndSize(NULL, width * r->count);
    if (col == NULL)
        return NULL;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(col);
    for (int i = 0; i < r->count; i++)
        get(r, i, out + (size_t)i * (size_t)width);
    return col;
}

static void get_offset(const Run *r, int i, unsigned char *o) { memcpy(o, &r->offsets[i], 8); }
static void get_size(const Run *r, int i, unsigned char *o) { memcpy(o, &r->sizes[i], 8); }
static void get_object_size(const Run *r, int i, unsigned char *o)
{
    memcpy(o, &r->object_sizes[i], 8);
}
static void get_length(const Run *r, int i, unsigned char *o)
{
    long long length = r->ends[i] - r->offsets[i];
    memcpy(o, &length, 8);
}
static void get_depth(const Run *r, int i, unsigned char *o) { memcpy(o, &r->depths[i], 4); }
static void get_hlen(const Run *r, int i, unsigned char *o) { memcpy(o, &r->hlens[i], 4); }
static void get_type(const Run *r, int i, unsigned char *o) { *o = r->types[i]; }
static void get_entry_type(const Run *r, int i, unsigned char *o) { *o = r->entry_types[i]; }
static void get_has_base(const Run *r, int i, unsigned char *o) { *o = r->bases[i] != NO_BASE; }
static void get_base_oid(const Run *r, int i, unsigned char *o)
{
    if (r->bases[i] != NO_BASE)
        memcpy(o, r->base_oids + (size_t)i * OID_BYTES, OID_BYTES);
    else
        memset(o, 0, OID_BYTES);
}

/* -- the per-entry tables ----------------------------------------------------------------------
 *
 * A table of one slot per pack entry is mapped afresh when it is TABLE_MAP_MIN bytes or more:
 * its zero pages become resident as the pass fills them, and unmapping gives them back at
 * once. From the C heap, a table that reuses a block freed before is zeroed whole when it is
 * allocated: the second push of a process touched all its tables (about 130 bytes an entry,
 * 65 MiB on the `large` profile) at its first object, so they were resident under the moment
 * the indexing step peaks, a streamed blob inflated whole, where the first push had filled a
 * fifth of them (issue 25, docs/ingest.md "Memory"). Each table's length is kept in a
 * header before it, so freeing one needs only its address.
 */
#define TABLE_MAP_MIN ((size_t)1 << 20)
#define TABLE_HEADER ((size_t)16) /* keeps the table 16-byte aligned */

static void *
table_alloc(size_t n, size_t size)
{
    if (size != 0 && n > (SIZE_MAX - TABLE_HEADER) / size)
        return NULL;
    size_t bytes = n * size + TABLE_HEADER;
    unsigned char *base;
    if (bytes >= TABLE_MAP_MIN) {
        base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED)
            return NULL;
    }
    else if ((base = PyMem_Calloc(1, bytes)) == NULL)
        return NULL;
    memcpy(base, &bytes, sizeof(bytes));
    return base + TABLE_HEADER;
}

static void
table_free(void *table)
{
    if (table == NULL)
        return;
    unsigned char *base = (unsigned char *)table - TABLE_HEADER;
    size_t bytes;
    memcpy(&bytes, base, sizeof(bytes));
    if (bytes >= TABLE_MAP_MIN)
        munmap(base, bytes);
    else
        PyMem_Free(base);
}

#define FREE_WITH(release, field)                                                              \
    do {                                                                                       \
        release(r->field);                                                                     \
        r->field = NULL;                                                                       \
    } while (0)
#define FREE_FIELD(field) FREE_WITH(table_free, field) /* a table_alloc table */
#define FREE_GROWN(field) FREE_WITH(PyMem_Free, field) /* a list grown by grow() */

/* What the columns are not made of, let go before they are made: the base cache's bodies,
 * the window and the scan's tables (issue 25: on the large profile the columns' 42 MiB
 * came on top of them, the indexing step's peak). */
static void
drop_scan_state(Run *r)
{
    if (r->bodies != NULL)
        for (int i = 0; i < r->count; i++)
            Py_CLEAR(r->bodies[i]);
    for (int i = 0; i < r->stack_n; i++)
        Py_CLEAR(r->stack[i].base_body);
    r->stack_n = 0;
    Py_CLEAR(r->win);
    FREE_FIELD(bodies);
    FREE_FIELD(next);
    FREE_FIELD(wait_head);
    FREE_FIELD(wait_tail);
    FREE_FIELD(lru_prev);
    FREE_FIELD(lru_next);
    FREE_FIELD(scratch);
    FREE_FIELD(by_oid);
    FREE_FIELD(wait_table);
    FREE_GROWN(waits);
    FREE_GROWN(stack);
    FREE_FIELD(has_base_oid);
}

/* The entries as columns, in pack order (enroute_core.git.packindexer.PackObjects): no
 * Python object per entry, as index-pack keeps its entries in arrays. Native byte order:
 * offsets, sizes, object sizes, lengths in the pack (int64/uint64); oids (20 bytes each);
 * types; depths (int32); base oids (20 bytes each, zeros without a base); has a base (0/1);
 * entry types; header lengths (int32). Each array is freed once its last column is made,
 * so the columns replace the arrays rather than double them; the Run is spent after. */
static PyObject *
results(Run *r)
{
    enum { OFFSETS, OIDS, TYPES, SIZES, OBJECT_SIZES, LENGTHS, DEPTHS, BASE_OIDS, HAS_BASE,
           ENTRY_TYPES, HLENS, N_COLS };
    PyObject *cols[N_COLS] = {NULL};
    drop_scan_state(r);
    int ok = (cols[OIDS] = PyBytes_FromStringAndSize(
                  (const char *)r->oids, (Py_ssize_t)r->count * OID_BYTES)) != NULL;
    FREE_FIELD(oids);
    ok = ok && (cols[OFFSETS] = column(r, 8, get_offset)) != NULL &&
         (cols[LENGTHS] = column(r, 8, get_length)) != NULL;
    FREE_FIELD(offsets);
    FREE_FIELD(ends);
    ok = ok && (cols[TYPES] = column(r, 1, get_type)) != NULL;
    FREE_FIELD(types);
    ok = ok && (cols[SIZES] = column(r, 8, get_size)) != NULL;
    FREE_FIELD(sizes);
    ok = ok && (cols[OBJECT_SIZES] = column(r, 8, get_object_size)) != NULL;
    FREE_FIELD(object_sizes);
    ok = ok && (cols[DEPTHS] = column(r, 4, get_depth)) != NULL;
    FREE_FIELD(depths);
    ok = ok && (cols[BASE_OIDS] = column(r, OID_BYTES, get_base_oid)) != NULL &&
         (cols[HAS_BASE] = column(r, 1, get_has_base)) != NULL;
    FREE_FIELD(base_oids);
    FREE_FIELD(bases);
    ok = ok && (cols[ENTRY_TYPES] = column(r, 1, get_entry_type)) != NULL;
    FREE_FIELD(entry_types);
    ok = ok && (cols[HLENS] = column(r, 4, get_hlen)) != NULL;
    FREE_FIELD(hlens);
    PyObject *out = ok ? PyTuple_New(N_COLS) : NULL;
    for (int c = 0; c < N_COLS; c++) {
        if (out != NULL)
            PyTuple_SET_ITEM(out, c, cols[c]);
        else
            Py_XDECREF(cols[c]);
    }
    return out;
}

#define ALLOC(field, n)                                                                        \
    do {                                                                                       \
        r->field = table_alloc((size_t)(n), sizeof(*r->field));                                \
        if (r->field == NULL)                                                                  \
            goto nomem;                                                                        \
    } while (0)

static int
allocate(Run *r)
{
    int n = r->count > 0 ? r->count : 1;
    ALLOC(offsets, n);
    ALLOC(ends, n);
    ALLOC(sizes, n);
    ALLOC(object_sizes, n);
    ALLOC(hlens, n);
    ALLOC(depths, n);
    ALLOC(bases, n);
    ALLOC(next, n);
    ALLOC(types, n);
    ALLOC(entry_types, n);
    ALLOC(has_base_oid, n);
    ALLOC(oids, (size_t)n * OID_BYTES);
    ALLOC(base_oids, (size_t)n * OID_BYTES);
    ALLOC(wait_head, n);
    ALLOC(wait_tail, n);
    ALLOC(bodies, n);
    ALLOC(lru_prev, n);
    ALLOC(lru_next, n);
    ALLOC(scratch, n);
    r->by_oid_mask = table_size(n) - 1;
    ALLOC(by_oid, r->by_oid_mask + 1);
    r->wait_mask = r->by_oid_mask;
    ALLOC(wait_table, r->wait_mask + 1);
    for (int i = 0; i < n; i++) {
        r->bases[i] = NO_BASE;
        r->wait_head[i] = r->wait_tail[i] = NONE;
    }
    r->lru_head = r->lru_tail = NONE;
    return DONE;
nomem:
    PyErr_NoMemory();
    return FAILED;
}

static void
release(Run *r)
{
    drop_scan_state(r); /* nothing left of it after results() */
    void *blocks[] = {r->offsets, r->ends,        r->sizes, r->object_sizes, r->hlens, r->depths,
                      r->bases,   r->entry_types, r->types, r->oids,         r->base_oids};
    for (size_t i = 0; i < sizeof(blocks) / sizeof(blocks[0]); i++)
        table_free(blocks[i]);
}

PyDoc_STRVAR(index_pack_doc,
"index_pack(read_seq, read_at, check_end, find, on_object, sha1, count, end,\n"
"           size_max, object_bytes_max, free_bytes, ratio_max, depth_max, cache_max, window,\n"
"           expansion_max, stream_min, threads, streamed=0, expansion_free=0,\n"
"           expansion_ratio=0)\n"
"--\n\n"
"Every entry of the pack as eleven columns in pack order (results()), or None\n"
"when the pack is not the usual one (the caller then runs the reference).\n"
"``check_end(pos)`` is called once the entries are read, with the offset\n"
"after the last one, before any base outside the pack is asked of ``find``.\n"
"``expansion_max`` bounds the result bytes the pack's deltas declare in all,\n"
"charged as each delta is read, before any is applied. A full blob entry over\n"
"``stream_min`` bytes is hashed as it inflates, never held: ``on_object`` gets None\n"
"for its body. With ``threads`` over 1, that many less one worker threads apply\n"
"deltas and hash without the interpreter lock; the result and the calls are the same.\n"
"With ``streamed``, the pack is still arriving: ``end`` is only a bound and\n"
"``read_seq(offset, length, minimum)`` answers what has arrived, at least ``minimum``\n"
"bytes but where the entry region ends (fewer: the end is there), and the deltas read so far may declare at most ``expansion_free`` plus\n"
"``expansion_ratio`` per byte read (and the trailer) in all.");

static PyObject *
index_pack(PyObject *self, PyObject *args)
{
    (void)self;
    Run run;
    memset(&run, 0, sizeof(run));
    Run *r = &run;
    PyObject *check_end;
    long long count;
    int threads;
    if (!PyArg_ParseTuple(args, "OOOOOOLLKKKKlLnKKi|iKK:index_pack", &r->read_seq,
                          &r->read_at, &check_end, &r->find, &r->on_object, &r->sha1, &count,
                          &r->end, &r->size_max, &r->object_bytes_max, &r->free_bytes,
                          &r->ratio_max, &r->depth_max, &r->cache_max, &r->window,
                          &r->expansion_max, &r->stream_min, &threads, &r->streamed,
                          &r->expansion_free, &r->expansion_ratio))
        return NULL;
    if (count < 0 || count >= INT_MAX / 4 || r->window <= 0 || r->end < PACK_HEADER_BYTES)
        Py_RETURN_NONE;
    if (r->streamed && r->expansion_ratio && r->expansion_free > r->expansion_max)
        Py_RETURN_NONE;
    r->count = (int)count;
    r->n = 0;
    PyObject *result = NULL;
    long long pos = 0;
    int status = allocate(r);
    if (status == DONE)
        status = pipe_start(r, threads);
    if (status == DONE)
        status = scan(r, &pos);
    pipe_stop(r); /* drained when the scan is done; otherwise what is queued is dropped */
    if (status == DONE) {
        PyObject *ok = PyObject_CallFunction(check_end, "L", pos);
        if (ok == NULL)
            status = FAILED;
        Py_XDECREF(ok);
    }
    if (status == DONE)
        status = resolve_external(r);
    if (status == DONE)
        result = results(r);
    else if (status == GAVE_UP) {
        result = Py_None;
        Py_INCREF(result);
    }
    release(r);
    return result;
}

static PyMethodDef methods[] = {
    {"index_pack", index_pack, METH_VARARGS, index_pack_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "enroute_native.pack_index",
    "A whole pack indexed in one call: the usual pack only.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit_pack_index(void)
{
    str_update = PyUnicode_InternFromString("update");
    str_digest = PyUnicode_InternFromString("digest");
    if (str_update == NULL || str_digest == NULL)
        return NULL;
    return PyModule_Create(&module);
}
