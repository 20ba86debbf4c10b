/* The envelope's MessagePack map in the one layout msgspec writes it in, read without allocating.
 *
 * msgspec encodes EventEnvelope as a map of its five fields in declaration order, keys as fixstr,
 * integers in their smallest unsigned encoding, the topic as str and the payload as bin. A body in
 * exactly that layout (and nothing after it) decodes to the same values whoever reads it, so a reader
 * can take it without calling the decoder; any other body (keys reordered, other integer encodings,
 * extra fields, trailing bytes) goes to msgspec, which says whether and how it decodes.
 */
#ifndef MESHPLANE_ENVELOPE_MAP_H
#define MESHPLANE_ENVELOPE_MAP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bigendian.h"

typedef struct {
    uint64_t publisher_id, sequence, published_at;
    const unsigned char *topic, *payload;
    size_t topic_size, payload_size;
} envelope_view;

/* The key `name` as a fixstr at *p, advancing past it; 0 if it is not there. */
static int envelope_key(const unsigned char **p, const unsigned char *end, const char *name, size_t size) {
    if ((size_t)(end - *p) < 1 + size || **p != (0xa0 | size) || memcmp(*p + 1, name, size) != 0) return 0;
    *p += 1 + size;
    return 1;
}

/* An unsigned integer (positive fixint, uint 8/16/32/64) at *p. */
static int envelope_uint(const unsigned char **p, const unsigned char *end, uint64_t *value) {
    if (*p >= end) return 0;
    unsigned char type = **p;
    size_t width = type < 0x80 ? 0 : type == 0xcc ? 1 : type == 0xcd ? 2 : type == 0xce ? 4 : type == 0xcf ? 8 : 9;
    if (width == 9 || (size_t)(end - *p) < 1 + width) return 0;
    *value = width == 0 ? type : width == 1 ? (*p)[1] : width == 2 ? be16(*p + 1) : width == 4 ? be32(*p + 1) : be64(*p + 1);
    *p += 1 + width;
    return 1;
}

/* A str (str_type_base 0xa0 with a 5-bit length, then 0xd9-0xdb) or bin (0, then 0xc4-0xc6) at *p. */
static int envelope_blob(const unsigned char **p, const unsigned char *end, unsigned char first_sized, int fix,
                         const unsigned char **data, size_t *size) {
    if (*p >= end) return 0;
    unsigned char type = **p;
    size_t width, length;
    if (fix && type >= 0xa0 && type <= 0xbf) {
        width = 0;
        length = type & 0x1f;
    } else if (type >= first_sized && type <= first_sized + 2) {
        width = (size_t)1 << (type - first_sized);
        if ((size_t)(end - *p) < 1 + width) return 0;
        length = width == 1 ? (*p)[1] : width == 2 ? be16(*p + 1) : be32(*p + 1);
    } else {
        return 0;
    }
    if ((size_t)(end - *p) - 1 - width < length) return 0;
    *data = *p + 1 + width;
    *size = length;
    *p += 1 + width + length;
    return 1;
}

/* 1 and the fields in *view if body[0..size) is exactly msgspec's layout of an envelope, else 0. */
static int read_envelope_map(const unsigned char *body, size_t size, envelope_view *view) {
    const unsigned char *p = body, *end = body + size;
    if (size == 0 || *p++ != 0x85) return 0;
    return envelope_key(&p, end, "publisher_id", 12) && envelope_uint(&p, end, &view->publisher_id) &&
           envelope_key(&p, end, "sequence", 8) && envelope_uint(&p, end, &view->sequence) &&
           envelope_key(&p, end, "published_at", 12) && envelope_uint(&p, end, &view->published_at) &&
           envelope_key(&p, end, "topic", 5) && envelope_blob(&p, end, 0xd9, 1, &view->topic, &view->topic_size) &&
           envelope_key(&p, end, "payload", 7) &&
           envelope_blob(&p, end, 0xc4, 0, &view->payload, &view->payload_size) && p == end;
}

#endif
