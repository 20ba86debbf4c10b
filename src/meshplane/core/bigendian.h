/* Big-endian integers in and out of byte buffers: the wire's and the log's byte order, for the C
   extensions (``transports/_native.c``, ``core/_records.c``, ``core/mesh/_frames.c``). */

#ifndef MESHPLANE_BIGENDIAN_H
#define MESHPLANE_BIGENDIAN_H

#include <stdint.h>

static inline uint64_t be64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }

/* The low ``bytes`` bytes of ``v``, most significant first. */
static inline void put_be(unsigned char *p, uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; i--, v >>= 8) p[i] = (unsigned char)(v & 0xff);
}

#endif
