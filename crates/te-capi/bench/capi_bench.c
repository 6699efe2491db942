/*
 * The C path of `cargo xtask bench capi`: two engines in one process (as te-bench
 * --loopback), TCP, one thread issuing batches through Mooncake's C API the way NIXL's
 * Mooncake backend does (allocateBatchID, submitTransfer, getTransferStatus per task until
 * each ends, freeBatchID), for a number of seconds. `poll` polls as a careful caller does: hot
 * for the first millisecond of a batch, then backing off (a sixteenth of the time waited).
 * `wait` sleeps in te's extension te_waitBatch instead, as te-bench's Rust path does in `wait`.
 *
 *     capi_bench write|read BLOCK_BYTES BATCH SECONDS [poll|wait [instant]]
 *
 * Prints one JSON line: throughput in GB/s, per-batch latency percentiles and the mean time
 * per batch in us. The bytes are checked once after the timed run.
 *
 * `instant` measures the C path's own cost instead: one engine, no TCP, te's `instant`
 * transport (only in a library built with te-capi's `instant` feature), which moves no byte
 * and ends every slice the moment it is posted; the batches go to the engine's own segment,
 * as te-bench --mode=engine's do, and no byte is checked.
 */
#define _GNU_SOURCE
#include <pthread.h>
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

/* The timed loop's inputs and what it measured. */
struct run {
    transfer_engine_t engine;
    struct transfer_request *reqs;
    size_t batch;
    int sleeps;
    double seconds;
    size_t cap, n;
    double *lat;
    double elapsed;
};

/* Issues batches for `seconds`: allocate, submit, wait (asleep in te_waitBatch, or polling
 * each task's status), free. */
static void *run_batches(void *arg) {
    struct run *r = arg;
    transfer_engine_t a = r->engine;
    size_t batch = r->batch;
    /* One clock read per batch, as te-bench's: the moment a batch is freed ends its latency
     * and starts the next one (a read costs in a VM). */
    double start = now(), end = start + r->seconds, t0 = start;
    while (t0 < end) {
        batch_id_t id = allocateBatchID(a, batch);
        if (id == INVALID_BATCH) die("allocateBatchID");
        if (submitTransfer(a, id, r->reqs, batch)) die("submitTransfer");
        if (r->sleeps) {
            struct transfer_status st;
            if (te_waitBatch(a, id, 60u * 1000 * 1000, &st)) die("te_waitBatch");
            if (st.status != STATUS_COMPLETED) die("a batch did not complete");
        }
        for (size_t t = 0; t < batch && !r->sleeps; t++) {
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
        double t1 = now();
        if (r->n < r->cap) r->lat[r->n] = (t1 - t0) * 1e6;
        r->n++;
        t0 = t1;
    }
    r->elapsed = t0 - start;
    return NULL;
}

int main(int argc, char **argv) {
    int waiting_ok = argc >= 6 && (!strcmp(argv[5], "poll") || !strcmp(argv[5], "wait"));
    int instant = argc == 7 && !strcmp(argv[6], "instant");
    if (argc != 5 && !(argc == 6 && waiting_ok) && !(waiting_ok && instant)) {
        fprintf(stderr, "usage: %s write|read BLOCK_BYTES BATCH SECONDS [poll|wait [instant]]\n",
                argv[0]);
        return 2;
    }
    int sleeps = argc >= 6 && strcmp(argv[5], "wait") == 0;
    int opcode = strcmp(argv[1], "read") == 0 ? OPCODE_READ : OPCODE_WRITE;
    uint64_t block = strtoull(argv[2], NULL, 10);
    size_t batch = (size_t)strtoull(argv[3], NULL, 10);
    double seconds = atof(argv[4]);
    size_t len = (size_t)block * batch;
    if (len < (64u << 20)) len = 64u << 20;

    /* With `instant`, one engine with no transport but te's instant one is both sides. */
    transfer_engine_t a = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, !instant);
    transfer_engine_t b =
        instant ? a : createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    if (!a || !b) die("createTransferEngine");
    if (instant && !installTransport(a, "instant", NULL))
        die("installTransport instant (a library built without te-capi's `instant` feature?)");
    /* With `instant` the batches read and write one registered buffer, as te-bench
     * --mode=engine's do. */
    unsigned char *local = aligned_alloc(4096, len);
    unsigned char *remote = instant ? local : aligned_alloc(4096, len);
    if (!local || !remote) die("memory");
    /* The side written to starts zeroed: after the run it must hold the pattern. */
    unsigned char *src = opcode == OPCODE_WRITE ? local : remote;
    unsigned char *dst = opcode == OPCODE_WRITE ? remote : local;
    for (size_t i = 0; i < len && !instant; i++) {
        src[i] = (unsigned char)(i * 131u + 7u);
        dst[i] = 0;
    }
    if (registerLocalMemory(a, local, len, "*", 1) ||
        (!instant && registerLocalMemory(b, remote, len, "*", 1)))
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
    struct run r = {a, reqs, batch, sleeps, seconds, 1 << 20, 0, NULL, 0};
    r.lat = malloc(r.cap * sizeof *r.lat);
    if (!r.lat) die("memory");
    /* On a thread of its own, as te-bench's Rust path runs its batches. */
    pthread_t issuer;
    if (pthread_create(&issuer, NULL, run_batches, &r) || pthread_join(issuer, NULL))
        die("pthread");
    size_t n = r.n;
    double *lat = r.lat;
    double elapsed = r.elapsed;
    size_t moved = (size_t)block * batch;
    for (size_t i = 0; i < moved && !instant; i++)
        if (dst[i] != (unsigned char)(i * 131u + 7u)) die("bytes differ after the run");
    size_t kept = n < r.cap ? n : r.cap;
    qsort(lat, kept, sizeof *lat, cmp);
    printf("{\"throughput_gb_s\": %.4f, \"batches\": %zu, \"batch_us\": %.3f, "
           "\"batch_latency_us\": {\"p50\": %.2f, \"p99\": %.2f}, \"verified_bytes\": %zu}\n",
           (double)n * (double)block * (double)batch / elapsed / 1e9, n, elapsed / (double)n * 1e6,
           lat[kept / 2], lat[kept * 99 / 100], instant ? (size_t)0 : moved);
    destroyTransferEngine(a);
    if (b != a) destroyTransferEngine(b);
    return 0;
}
