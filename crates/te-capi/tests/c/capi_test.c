/*
 * te's libtransfer_engine.so driven through Mooncake's C API, as NIXL's Mooncake backend and
 * Mooncake's Go store drive Mooncake's: byte-verified transfers both ways between two engines
 * in one process ("local") and between two processes ("processes"), notifications with and
 * without a transfer, NIC load stats and the link table, and the bad inputs the header
 * promises to refuse ("bad"); two processes on one host through a transport picked by name
 * ("same_host PROTOCOL own|managed"). Prints one line per check; exits non-zero at the first
 * failure.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "transfer_engine_c.h"

#define LEN (4u << 20)


static transfer_engine_t engine(void) {
    transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    CHECK(e != NULL, "createTransferEngine");
    return e;
}

/* Submits one request and polls its status until it ends; the final status. */
static int run(transfer_engine_t e, int opcode, void *src, segment_id_t seg, uint64_t remote,
               uint64_t len, notify_msg_t *notify) {
    batch_id_t b = allocateBatchID(e, 8);
    CHECK(b != INVALID_BATCH, "allocateBatchID");
    struct transfer_request r = {opcode, src, seg, remote, len};
    int rc = notify ? submitTransferWithNotify(e, b, &r, 1, *notify) : submitTransfer(e, b, &r, 1);
    CHECK(rc == 0, "submitTransfer returned %d", rc);
    struct transfer_status st;
    for (int i = 0; i < 60000; i++) {
        CHECK(getTransferStatus(e, b, 0, &st) == 0, "getTransferStatus");
        if (st.status != STATUS_WAITING && st.status != STATUS_PENDING) break;
        usleep(500);
    }
    CHECK(freeBatchID(e, b) == 0, "freeBatchID");
    return st.status;
}

/* Waits for a notification on `e` and checks it. */
static void expect_notify(transfer_engine_t e, const char *name, const char *msg) {
    for (int i = 0; i < 10000; i++) {
        int n = 0;
        notify_msg_t *got = getNotifsFromEngine(e, &n);
        if (n > 0) {
            CHECK(got != NULL, "getNotifsFromEngine: %d entries and NULL", n);
            CHECK(strcmp(got[0].name, name) == 0 && strcmp(got[0].msg, msg) == 0,
                  "notification %s/%s, expected %s/%s", got[0].name, got[0].msg, name, msg);
            CHECK(freeNotifsMsgBuf(got, n) == 0, "freeNotifsMsgBuf");
            return;
        }
        usleep(1000);
    }
    CHECK(0, "no notification %s/%s", name, msg);
}

static int local(void) {
    transfer_engine_t a = engine(), b = engine();
    char name_b[256], name_a[256];
    CHECK(getLocalIpAndPort(b, name_b, sizeof name_b) == 0, "getLocalIpAndPort");
    CHECK(getLocalIpAndPort(a, name_a, sizeof name_a) == 0, "getLocalIpAndPort");
    unsigned char *src = malloc(LEN), *dst = malloc(LEN);
    fill(src, LEN, 1);
    memset(dst, 0, LEN);
    CHECK(registerLocalMemory(a, src, LEN, "*", 1) == 0, "register src");
    CHECK(registerLocalMemory(b, dst, LEN, "*", 1) == 0, "register dst");
    segment_id_t seg = openSegment(a, name_b);
    CHECK(seg > 0, "openSegment gave %d", seg);
    CHECK(openSegment(a, name_a) == LOCAL_SEGMENT, "own name is LOCAL_SEGMENT");

    CHECK(run(a, OPCODE_WRITE, src, seg, (uint64_t)(uintptr_t)dst, LEN, NULL) == STATUS_COMPLETED,
          "write");
    CHECK(same(dst, LEN, 1), "written bytes differ");
    printf("local: WRITE 4 MiB a -> b verified\n");

    fill(dst, LEN, 2);
    CHECK(run(a, OPCODE_READ, src, seg, (uint64_t)(uintptr_t)dst, LEN, NULL) == STATUS_COMPLETED,
          "read");
    CHECK(same(src, LEN, 2), "read bytes differ");
    printf("local: READ 4 MiB b -> a verified\n");

    /* Several requests in one batch, submitted twice until full. */
    batch_id_t batch = allocateBatchID(a, 4);
    fill(src, LEN, 3);
    struct transfer_request rs[2];
    for (int i = 0; i < 2; i++) {
        struct transfer_request r = {OPCODE_WRITE, src + i * 65536, seg,
                                     (uint64_t)(uintptr_t)(dst + i * 65536), 65536};
        rs[i] = r;
    }
    CHECK(submitTransfer(a, batch, rs, 2) == 0, "first submit");
    for (int i = 0; i < 2; i++) {
        rs[i].source = src + (i + 2) * 65536;
        rs[i].target_offset = (uint64_t)(uintptr_t)(dst + (i + 2) * 65536);
    }
    CHECK(submitTransfer(a, batch, rs, 2) == 0, "second submit");
    CHECK(submitTransfer(a, batch, rs, 1) != 0, "a fifth request in a batch of four");
    struct transfer_status st;
    for (int t = 0; t < 4; t++) {
        do {
            CHECK(getTransferStatus(a, batch, t, &st) == 0, "status of task %d", t);
        } while (st.status == STATUS_WAITING || st.status == STATUS_PENDING);
        CHECK(st.status == STATUS_COMPLETED && st.transferred_bytes == 65536, "task %d", t);
    }
    CHECK(same(dst, 4 * 65536, 3), "batched bytes differ");
    CHECK(freeBatchID(a, batch) == 0, "free");
    CHECK(freeBatchID(a, batch) != 0, "a freed batch freed again");
    CHECK(getTransferStatus(a, batch, 0, &st) != 0 && st.status == STATUS_INVALID,
          "status of a freed batch");
    printf("local: one batch filled by two submits, four tasks verified\n");

    /* te's extension: a batch waited for asleep, not polled. */
    fill(src, LEN, 4);
    batch = allocateBatchID(a, 2);
    struct transfer_request halves[2] = {
        {OPCODE_WRITE, src, seg, (uint64_t)(uintptr_t)dst, LEN / 2},
        {OPCODE_WRITE, src + LEN / 2, seg, (uint64_t)(uintptr_t)(dst + LEN / 2), LEN / 2}};
    CHECK(submitTransfer(a, batch, halves, 2) == 0, "submit for te_waitBatch");
    /* No time at all: the batch's state as it stands, moving or already done. */
    CHECK(te_waitBatch(a, batch, 0, &st) == 0, "te_waitBatch with no time");
    CHECK(st.status == STATUS_WAITING || st.status == STATUS_PENDING ||
              st.status == STATUS_COMPLETED,
          "te_waitBatch with no time gave %d", st.status);
    CHECK(te_waitBatch(a, batch, 60u * 1000 * 1000, &st) == 0, "te_waitBatch");
    CHECK(st.status == STATUS_COMPLETED && st.transferred_bytes == LEN,
          "te_waitBatch: state %d, %llu bytes", st.status, (unsigned long long)st.transferred_bytes);
    CHECK(same(dst, LEN, 4), "bytes differ after te_waitBatch");
    CHECK(freeBatchID(a, batch) == 0, "free after te_waitBatch");
    CHECK(te_waitBatch(a, batch, 1000, &st) > 0 && st.status == STATUS_INVALID,
          "te_waitBatch on a freed batch");
    printf("local: te_waitBatch slept until a batch of two completed, bytes verified\n");

    /* te's extension: a batch cancelled ends (CANCELED, or COMPLETED when it was done first),
     * and only then is it freed; an unknown batch is refused. */
    batch = allocateBatchID(a, 2);
    CHECK(submitTransfer(a, batch, halves, 2) == 0, "submit for te_cancelBatch");
    CHECK(te_cancelBatch(a, batch) == 0, "te_cancelBatch");
    CHECK(te_waitBatch(a, batch, 60u * 1000 * 1000, &st) == 0, "te_waitBatch after cancel");
    CHECK(st.status == STATUS_CANCELED || st.status == STATUS_COMPLETED,
          "a cancelled batch ended %d", st.status);
    CHECK(freeBatchID(a, batch) == 0, "free after te_cancelBatch");
    CHECK(te_cancelBatch(a, batch) == 1, "te_cancelBatch on a freed batch");
    CHECK(te_cancelBatch(NULL, batch) == 1, "te_cancelBatch on no engine");
    printf("local: te_cancelBatch ended a batch, which was then freed\n");

    notify_msg_t note = {"prefill-0", "kv-ready"};
    CHECK(run(a, OPCODE_WRITE, src, seg, (uint64_t)(uintptr_t)dst, 4096, &note) == STATUS_COMPLETED,
          "write with notify");
    expect_notify(b, "prefill-0", "kv-ready");
    notify_msg_t bare = {"agent-a", "no data"};
    CHECK(genNotifyInEngine(a, (uint64_t)seg, bare) == 0, "genNotifyInEngine");
    expect_notify(b, "agent-a", "no data");
    printf("local: notifications with and without a transfer\n");

    size_t count = 0;
    CHECK(getNicLoadStats(a, NULL, &count) == 0, "count stats");
    CHECK(count >= 1, "at least one rail, got %zu", count);
    nic_load_stat_t stats[8];
    size_t room = 8;
    CHECK(getNicLoadStats(a, stats, &room) == 0 && room == count, "stats");
    CHECK(stats[0].device_name[0] != 0, "a device name");
    char links[4096];
    CHECK(showLinks(a, links, sizeof links, 1) == 0 && links[0] == '[', "showLinks json");
    CHECK(showLinks(a, links, sizeof links, 0) == 0, "showLinks text");
    printf("local: %zu NIC load stat(s), device %s\n", count, stats[0].device_name);

    /* Batch registration, all or none, and batch unregistration. */
    unsigned char *x = malloc(65536), *y = malloc(65536);
    buffer_entry_t entries[2] = {{x, 65536}, {y, 65536}};
    CHECK(registerLocalMemoryBatch(a, entries, 2, "*") == 0, "registerLocalMemoryBatch");
    CHECK(registerLocalMemory(a, y + 16, 16, "*", 1) == -7, "inside a batch-registered region");
    void *both[2] = {x, y};
    CHECK(unregisterLocalMemoryBatch(a, both, 2) == 0, "unregisterLocalMemoryBatch");
    CHECK(unregisterLocalMemory(a, x) == -3, "unregistered already");
    free(x);
    free(y);

    CHECK(closeSegment(a, seg) == 0, "closeSegment");
    CHECK(openSegmentNoCache(a, name_b) > 0, "openSegmentNoCache");
    CHECK(syncSegmentCache(a) == 0, "syncSegmentCache");
    CHECK(unregisterLocalMemory(a, src) == 0, "unregister src");
    CHECK(unregisterLocalMemory(b, dst) == 0, "unregister dst");
    destroyTransferEngine(a);
    destroyTransferEngine(b);
    free(src);
    free(dst);
    printf("local: ok\n");
    return 0;
}

static int bad(void) {
    char buf[256];
    /* Handles that are not engines'. */
    transfer_engine_t gone = engine();
    destroyTransferEngine(gone);
    transfer_engine_t handles[] = {NULL, gone, (transfer_engine_t)(uintptr_t)0xdeadbeef};
    for (int i = 0; i < 3; i++) {
        transfer_engine_t h = handles[i];
        CHECK(getLocalIpAndPort(h, buf, sizeof buf) == -1, "getLocalIpAndPort on handle %d", i);
        CHECK(openSegment(h, "127.0.0.1:1") < 0, "openSegment on handle %d", i);
        CHECK(registerLocalMemory(h, buf, sizeof buf, "*", 1) < 0, "register on handle %d", i);
        CHECK(allocateBatchID(h, 4) == INVALID_BATCH, "allocate on handle %d", i);
        CHECK(freeBatchID(h, 1) > 0, "free on handle %d", i);
        struct transfer_status st;
        CHECK(getTransferStatus(h, 1, 0, &st) > 0, "status on handle %d", i);
        CHECK(te_waitBatch(h, 1, 0, &st) > 0 && st.status == STATUS_INVALID,
              "te_waitBatch on handle %d", i);
        int n = 5;
        CHECK(getNotifsFromEngine(h, &n) == NULL && n == 0, "notifs on handle %d", i);
        destroyTransferEngine(h); /* ignored */
    }
    printf("bad: NULL, destroyed and made-up handles refused\n");

    transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
    CHECK(e != NULL, "create without transports");
    CHECK(createTransferEngine(NULL, "127.0.0.1", "", 0, 1) == NULL, "NULL metadata");
    CHECK(createTransferEngine("nosuch://x", "127.0.0.1", "", 0, 1) == NULL, "bad metadata");
    CHECK(installTransport(e, "bogus", NULL) == NULL, "unknown transport");
    transport_t tcp = installTransport(e, "tcp", NULL);
    CHECK(tcp != NULL, "tcp");
    CHECK(installTransport(e, "tcp", NULL) == tcp, "tcp twice gives the installed one");
    CHECK(uninstallTransport(e, "tcp") == -303, "uninstall is not implemented");
    CHECK(removeLocalSegment(e, "x") == -303, "removeLocalSegment is not implemented");
    CHECK(warmupEfaSegment(e, "127.0.0.1:1") == 0, "warmupEfaSegment");
    CHECK(discoverTopology(e) == 0, "discoverTopology");
    enableGracefulShutdown(e);
    char small[4];
    CHECK(getLocalIpAndPort(e, small, sizeof small) == -1, "a buffer too small");
    CHECK(getLocalIpAndPort(e, NULL, 64) == -1, "a NULL buffer");
    CHECK(openSegment(e, NULL) == -1, "NULL name");
    char not_utf8[] = {'1', '2', (char)0xff, (char)0xfe, 0};
    CHECK(openSegment(e, not_utf8) == -1, "a name that is not UTF-8");
    CHECK(openSegment(e, "127.0.0.1:1") < 0, "an unreachable peer");

    unsigned char *mem = malloc(1 << 20);
    CHECK(registerLocalMemory(e, mem, 1 << 20, NULL, 1) == -1, "NULL location");
    CHECK(registerLocalMemory(e, NULL, 4096, "*", 1) == -1, "NULL address");
    CHECK(registerLocalMemory(e, mem, 0, "*", 1) == -1, "zero length");
    CHECK(registerLocalMemory(e, mem, 1 << 20, "*", 1) == 0, "register");
    CHECK(registerLocalMemory(e, mem + 4096, 4096, "*", 1) == -7, "overlap is -7");
    CHECK(registerLocalMemoryBatch(e, NULL, 3, "*") == -1, "NULL list");
    CHECK(registerLocalMemoryBatch(e, (buffer_entry_t *)mem, SIZE_MAX / 8, "*") == -1,
          "a count whose bytes overflow");
    CHECK(unregisterLocalMemoryBatch(e, NULL, 2) == -1, "NULL address list");
    CHECK(unregisterLocalMemory(e, mem + 1) == -3, "not a region's start is -3");

    char name[256];
    CHECK(getLocalIpAndPort(e, name, sizeof name) == 0, "name");
    segment_id_t self = openSegment(e, name);
    CHECK(self == LOCAL_SEGMENT, "own segment");
    CHECK(allocateBatchID(e, 0) == INVALID_BATCH, "a batch of 0");
    batch_id_t b = allocateBatchID(e, 2);
    CHECK(b != INVALID_BATCH, "allocate");
    CHECK(submitTransfer(e, b, NULL, 1) == 1, "NULL requests");
    unsigned char *outside = malloc(4096);
    struct transfer_request r = {OPCODE_WRITE, outside, LOCAL_SEGMENT, (uint64_t)(uintptr_t)mem, 4096};
    CHECK(submitTransfer(e, b, &r, 1) == 3, "an unregistered source is 3");
    r.source = mem;
    r.target_offset = (uint64_t)(uintptr_t)outside;
    CHECK(submitTransfer(e, b, &r, 1) == 3, "an unregistered target is 3");
    r.target_offset = (uint64_t)(uintptr_t)(mem + 65536);
    r.opcode = 7;
    CHECK(submitTransfer(e, b, &r, 1) == 1, "a bad opcode is 1");
    r.opcode = OPCODE_WRITE;
    r.target_id = 12345;
    CHECK(submitTransfer(e, b, &r, 1) == 1, "an unknown segment is 1");
    r.target_id = -5;
    CHECK(submitTransfer(e, b, &r, 1) == 1, "a negative segment is 1");
    r.target_id = LOCAL_SEGMENT;
    r.length = UINT64_MAX;
    CHECK(submitTransfer(e, b, &r, 1) != 0, "a length that overflows");
    CHECK(getTransferStatus(e, b, 0, NULL) == 1, "NULL status");
    CHECK(te_waitBatch(e, b, 0, NULL) == 1, "te_waitBatch with a NULL status");
    struct transfer_status st;
    CHECK(getTransferStatus(e, b, 99, &st) > 0 && st.status == STATUS_INVALID, "no task 99");
    CHECK(getTransferStatus(e, b ^ 0x5a5a0000u, 0, &st) > 0, "a made-up batch");
    notify_msg_t nullnote = {NULL, "x"};
    CHECK(genNotifyInEngine(e, 0, nullnote) == -1, "a NULL notification name");
    CHECK(getNotifsFromEngine(e, NULL) == NULL, "NULL size");
    CHECK(freeNotifsMsgBuf(NULL, 3) == 0, "free NULL");
    size_t count = 4;
    CHECK(getNicLoadStats(e, NULL, &count) == -1, "NULL stats with room");
    CHECK(getNicLoadStats(e, NULL, NULL) == -1, "NULL count");
    CHECK(showLinks(e, small, sizeof small, 1) == -1, "links into a small buffer");
    CHECK(freeBatchID(e, b) == 0, "free the empty batch");

    /* The engine still serves after all of it. */
    fill(mem, 4096, 9);
    r.length = 4096;
    r.source = mem;
    r.target_offset = (uint64_t)(uintptr_t)(mem + 65536);
    CHECK(run(e, OPCODE_WRITE, mem, LOCAL_SEGMENT, (uint64_t)(uintptr_t)(mem + 65536), 4096, NULL)
              == STATUS_COMPLETED, "a write to itself after the bad calls");
    CHECK(same(mem + 65536, 4096, 9), "bytes after the bad calls");
    destroyTransferEngine(e);
    CHECK(allocateBatchID(e, 2) == INVALID_BATCH, "a call after destroy");
    free(mem);
    free(outside);
    printf("bad: every bad input refused with its code; the engine kept serving\n");
    return 0;
}

/* Two processes: the child's engine owns `dst`; the parent writes to it and reads it back. */
/* The parent's side of a two-process exchange: reads the child's "name address" line from
 * `fd`, opens its segment, WRITEs the first half of `src` into it and READs the second half of
 * the child's memory (its pattern, seed 5) into `src`, checking every byte; the segment. */
static segment_id_t exchange_with_child(transfer_engine_t a, int fd, unsigned char *src) {
    char line[512] = {0};
    size_t got = 0;
    while (got < sizeof line - 1) {
        CHECK(read(fd, line + got, 1) == 1, "parent read");
        if (line[got++] == '\n') break;
    }
    char name[256];
    unsigned long long addr = 0;
    CHECK(sscanf(line, "%255s %llu", name, &addr) == 2, "parse %s", line);
    segment_id_t seg = openSegment(a, name);
    CHECK(seg > 0, "open the child's segment: %d", seg);
    CHECK(run(a, OPCODE_WRITE, src, seg, addr, LEN / 2, NULL) == STATUS_COMPLETED, "write");
    CHECK(run(a, OPCODE_READ, src + LEN / 2, seg, addr + LEN / 2, LEN / 2, NULL) == STATUS_COMPLETED,
          "read");
    unsigned char *expect = malloc(LEN);
    fill(expect, LEN, 5);
    CHECK(memcmp(src + LEN / 2, expect + LEN / 2, LEN / 2) == 0, "the READ from the child differs");
    free(expect);
    return seg;
}

static int processes(void) {
    int to_parent[2], to_child[2];
    CHECK(pipe(to_parent) == 0 && pipe(to_child) == 0, "pipe");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        transfer_engine_t b = engine();
        unsigned char *dst = malloc(LEN);
        fill(dst, LEN, 5);
        CHECK(registerLocalMemory(b, dst, LEN, "*", 1) == 0, "child register");
        char line[512];
        char name[256];
        CHECK(getLocalIpAndPort(b, name, sizeof name) == 0, "child name");
        int n = snprintf(line, sizeof line, "%s %llu\n", name, (unsigned long long)(uintptr_t)dst);
        CHECK(write(to_parent[1], line, (size_t)n) == n, "child write");
        char go;
        CHECK(read(to_child[0], &go, 1) == 1, "child wait");
        /* The parent wrote the first half. */
        CHECK(same(dst, LEN / 2, 6), "the parent's WRITE did not land in the child");
        expect_notify(b, "parent", "done");
        destroyTransferEngine(b);
        free(dst);
        _exit(0);
    }
    transfer_engine_t a = engine();
    unsigned char *src = malloc(LEN);
    fill(src, LEN, 6);
    CHECK(registerLocalMemory(a, src, LEN, "*", 1) == 0, "parent register");
    segment_id_t seg = exchange_with_child(a, to_parent[0], src);
    notify_msg_t note = {"parent", "done"};
    CHECK(genNotifyInEngine(a, (uint64_t)seg, note) == 0, "notify the child");
    CHECK(write(to_child[1], "g", 1) == 1, "release the child");
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed: %d", status);
    destroyTransferEngine(a);
    free(src);
    printf("processes: WRITE to and READ from another process verified, notification crossed\n");
    return 0;
}

/* Which transports an engine made with auto_discover serves: both runtimes install shm by its
 * name (te's TENT runtime, under MC_USE_TENT, runs it from the start, with its file transport);
 * an unknown name is refused by both. showLinks' last line names what runs. */
static int transports(void) {
    transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    CHECK(e != NULL, "createTransferEngine");
    CHECK(installTransport(e, "tcp", NULL) != NULL, "tcp is there");
    CHECK(installTransport(e, "efa", NULL) == NULL, "efa refused");
    CHECK(installTransport(e, "bogus", NULL) == NULL, "bogus refused");
    printf("transports: shm %s\n", installTransport(e, "shm", NULL) != NULL ? "served" : "refused");
    char links[4096];
    CHECK(showLinks(e, links, sizeof links, 0) == 0, "showLinks text");
    const char *installed = strstr(links, "transports: ");
    CHECK(installed != NULL, "showLinks names the transports: %s", links);
    printf("installed %s", installed + strlen("transports: "));
    batch_id_t b = allocateBatchID(e, 4);
    CHECK(b != INVALID_BATCH && b < (1ull << 48), "batch id %llu", (unsigned long long)b);
    CHECK(freeBatchID(e, b) == 0, "freeBatchID");
    destroyTransferEngine(e);
    return 0;
}

/* A file as a segment (te_openFile): READ from it and WRITE to it with the calls a peer's
 * memory takes, every byte checked on disk; a read-only one refuses WRITEs; a missing path is
 * an error. The engine has a file transport after installTransport("io_uring"). */
static int files(void) {
    char path[] = "/tmp/te-capi-file-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    const size_t len = 1 << 20;
    unsigned char *content = malloc(len), *buf = malloc(len), *disk = malloc(len);
    for (size_t i = 0; i < len; i++) content[i] = (unsigned char)(i * 13 + 5);
    CHECK(write(fd, content, len) == (ssize_t)len, "write the file");
    close(fd);
    transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    CHECK(e != NULL, "createTransferEngine");
    CHECK(te_openFile(e, path, 1) < 0, "no file transport yet: refused");
    CHECK(installTransport(e, "io_uring", NULL) != NULL, "installTransport io_uring");
    CHECK(registerLocalMemory(e, buf, len, "cpu:0", 1) == 0, "registerLocalMemory");
    segment_id_t f = te_openFile(e, path, 1);
    CHECK(f >= 0, "te_openFile: %d", f);
    CHECK(run(e, OPCODE_READ, buf, f, 4096, 65536, NULL) == STATUS_COMPLETED, "READ from the file");
    CHECK(memcmp(buf, content + 4096, 65536) == 0, "the file's bytes");
    memset(buf, 0x5a, len);
    CHECK(run(e, OPCODE_WRITE, buf, f, 512 << 10, 256 << 10, NULL) == STATUS_COMPLETED,
          "WRITE to the file");
    FILE *in = fopen(path, "rb");
    CHECK(in != NULL && fread(disk, 1, len, in) == len, "read the file back");
    fclose(in);
    for (size_t i = 0; i < len; i++) {
        unsigned char want = (i >= (512u << 10) && i < (768u << 10)) ? 0x5a : content[i];
        CHECK(disk[i] == want, "byte %zu on disk is %d, not %d", i, disk[i], want);
    }
    segment_id_t ro = te_openFile(e, path, 0);
    CHECK(ro >= 0, "te_openFile read-only: %d", ro);
    batch_id_t b = allocateBatchID(e, 1);
    struct transfer_request w = {OPCODE_WRITE, buf, ro, 0, 4096};
    int rc = submitTransfer(e, b, &w, 1);
    struct transfer_status st = {0};
    if (rc == 0) CHECK(te_waitBatch(e, b, 10000000, &st) == 0, "te_waitBatch");
    CHECK(rc != 0 || st.status == STATUS_FAILED, "a WRITE to a read-only file: rc %d status %d",
          rc, st.status);
    freeBatchID(e, b);
    CHECK(te_openFile(e, "/nonexistent/te-file", 0) < 0, "a missing path is refused");
    CHECK(te_openFile(e, NULL, 0) < 0, "a NULL path is refused");
    unregisterLocalMemory(e, buf);
    destroyTransferEngine(e);
    unlink(path);
    free(content), free(buf), free(disk);
    printf("files: READ and WRITE of a file segment verified\n");
    return 0;
}

/* An engine with `protocol` alone installed, and LEN bytes of memory it serves: allocated by
 * this process (`own`) or by the engine (te_allocateManagedBuffer), filled with `seed`'s
 * pattern. */
static transfer_engine_t same_host_engine(const char *protocol, int managed, unsigned seed,
                                          unsigned char **buf) {
    transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 0);
    CHECK(e != NULL, "createTransferEngine");
    CHECK(installTransport(e, protocol, NULL) != NULL, "installTransport %s", protocol);
    if (managed) {
        *buf = te_allocateManagedBuffer(e, LEN);
        CHECK(*buf != NULL, "te_allocateManagedBuffer");
    } else {
        *buf = aligned_alloc(4096, LEN);
        CHECK(*buf != NULL && registerLocalMemory(e, *buf, LEN, "*", 1) == 0, "register");
    }
    fill(*buf, LEN, seed);
    return e;
}

/* Two processes on one host, each an engine with one transport picked by name and memory of
 * the kind `how` names: the parent WRITEs half of its pattern into the child and READs the
 * other half of the child's, every byte checked on both sides; showLinks names what ran. */
static int same_host(const char *protocol, const char *how) {
    int managed = strcmp(how, "managed") == 0;
    CHECK(managed || strcmp(how, "own") == 0, "own or managed, not %s", how);
    int to_parent[2], to_child[2];
    CHECK(pipe(to_parent) == 0 && pipe(to_child) == 0, "pipe");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        unsigned char *dst;
        transfer_engine_t b = same_host_engine(protocol, managed, 5, &dst);
        char line[512], name[256];
        CHECK(getLocalIpAndPort(b, name, sizeof name) == 0, "child name");
        int n = snprintf(line, sizeof line, "%s %llu\n", name, (unsigned long long)(uintptr_t)dst);
        CHECK(write(to_parent[1], line, (size_t)n) == n, "child write");
        char go;
        CHECK(read(to_child[0], &go, 1) == 1, "child wait");
        CHECK(same(dst, LEN / 2, 6), "the parent's WRITE did not land in the child");
        if (managed) CHECK(te_freeManagedBuffer(b, dst, LEN) == 0, "te_freeManagedBuffer");
        destroyTransferEngine(b);
        _exit(0);
    }
    unsigned char *src;
    transfer_engine_t a = same_host_engine(protocol, managed, 6, &src);
    exchange_with_child(a, to_parent[0], src);
    CHECK(write(to_child[1], "g", 1) == 1, "release the child");
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed: %d", status);
    char links[4096];
    CHECK(showLinks(a, links, sizeof links, 0) == 0, "showLinks");
    const char *installed = strstr(links, "transports: ");
    CHECK(installed != NULL, "showLinks names the transports: %s", links);
    if (managed) {
        CHECK(te_freeManagedBuffer(a, src, LEN) == 0, "te_freeManagedBuffer");
        CHECK(te_freeManagedBuffer(a, src, LEN) < 0, "a second free is refused");
    }
    destroyTransferEngine(a);
    printf("same_host %s %s: WRITE and READ between two processes verified\n", protocol, how);
    printf("installed %s", installed + strlen("transports: "));
    return 0;
}

/* The engine's figures from C (te_getMetrics): off until switched on; then a WRITE of 1 MiB
 * and a READ of 4 KiB are counted, bytes and requests, under tcp; a buffer too small and a
 * count other than -1/0/1 are refused. */
static int metrics(void) {
    transfer_engine_t a = engine(), b = engine();
    unsigned char *src = malloc(LEN), *dst = malloc(LEN);
    fill(src, LEN, 3);
    CHECK(registerLocalMemory(a, src, LEN, "*", 1) == 0 && registerLocalMemory(b, dst, LEN, "*", 1) == 0,
          "register");
    char name[256], json[16384];
    CHECK(getLocalIpAndPort(b, name, sizeof name) == 0, "name");
    segment_id_t seg = openSegment(a, name);
    CHECK(run(a, OPCODE_WRITE, src, seg, (uint64_t)(uintptr_t)dst, 4096, NULL) == STATUS_COMPLETED, "off");
    CHECK(te_getMetrics(a, json, sizeof json, 1) == 0, "te_getMetrics, switching on");
    CHECK(strstr(json, "\"tent_write_bytes_total\":0") != NULL, "nothing counted while off: %s", json);
    CHECK(run(a, OPCODE_WRITE, src, seg, (uint64_t)(uintptr_t)dst, 1 << 20, NULL) == STATUS_COMPLETED, "write");
    CHECK(run(a, OPCODE_READ, src, seg, (uint64_t)(uintptr_t)dst, 4096, NULL) == STATUS_COMPLETED, "read");
    CHECK(te_getMetrics(a, json, sizeof json, -1) == 0, "te_getMetrics");
    CHECK(strstr(json, "\"tent_write_bytes_total\":1048576") != NULL, "write bytes: %s", json);
    CHECK(strstr(json, "\"tent_read_bytes_total\":4096") != NULL, "read bytes: %s", json);
    CHECK(strstr(json, "\"tent_write_requests_total\":1") != NULL, "write requests: %s", json);
    CHECK(strstr(json, "\"transport\":\"tcp\"") != NULL, "by transport: %s", json);
    CHECK(te_getMetrics(a, json, 8, -1) != 0, "a buffer too small is refused");
    CHECK(te_getMetrics(a, json, sizeof json, 5) != 0, "count 5 is refused");
    CHECK(te_getMetrics(a, json, sizeof json, 0) == 0, "switching off");
    destroyTransferEngine(a);
    destroyTransferEngine(b);
    free(src), free(dst);
    printf("metrics: counted from C, switched on and off\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "same_host") == 0) return same_host(argv[2], argv[3]);
    if (argc != 2) {
        fprintf(stderr,
                "usage: %s local|bad|processes|transports|files|metrics|same_host PROTOCOL own|managed\n",
                argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "transports") == 0) return transports();
    if (strcmp(argv[1], "local") == 0) return local();
    if (strcmp(argv[1], "bad") == 0) return bad();
    if (strcmp(argv[1], "processes") == 0) return processes();
    if (strcmp(argv[1], "files") == 0) return files();
    if (strcmp(argv[1], "metrics") == 0) return metrics();
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
