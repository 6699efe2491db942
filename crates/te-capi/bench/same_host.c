/*
 * The C rows of `cargo xtask bench capi same-host`: what crates/te-py/bench/same_host.py does
 * from Python, through Mooncake's C API. Two processes on one host, each an engine with one
 * transport choice (`auto`, or `tcp`): the target registers a zeroed working set (64 MiB,
 * larger than the caches); the initiator WRITEs batches of COUNT blocks of BLOCK bytes from its
 * own memory (allocateBatchID, submitTransfer, te_waitBatch, freeBatchID), walking the working
 * set batch after batch for SECONDS, then READs the whole working set back and compares it.
 * Both register memory they allocated themselves (aligned_alloc), as a C user does, with
 * transparent huge pages asked for as numpy asks for them on large arrays (so that the C and
 * Python rows move the same kind of memory). `memcpy`
 * copies the same blocks over the same working set within one process: the limit one copy sets.
 *
 *     same_host engine auto|tcp BLOCK COUNT SECONDS
 *     same_host memcpy BLOCK COUNT SECONDS
 *     same_host target auto|tcp WORKING_SET        (started by `engine`)
 *
 * `engine` and `memcpy` print one JSON line: {"gb_s": ..., "verified": true|false, ...}.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "transfer_engine_c.h"

#define WORKING_SET ((size_t)64 << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "same_host: %s\n", what);
    exit(1);
}

/* An engine serving on 127.0.0.1 with `protocol` installed (`auto`: every transport that can
 * start here). */
static transfer_engine_t start(const char *protocol) {
    transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 0);
    if (!e) die("createTransferEngine");
    if (!installTransport(e, protocol, NULL)) die("installTransport");
    return e;
}

/* `len` bytes of zeroed memory, 2 MiB-aligned, in huge pages where the kernel has them. */
static unsigned char *working_set(size_t len) {
    unsigned char *p = aligned_alloc(2u << 20, len);
    if (!p) die("memory");
    madvise(p, len, MADV_HUGEPAGE);
    memset(p, 0, len);
    return p;
}

/* Registers `len` bytes of memory this process allocated, zeroed. */
static unsigned char *registered(transfer_engine_t e, size_t len) {
    unsigned char *p = working_set(len);
    if (registerLocalMemory(e, p, len, "*", 1)) die("registerLocalMemory");
    return p;
}

static int target(const char *protocol, size_t len) {
    transfer_engine_t e = start(protocol);
    unsigned char *buf = registered(e, len);
    char name[256];
    if (getLocalIpAndPort(e, name, sizeof name)) die("getLocalIpAndPort");
    printf("%s %llu\n", name, (unsigned long long)(uintptr_t)buf);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) { /* the initiator is gone: end all the same */
    }
    unregisterLocalMemory(e, buf);
    destroyTransferEngine(e);
    free(buf);
    return 0;
}

/* One batch through the engine, asleep in te_waitBatch until it ends. */
static void batch(transfer_engine_t e, struct transfer_request *reqs, size_t n) {
    batch_id_t id = allocateBatchID(e, n);
    if (id == INVALID_BATCH) die("allocateBatchID");
    if (submitTransfer(e, id, reqs, n)) die("submitTransfer");
    struct transfer_status st;
    if (te_waitBatch(e, id, 60u * 1000 * 1000, &st)) die("te_waitBatch");
    if (st.status != STATUS_COMPLETED) die("a batch did not complete");
    if (freeBatchID(e, id)) die("freeBatchID");
}

/* The working set's bytes: xorshift, no pattern repeating within it. */
static unsigned char *fill(unsigned char *p) {
    uint64_t x = 3;
    for (size_t i = 0; i < WORKING_SET; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (unsigned char)x;
    }
    return p;
}

static int copies(size_t block, size_t count, double seconds) {
    if (block == 0 || count == 0 || WORKING_SET % (block * count) != 0)
        die("BLOCK * COUNT must divide the 64 MiB working set");
    unsigned char *src = fill(working_set(WORKING_SET)), *dst = working_set(WORKING_SET);
    size_t batches = WORKING_SET / (block * count);
    for (size_t off = 0; off < WORKING_SET; off += block) memcpy(dst + off, src + off, block);
    size_t n = 0;
    double t0 = now(), elapsed;
    while ((elapsed = now() - t0) < seconds) {
        size_t first = (n % batches) * count * block;
        for (size_t j = 0; j < count; j++)
            memcpy(dst + first + j * block, src + first + j * block, block);
        n++;
    }
    int verified = memcmp(dst, src, WORKING_SET) == 0;
    printf("{\"gb_s\": %.4f, \"verified\": %s, \"batches\": %zu}\n",
           (double)n * (double)(block * count) / elapsed / 1e9, verified ? "true" : "false", n);
    return verified ? 0 : 1;
}

static int engine(const char *self, const char *protocol, size_t block, size_t count,
                  double seconds) {
    if (block == 0 || count == 0 || WORKING_SET % (block * count) != 0)
        die("BLOCK * COUNT must divide the 64 MiB working set");
    int to_target[2], from_target[2];
    if (pipe(to_target) || pipe(from_target)) die("pipe");
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        dup2(to_target[0], 0);
        dup2(from_target[1], 1);
        close(to_target[1]);
        close(from_target[0]);
        char ws[32];
        snprintf(ws, sizeof ws, "%zu", WORKING_SET);
        execl("/proc/self/exe", self, "target", protocol, ws, (char *)NULL);
        _exit(127);
    }
    close(to_target[0]);
    close(from_target[1]);
    FILE *out = fdopen(from_target[0], "r");
    char name[256];
    unsigned long long remote;
    if (!out || fscanf(out, "%255s %llu", name, &remote) != 2) die("the target did not start");

    transfer_engine_t e = start(protocol);
    unsigned char *src = fill(registered(e, WORKING_SET));
    segment_id_t seg = openSegment(e, name);
    if (seg < 0) die("openSegment");
    size_t batches = WORKING_SET / (block * count);
    struct transfer_request *reqs = calloc(batches * count, sizeof *reqs);
    if (!reqs) die("memory");
    for (size_t i = 0; i < batches * count; i++) {
        reqs[i].opcode = OPCODE_WRITE;
        reqs[i].source = src + i * block;
        reqs[i].target_id = seg;
        reqs[i].target_offset = remote + i * block;
        reqs[i].length = block;
    }
    for (size_t b = 0; b < batches; b++) /* every page touched once before the clock starts */
        batch(e, reqs + b * count, count);
    size_t n = 0;
    double t0 = now(), elapsed;
    while ((elapsed = now() - t0) < seconds) {
        batch(e, reqs + (n % batches) * count, count);
        n++;
    }
    elapsed = now() - t0;

    unsigned char *back = registered(e, WORKING_SET);
    struct transfer_request all = {OPCODE_READ, back, seg, remote, WORKING_SET};
    batch(e, &all, 1);
    int verified = memcmp(back, src, WORKING_SET) == 0;
    printf("{\"gb_s\": %.4f, \"verified\": %s, \"batches\": %zu}\n",
           (double)n * (double)(block * count) / elapsed / 1e9, verified ? "true" : "false", n);
    if (write(to_target[1], "\n", 1) != 1) kill(child, SIGKILL);
    int status;
    waitpid(child, &status, 0);
    destroyTransferEngine(e);
    return verified ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "target"))
        return target(argv[2], (size_t)strtoull(argv[3], NULL, 10));
    if (argc == 6 && !strcmp(argv[1], "engine"))
        return engine(argv[0], argv[2], (size_t)strtoull(argv[3], NULL, 10),
                      (size_t)strtoull(argv[4], NULL, 10), atof(argv[5]));
    if (argc == 5 && !strcmp(argv[1], "memcpy"))
        return copies((size_t)strtoull(argv[2], NULL, 10), (size_t)strtoull(argv[3], NULL, 10),
                      atof(argv[4]));
    fprintf(stderr,
            "usage: %s engine auto|tcp BLOCK COUNT SECONDS | memcpy BLOCK COUNT SECONDS"
            " | target auto|tcp WORKING_SET\n",
            argv[0]);
    return 2;
}
