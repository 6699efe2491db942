/*
 * te's TENT C API (tent_*) driven as NIXL's TENT backend drives Mooncake's: two engines in one
 * process configured with tent_set_config, memory registered and allocated, a byte-verified
 * WRITE and READ, a batch's tasks listed and cancelled, notifications with and without a
 * transfer, segment info and NIC loads ("local"); the bad inputs the header promises to
 * refuse ("bad"); and a configuration file written for Mooncake's TENT, with settings given
 * as text on top ("mooncake_config FILE"). Exits non-zero at the first failure.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tent/transfer_engine.h"

#define LEN (4u << 20)


static tent_engine_t engine(void) {
    tent_engine_t e = tent_create_engine();
    CHECK(e != NULL, "tent_create_engine");
    CHECK(tent_available(e) == 1, "tent_available");
    return e;
}

/* Submits one request and waits for the batch; the overall status. */
static int run(tent_engine_t e, int opcode, void *src, tent_segment_id_t seg, uint64_t remote,
               uint64_t len, const char *note) {
    tent_batch_id_t b = tent_allocate_batch(e, 4);
    CHECK(b != 0 && b < (1ull << 48), "tent_allocate_batch: %llu", (unsigned long long)b);
    tent_request_t r;
    memset(&r, 0, sizeof r);
    r.opcode = opcode;
    r.source = src;
    r.target_id = seg;
    r.target_offset = remote;
    r.length = len;
    int rc = note ? tent_submit_notif(e, b, &r, 1, "tent-a", note) : tent_submit(e, b, &r, 1);
    CHECK(rc == 0, "tent_submit");
    tent_status_t st;
    for (int i = 0; i < 60000; i++) {
        CHECK(tent_overall_status(e, b, &st) == 0, "tent_overall_status");
        if (st.status != STATUS_WAITING && st.status != STATUS_PENDING) break;
        usleep(500);
    }
    CHECK(tent_free_batch(e, b) == 0, "tent_free_batch");
    return st.status;
}

static void expect_notify(tent_engine_t e, const char *name, const char *msg) {
    for (int i = 0; i < 10000; i++) {
        tent_notifi_info info = {0, NULL};
        CHECK(tent_recv_notifs(e, &info) == 0, "tent_recv_notifs");
        if (info.num_records > 0) {
            CHECK(strcmp(info.records[0].name, name) == 0 && strcmp(info.records[0].msg, msg) == 0,
                  "notification %s/%s, expected %s/%s", info.records[0].name, info.records[0].msg,
                  name, msg);
            tent_free_notifs(&info);
            CHECK(info.records == NULL && info.num_records == 0, "tent_free_notifs clears");
            return;
        }
        usleep(1000);
    }
    CHECK(0, "no notification %s/%s", name, msg);
}

static int local(void) {
    /* Settings from a file, then one key on top. */
    char conf[] = "/tmp/te-tent-conf-XXXXXX";
    int fd = mkstemp(conf);
    CHECK(fd >= 0, "mkstemp");
    const char *json = "{\"metadata_type\": \"p2p\", \"local_segment_name\": \"10.255.255.1\"}";
    CHECK(write(fd, json, strlen(json)) == (ssize_t)strlen(json), "write the config");
    close(fd);
    tent_load_config_from_file(conf);
    tent_set_config("local_segment_name", "127.0.0.1");
    tent_engine_t a = engine(), b = engine();
    char name_b[256], host[128];
    uint16_t port = 0;
    CHECK(tent_segment_name(b, name_b, sizeof name_b) == 0, "tent_segment_name");
    CHECK(tent_rpc_server_addr_port(b, host, sizeof host, &port) == 0 && port != 0,
          "tent_rpc_server_addr_port");
    CHECK(strcmp(host, "127.0.0.1") == 0, "host %s", host);

    unsigned char *src = malloc(LEN);
    fill(src, LEN, 1);
    CHECK(tent_register_memory(a, src, LEN) == 0, "tent_register_memory");
    void *dst_p = NULL;
    CHECK(tent_allocate_memory(b, &dst_p, LEN, "*") == 0 && dst_p != NULL, "tent_allocate_memory");
    unsigned char *dst = dst_p;
    memset(dst, 0, LEN);

    tent_segment_id_t seg = 0;
    CHECK(tent_open_segment(a, &seg, name_b) == 0 && seg != LOCAL_SEGMENT_ID, "tent_open_segment");
    tent_segment_info_t info;
    CHECK(tent_get_segment_info(a, seg, &info) == 0, "tent_get_segment_info");
    CHECK(info.type == TYPE_MEMORY && info.num_buffers >= 1, "segment info");
    int found = 0;
    for (int i = 0; i < info.num_buffers; i++)
        found |= info.buffers[i].base == (uint64_t)(uintptr_t)dst && info.buffers[i].length == LEN;
    CHECK(found, "the allocated buffer is listed");
    tent_free_segment_info(&info);

    CHECK(run(a, OPCODE_WRITE, src, seg, (uint64_t)(uintptr_t)dst, LEN, NULL) == STATUS_COMPLETED,
          "write");
    CHECK(same(dst, LEN, 1), "written bytes differ");
    fill(dst, LEN, 2);
    CHECK(run(a, OPCODE_READ, src, seg, (uint64_t)(uintptr_t)dst, LEN, NULL) == STATUS_COMPLETED,
          "read");
    CHECK(same(src, LEN, 2), "read bytes differ");
    printf("tent local: WRITE and READ of 4 MiB verified\n");

    /* A batch of three, listed; then one cancelled. */
    tent_batch_id_t batch = tent_allocate_batch(a, 3);
    tent_request_t rs[3];
    memset(rs, 0, sizeof rs);
    for (int i = 0; i < 3; i++) {
        rs[i].opcode = OPCODE_WRITE;
        rs[i].source = src + i * 4096;
        rs[i].target_id = seg;
        rs[i].target_offset = (uint64_t)(uintptr_t)(dst + i * 4096);
        rs[i].length = 4096;
        rs[i].priority = i;
        rs[i].transport_hint = i == 2 ? TRANSPORT_TCP : TRANSPORT_UNSPEC;
    }
    CHECK(tent_submit(a, batch, rs, 3) == 0, "submit three");
    tent_status_t list[8];
    size_t n = 8;
    for (int spin = 0; spin < 60000; spin++) {
        n = 8;
        CHECK(tent_task_status_list(a, batch, list, &n) == 0 && n == 3, "status list");
        if (list[0].status == STATUS_COMPLETED && list[1].status == STATUS_COMPLETED &&
            list[2].status == STATUS_COMPLETED)
            break;
        usleep(500);
    }
    CHECK(list[2].status == STATUS_COMPLETED && list[2].transferred_bytes == 4096, "listed");
    tent_status_t one;
    CHECK(tent_task_status(a, batch, 1, &one) == 0 && one.status == STATUS_COMPLETED, "task 1");
    CHECK(tent_cancel_task(a, batch, 0) == 0, "cancelling an ended task is fine");
    CHECK(tent_free_batch(a, batch) == 0, "free");
    printf("tent local: a batch of three with priorities and a transport hint, listed\n");

    CHECK(run(a, OPCODE_WRITE, src, seg, (uint64_t)(uintptr_t)dst, 4096, "kv-ready") ==
              STATUS_COMPLETED,
          "write with a notification");
    expect_notify(b, "tent-a", "kv-ready");
    CHECK(tent_send_notifs(a, seg, "tent-a", "no data") == 0, "tent_send_notifs");
    expect_notify(b, "tent-a", "no data");
    printf("tent local: notifications with and without a transfer\n");

    size_t count = 0;
    CHECK(tent_get_nic_load_stats(a, NULL, &count) == 0 && count >= 1, "count stats");
    tent_nic_load_stat_t stats[8];
    size_t room = 8;
    CHECK(tent_get_nic_load_stats(a, stats, &room) == 0 && stats[0].device_name[0], "stats");

    void *more = NULL;
    tent_memory_options_t opts;
    memset(&opts, 0, sizeof opts);
    opts.permission = PERM_GLOBAL_READ_ONLY;
    CHECK(tent_allocate_memory_ex(a, &more, 8192, &opts) == 0, "tent_allocate_memory_ex");
    unsigned char *ro = malloc(8192), *rw = malloc(8192);
    void *addrs[2] = {ro, rw};
    size_t sizes[2] = {8192, 8192};
    CHECK(tent_register_memory_batch(a, addrs, sizes, 2, PERM_GLOBAL_READ_WRITE) == 0, "batch");
    CHECK(tent_unregister_memory_batch(a, addrs, sizes, 2) == 0, "unregister batch");
    CHECK(tent_register_memory_batch_ex(a, addrs, sizes, 2, &opts) == 0, "batch_ex");
    CHECK(tent_unregister_memory_batch(a, addrs, NULL, 2) == 0, "unregister batch_ex");
    CHECK(tent_register_memory_ex(a, ro, 8192, &opts) == 0, "tent_register_memory_ex");
    CHECK(tent_register_memory_with_perm(a, rw, 8192, PERM_LOCAL_READ_WRITE) == 0, "with_perm");
    CHECK(tent_unregister_memory(a, ro, 8192) == 0 && tent_unregister_memory(a, rw, 8192) == 0,
          "unregister");
    CHECK(tent_free_memory(a, more) == 0, "tent_free_memory");
    CHECK(tent_close_segment(a, seg) == 0, "tent_close_segment");
    CHECK(tent_unregister_memory(a, src, LEN) == 0, "unregister src");
    CHECK(tent_free_memory(b, dst) == 0, "free dst");
    tent_destroy_engine(a);
    tent_destroy_engine(b);
    CHECK(tent_available(a) == 0, "a destroyed engine is not available");
    unlink(conf);
    free(src);
    free(ro);
    free(rw);
    printf("tent local: ok\n");
    return 0;
}

static int bad(void) {
    tent_set_config("metadata_type", "p2p");
    tent_set_config("local_segment_name", "127.0.0.1");
    tent_engine_t gone = engine();
    tent_destroy_engine(gone);
    tent_engine_t handles[] = {NULL, gone, (tent_engine_t)(uintptr_t)0xdeadbee0};
    char buf[64];
    for (int i = 0; i < 3; i++) {
        tent_engine_t h = handles[i];
        CHECK(tent_available(h) == 0, "available %d", i);
        CHECK(tent_segment_name(h, buf, sizeof buf) == -1, "name %d", i);
        CHECK(tent_allocate_batch(h, 4) == 0, "batch %d", i);
        CHECK(tent_register_memory(h, buf, sizeof buf) == -1, "register %d", i);
        tent_destroy_engine(h);
    }
    tent_engine_t e = engine();
    tent_segment_id_t seg;
    CHECK(tent_open_segment(e, NULL, "127.0.0.1:1") == -1, "NULL handle out");
    CHECK(tent_open_segment(e, &seg, NULL) == -1, "NULL name");
    char not_utf8[] = {'a', (char)0xff, 0};
    CHECK(tent_open_segment(e, &seg, not_utf8) == -1, "not UTF-8");
    CHECK(tent_open_segment(e, &seg, "127.0.0.1:1") == -1, "an unreachable peer");
    CHECK(tent_segment_name(e, buf, 3) == -1, "a small buffer");
    CHECK(tent_register_memory(e, NULL, 4096) == -1, "NULL memory");
    unsigned char *mem = malloc(1 << 20);
    CHECK(tent_register_memory(e, mem, 1 << 20) == 0, "register");
    CHECK(tent_register_memory(e, mem + 4096, 4096) == -1, "an overlap");
    CHECK(tent_register_memory_with_perm(e, mem, 4096, 9) == -1, "a bad permission");
    CHECK(tent_register_memory_batch(e, NULL, NULL, 2, 2) == -1, "NULL arrays");
    CHECK(tent_free_memory(e, mem) == -1, "freeing memory te did not allocate");
    CHECK(tent_allocate_batch(e, 0) == 0, "a batch of 0");
    tent_batch_id_t b = tent_allocate_batch(e, 2);
    CHECK(tent_submit(e, b, NULL, 1) == -1, "NULL requests");
    tent_request_t r;
    memset(&r, 0, sizeof r);
    r.opcode = OPCODE_WRITE;
    r.source = mem;
    r.target_id = LOCAL_SEGMENT_ID;
    r.target_offset = (uint64_t)(uintptr_t)(mem + 65536);
    r.length = 4096;
    r.priority = 7;
    CHECK(tent_submit(e, b, &r, 1) == -1, "a bad priority");
    r.priority = 0;
    r.transport_hint = TRANSPORT_TPU;
    CHECK(tent_submit(e, b, &r, 1) == -1, "a transport te does not have");
    r.transport_hint = TRANSPORT_UNSPEC;
    r.opcode = 5;
    CHECK(tent_submit(e, b, &r, 1) == -1, "a bad opcode");
    r.opcode = OPCODE_WRITE;
    r.target_offset = 12;
    CHECK(tent_submit(e, b, &r, 1) == -1, "an unregistered target");
    tent_status_t st;
    CHECK(tent_task_status(e, b, 9, &st) == -1, "no task 9");
    CHECK(tent_task_status(e, b + 1000, 0, &st) == -1, "a made-up batch");
    CHECK(tent_overall_status(e, b, NULL) == -1, "NULL status");
    CHECK(tent_recv_notifs(e, NULL) == -1, "NULL info");
    CHECK(tent_send_notifs(e, LOCAL_SEGMENT_ID, NULL, "x") == -1, "NULL name");
    size_t count = 3;
    CHECK(tent_get_nic_load_stats(e, NULL, &count) == -1, "NULL stats with room");
    CHECK(tent_free_batch(e, b) == 0, "free the empty batch");
    CHECK(tent_free_batch(e, b) == -1, "free it again");
    /* Still serving. */
    fill(mem, 4096, 4);
    CHECK(run(e, OPCODE_WRITE, mem, LOCAL_SEGMENT_ID, (uint64_t)(uintptr_t)(mem + 65536), 4096,
              NULL) == STATUS_COMPLETED,
          "a write to itself after the bad calls");
    CHECK(same(mem + 65536, 4096, 4), "bytes after the bad calls");
    tent_destroy_engine(e);
    free(mem);
    printf("tent bad: every bad input refused; the engine kept serving\n");
    return 0;
}

/* One request with `hint`: tent_submit's answer. */
static int submit_hinted(tent_engine_t e, void *src, tent_segment_id_t seg, void *dst, int hint) {
    tent_batch_id_t b = tent_allocate_batch(e, 1);
    CHECK(b != 0, "tent_allocate_batch");
    tent_request_t r;
    memset(&r, 0, sizeof r);
    r.opcode = OPCODE_WRITE;
    r.source = src;
    r.target_id = seg;
    r.target_offset = (uint64_t)(uintptr_t)dst;
    r.length = 4096;
    r.transport_hint = hint;
    int rc = tent_submit(e, b, &r, 1);
    tent_status_t st;
    for (int i = 0; rc == 0 && i < 60000; i++) {
        CHECK(tent_overall_status(e, b, &st) == 0, "tent_overall_status");
        if (st.status != STATUS_WAITING && st.status != STATUS_PENDING) break;
        usleep(500);
    }
    CHECK(rc != 0 || st.status == STATUS_COMPLETED, "hinted transfer ended %d", st.status);
    CHECK(tent_free_batch(e, b) == 0, "tent_free_batch");
    return rc;
}

static int mooncake_config(const char *path) {
    tent_load_config_from_file(path);
    /* Values as text, typed as TENT types them. */
    tent_set_config("local_segment_name", "127.0.0.1");
    tent_set_config("enable_auto_failover_on_poll", "True");
    tent_set_config("transports/rdma/workers/block_size", "65536");
    /* A malformed value refuses the engine; a good one in its place lets it start. */
    tent_set_config("transports/rdma/endpoint/path_mtu", "big");
    CHECK(tent_create_engine() == NULL, "a path_mtu of \"big\" is refused");
    tent_set_config("transports/rdma/endpoint/path_mtu", "2048");
    tent_engine_t a = engine(), b = engine();
    char name_b[256];
    CHECK(tent_segment_name(b, name_b, sizeof name_b) == 0, "tent_segment_name");
    unsigned char *src = malloc(LEN), *dst = malloc(LEN);
    fill(src, LEN, 3);
    memset(dst, 0, LEN);
    CHECK(tent_register_memory(a, src, LEN) == 0, "register src");
    CHECK(tent_register_memory(b, dst, LEN) == 0, "register dst");
    tent_segment_id_t seg = 0;
    CHECK(tent_open_segment(a, &seg, name_b) == 0, "tent_open_segment");
    CHECK(run(a, OPCODE_WRITE, src, seg, (uint64_t)(uintptr_t)dst, LEN, NULL) == STATUS_COMPLETED,
          "write");
    CHECK(same(dst, LEN, 3), "written bytes differ");
    printf("tent mooncake_config: engines started from the file, WRITE of 4 MiB verified\n");
    /* Hints: TCP serves; transports that are not installed, or cannot reach memory, refuse. */
    CHECK(submit_hinted(a, src, seg, dst, TRANSPORT_TCP) == 0, "a TCP hint");
    CHECK(submit_hinted(a, src, seg, dst, TRANSPORT_MNNVL) == -1, "an MNNVL hint");
    CHECK(submit_hinted(a, src, seg, dst, TRANSPORT_GDS) == -1, "a GDS hint");
    CHECK(submit_hinted(a, src, seg, dst, TRANSPORT_IOURING) == -1, "an io_uring hint to memory");
    CHECK(submit_hinted(a, src, seg, dst, TRANSPORT_UB) == -1, "a UB hint");
    CHECK(submit_hinted(a, src, seg, dst, 99) == -1, "hint 99");
    printf("tent mooncake_config: hints honoured or refused\n");
    tent_destroy_engine(a);
    tent_destroy_engine(b);
    free(src);
    free(dst);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "local") == 0) return local();
    if (argc == 2 && strcmp(argv[1], "bad") == 0) return bad();
    if (argc == 3 && strcmp(argv[1], "mooncake_config") == 0) return mooncake_config(argv[2]);
    fprintf(stderr, "usage: %s local|bad|mooncake_config FILE\n", argv[0]);
    return 2;
}
