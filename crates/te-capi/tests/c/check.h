/* What te's C test programs share: CHECK (print where and why, exit 1) and a byte pattern. */
#ifndef TE_CAPI_TEST_CHECK_H
#define TE_CAPI_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                              \
    do {                                                              \
        if (!(cond)) {                                                \
            fprintf(stderr, "FAILED at %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                             \
            fprintf(stderr, "\n");                                    \
            exit(1);                                                  \
        }                                                             \
    } while (0)

/* The pattern byte at `i` for `seed`: differs across seeds and across 4 KiB pages. */
static inline unsigned char pattern_at(size_t i, unsigned seed) {
    return (unsigned char)((i * 31u + seed * 7u + (i >> 12)) & 0xff);
}

static inline void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = pattern_at(i, seed);
}

static inline int same(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != pattern_at(i, seed)) return 0;
    return 1;
}

#endif
