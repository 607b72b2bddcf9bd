/*
 * The pack entry header (gitformat-pack, "Pack file entry": type and size,
 * then a REF_DELTA's base oid or an OFS_DELTA's base distance), read as the
 * compiled routines read it: the usual header only. enroute_core.git.pack's
 * parse_entry_header is the normative reader and this its fast path; a header
 * this does not read as usual goes back to it, which raises the typed error of
 * a bad one. Differential tests: libs/enroute-core/tests/git/test_pack.py
 * (header_is against _header_is_reference) and tests/fuzz/test_fuzz_pack_entry.py.
 */
#ifndef ENROUTE_NATIVE_PACKFMT_H
#define ENROUTE_NATIVE_PACKFMT_H

#include <Python.h>
#include <limits.h>
#include <string.h>

#define OID_BYTES 20
#define PACK_HEADER_BYTES 12
#define SIZE_BYTES_MAX 10
#define OFS_BYTES_MAX 10
#define OBJ_OFS_DELTA 6
#define OBJ_REF_DELTA 7
/* Inflate without the interpreter lock from this size up: others may run meanwhile. */
#define UNLOCKED_BYTES_MIN (64 * 1024)

typedef struct {
    int type_num;
    unsigned long long size;
    Py_ssize_t header_length;
    long long base_offset;
    const unsigned char *base_oid;
} Header;

/* 1 parsed, 0 not usual (the scanner's parser decides what it is). ``offset`` is the
 * entry's pack offset, ``p[:n]`` its bytes from the header on. */
static inline int
parse_header(const unsigned char *p, Py_ssize_t n, long long offset, Header *h)
{
    Py_ssize_t pos = 0;
    if (pos >= n)
        return 0;
    unsigned char byte = p[pos++];
    h->type_num = (byte >> 4) & 7;
    h->size = byte & 0x0F;
    int shift = 4;
    while (byte & 0x80) {
        if (pos >= n || pos >= SIZE_BYTES_MAX || shift > 57) /* the size would pass 64 bits */
            return 0;
        byte = p[pos++];
        h->size |= (unsigned long long)(byte & 0x7F) << shift;
        shift += 7;
    }
    h->base_offset = 0;
    h->base_oid = NULL;
    if (h->type_num < OBJ_OFS_DELTA) {
        if (h->type_num == 0 || h->type_num == 5)
            return 0;
    }
    else if (h->type_num == OBJ_REF_DELTA) {
        if (pos + OID_BYTES > n)
            return 0;
        h->base_oid = p + pos;
        pos += OID_BYTES;
    }
    else {
        Py_ssize_t start = pos;
        if (pos >= n)
            return 0;
        byte = p[pos++];
        unsigned long long distance = byte & 0x7F;
        while (byte & 0x80) {
            if (pos >= n || pos - start >= OFS_BYTES_MAX || distance > (ULLONG_MAX >> 8))
                return 0;
            byte = p[pos++];
            distance = ((distance + 1) << 7) | (byte & 0x7F);
        }
        if (distance == 0 || distance > (unsigned long long)offset ||
            offset - (long long)distance < PACK_HEADER_BYTES)
            return 0;
        h->base_offset = offset - (long long)distance;
    }
    h->header_length = pos;
    return 1;
}

/* ``entry[:length]`` as a REF_DELTA on ``base`` when it is a usual OFS_DELTA whose header
 * is ``header_length`` bytes: the type-and-size bytes written anew, the base oid, the same
 * zlib bytes (encode_entry_header is the reference). Py_None (a new reference) when it is
 * not; NULL on a memory error. */
static inline PyObject *
ofs_as_ref_delta(const unsigned char *entry, Py_ssize_t length, Py_ssize_t header_length,
                 const unsigned char *base)
{
    Header h;
    /* Any offset past the distance reads the header; the base's place is not asked here. */
    long long offset = PACK_HEADER_BYTES + ((long long)1 << 62);
    if (!parse_header(entry, length, offset, &h) || h.type_num != OBJ_OFS_DELTA ||
        h.header_length != header_length || length <= header_length)
        Py_RETURN_NONE;
    unsigned char head[SIZE_BYTES_MAX + 1];
    Py_ssize_t n = 0;
    unsigned long long size = h.size;
    unsigned char byte = (unsigned char)((OBJ_REF_DELTA << 4) | (size & 0x0F));
    size >>= 4;
    while (size) {
        head[n++] = byte | 0x80;
        byte = size & 0x7F;
        size >>= 7;
    }
    head[n++] = byte;
    Py_ssize_t rest = length - header_length;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n + OID_BYTES + rest);
    if (out != NULL) {
        char *w = PyBytes_AS_STRING(out);
        memcpy(w, head, (size_t)n);
        memcpy(w + n, base, OID_BYTES);
        memcpy(w + n + OID_BYTES, entry + header_length, (size_t)rest);
    }
    return out;
}

#endif
