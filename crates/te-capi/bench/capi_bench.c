/*
 * The C path of `cargo xtask bench capi`: two engines in one process (as te-bench
 * --loopback), TCP, one thread issuing batches through Mooncake's C API the way NIXL's
 * Mooncake backend does (allocateBatchID, submitTransfer, getTransferStatus per task until
 * each ends, freeBatchID), for a number of seconds. `poll` polls as a careful caller does: hot
 * for the first millisecond of a batch, then backing off (a sixteenth of the time waited).
 * `wait` sleeps in te's extension te_waitBatch instead, as te-bench's Rust path does in `wait`.
 *
 *     capi_bench write|read BLOCK_BYTES BATCH SECONDS [poll|wait]
 *
 * Prints one JSON line: throughput in GB/s and per-batch latency percentiles in us. The
 * bytes are checked once after the timed run.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transfer_engine_c.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void die(const char *what) {
    fprintf(stderr, "capi_bench: %s\n", what);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 5 && !(argc == 6 && (!strcmp(argv[5], "poll") || !strcmp(argv[5], "wait")))) {
        fprintf(stderr, "usage: %s write|read BLOCK_BYTES BATCH SECONDS [poll|wait]\n", argv[0]);
        return 2;
    }
    int sleeps = argc == 6 && strcmp(argv[5], "wait") == 0;
    int opcode = strcmp(argv[1], "read") == 0 ? OPCODE_READ : OPCODE_WRITE;
    uint64_t block = strtoull(argv[2], NULL, 10);
    size_t batch = (size_t)strtoull(argv[3], NULL, 10);
    double seconds = atof(argv[4]);
    size_t len = (size_t)block * batch;
    if (len < (64u << 20)) len = 64u << 20;

    transfer_engine_t a = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    transfer_engine_t b = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    if (!a || !b) die("createTransferEngine");
    unsigned char *local = aligned_alloc(4096, len), *remote = aligned_alloc(4096, len);
    if (!local || !remote) die("memory");
    /* The side written to starts zeroed: after the run it must hold the pattern. */
    unsigned char *src = opcode == OPCODE_WRITE ? local : remote;
    unsigned char *dst = opcode == OPCODE_WRITE ? remote : local;
    for (size_t i = 0; i < len; i++) {
        src[i] = (unsigned char)(i * 131u + 7u);
        dst[i] = 0;
    }
    if (registerLocalMemory(a, local, len, "*", 1) || registerLocalMemory(b, remote, len, "*", 1))
        die("registerLocalMemory");
    char name[256];
    if (getLocalIpAndPort(b, name, sizeof name)) die("getLocalIpAndPort");
    segment_id_t seg = openSegment(a, name);
    if (seg < 0) die("openSegment");

    struct transfer_request *reqs = calloc(batch, sizeof *reqs);
    for (size_t i = 0; i < batch; i++) {
        reqs[i].opcode = opcode;
        reqs[i].source = local + i * block;
        reqs[i].target_id = seg;
        reqs[i].target_offset = (uint64_t)(uintptr_t)(remote + i * block);
        reqs[i].length = block;
    }
    size_t cap = 1 << 20, n = 0;
    double *lat = malloc(cap * sizeof *lat);
    double start = now(), end = start + seconds;
    while (now() < end) {
        double t0 = now();
        batch_id_t id = allocateBatchID(a, batch);
        if (id == INVALID_BATCH) die("allocateBatchID");
        if (submitTransfer(a, id, reqs, batch)) die("submitTransfer");
        if (sleeps) {
            struct transfer_status st;
            if (te_waitBatch(a, id, 60u * 1000 * 1000, &st)) die("te_waitBatch");
            if (st.status != STATUS_COMPLETED) die("a batch did not complete");
        }
        for (size_t t = 0; t < batch && !sleeps; t++) {
            struct transfer_status st;
            for (;;) {
                if (getTransferStatus(a, id, t, &st)) die("getTransferStatus");
                if (st.status == STATUS_COMPLETED) break;
                if (st.status != STATUS_WAITING && st.status != STATUS_PENDING) die("a task failed");
                /* Poll hot for the first millisecond of a batch, then sleep a sixteenth of the time
                 * waited so far (20 us to 2 ms): a busy poller would take a core from te's own
                 * threads for a whole large batch, and a fixed short sleep nearly as much. */
                double waited = now() - t0;
                if (waited < 1e-3) {
                    sched_yield();
                } else {
                    double d = waited / 16;
                    if (d < 20e-6) d = 20e-6;
                    if (d > 2e-3) d = 2e-3;
                    struct timespec pause = {0, (long)(d * 1e9)};
                    nanosleep(&pause, NULL);
                }
            }
        }
        if (freeBatchID(a, id)) die("freeBatchID");
        if (n < cap) lat[n] = (now() - t0) * 1e6;
        n++;
    }
    double elapsed = now() - start;
    size_t moved = (size_t)block * batch;
    for (size_t i = 0; i < moved; i++)
        if (dst[i] != (unsigned char)(i * 131u + 7u)) die("bytes differ after the run");
    size_t kept = n < cap ? n : cap;
    qsort(lat, kept, sizeof *lat, cmp);
    printf("{\"throughput_gb_s\": %.4f, \"batches\": %zu, \"batch_latency_us\": {\"p50\": %.2f, "
           "\"p99\": %.2f}, \"verified_bytes\": %zu}\n",
           (double)n * (double)block * (double)batch / elapsed / 1e9, n, lat[kept / 2],
           lat[kept * 99 / 100], moved);
    destroyTransferEngine(a);
    destroyTransferEngine(b);
    return 0;
}
