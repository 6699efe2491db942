/*
 * tent/transfer_engine.h: TENT's C API (the tent_* functions of Mooncake's TENT runtime, as
 * NIXL's TENT backend calls them) in te's libtransfer_engine.so, over te's TENT runtime.
 * Same symbols, types, layouts and constants as Mooncake's header.
 *
 * Convention (TENT's): 0 for success, -1 for any failure (the reason goes to te's log);
 * tent_allocate_batch returns 0 for failure; tent_create_engine returns NULL.
 *
 * Engines take their settings when they are created: tent_load_config_from_file (a JSON
 * file, or inline JSON) and tent_set_config (a JSON path such as "metadata_type" or
 * "transports/rdma/enable", and a value as JSON or text) apply to the engines created after
 * them, over MC_TENT_CONF and under the MC_* variables. In te these settings are the
 * process's, not the calling thread's.
 *
 * What te adds at the boundary: an engine handle is looked up, never dereferenced (destroyed,
 * stale or made-up handles fail); NULL pointers, counts whose bytes overflow and strings that
 * are not UTF-8 fail; no Rust panic unwinds into C. Contracts on the caller's pointers are
 * stated with each function ("Caller:"); no "char *" argument is kept after the call.
 */

#ifndef TENT_API_H
#define TENT_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define tent_batch_id_t uint64_t
#define tent_segment_id_t uint64_t

#ifndef LOCAL_SEGMENT_ID
#define LOCAL_SEGMENT_ID (0ull)
#endif

#define OPCODE_READ (0)
#define OPCODE_WRITE (1)

/* Zero-initialize it: transport_hint 0 (TRANSPORT_UNSPEC) follows the policy. */
struct tent_request {
    int opcode;
    void *source;
    tent_segment_id_t target_id;
    uint64_t target_offset;
    uint64_t length;
    int priority;       /* 0 high, 1 medium, 2 low */
    int transport_hint; /* TRANSPORT_UNSPEC, or a transport to try first */
};
typedef struct tent_request tent_request_t;

#define STATUS_WAITING (0)
#define STATUS_PENDING (1)
#define STATUS_INVALID (2)
#define STATUS_CANCELED (3)
#define STATUS_COMPLETED (4)
#define STATUS_TIMEOUT (5)
#define STATUS_FAILED (6)

struct tent_status {
    int status;
    uint64_t transferred_bytes;
};
typedef struct tent_status tent_status_t;

typedef void *tent_engine_t;

struct tent_buffer_info {
    uint64_t base, length;
    char location[64];
};

#define TYPE_MEMORY (0)
#define TYPE_FILE (1)

struct tent_segment_info {
    int type;
    int num_buffers;
    struct tent_buffer_info *buffers;
};
typedef struct tent_segment_info tent_segment_info_t;

struct tent_notifi_record {
    tent_segment_id_t handle;
    char name[256];
    char msg[4096];
};
typedef struct tent_notifi_record tent_notifi_record_t;

struct tent_notifi_info {
    int num_records;
    struct tent_notifi_record *records;
};
typedef struct tent_notifi_info tent_notifi_info;

#define PERM_LOCAL_READ_WRITE (0)
#define PERM_GLOBAL_READ_ONLY (1)
#define PERM_GLOBAL_READ_WRITE (2)

/* te has rdma, shm, nvlink, gds, io_uring and tcp; a hint naming another transport fails. */
#define TRANSPORT_UNSPEC (0)
#define TRANSPORT_RDMA (1)
#define TRANSPORT_MNNVL (2)
#define TRANSPORT_SHM (3)
#define TRANSPORT_NVLINK (4)
#define TRANSPORT_GDS (5)
#define TRANSPORT_IOURING (6)
#define TRANSPORT_TCP (7)
#define TRANSPORT_ASCEND_DIRECT (8)
#define TRANSPORT_SUNRISE_LINK (9)
#define TRANSPORT_TPU (10)
#define TRANSPORT_UB (11)
#define TRANSPORT_MPCOMM (12)

/* location ("" means "*") and permission are used; transport_type, shm_path, shm_offset and
 * internal are accepted and not used by te. */
struct tent_memory_options {
    char location[64];
    int permission;
    int transport_type;
    char shm_path[256];
    size_t shm_offset;
    int internal;
};
typedef struct tent_memory_options tent_memory_options_t;

/* Settings for the engines created next. Caller: path, key and value are NUL-terminated. */
void tent_load_config_from_file(const char *path);
void tent_set_config(const char *key, const char *value);

/* An engine from the settings, or NULL. */
tent_engine_t tent_create_engine();

/* Shuts the engine down and invalidates the handle; unknown handles are ignored. */
void tent_destroy_engine(tent_engine_t engine);

/* The segment name and a NUL. Caller: buf is writable for buf_len bytes. */
int tent_segment_name(tent_engine_t engine, char *buf, size_t buf_len);

/* The handshake host (and a NUL) and port. Caller: addr_buf is writable for buf_len bytes;
 * port is writable. */
int tent_rpc_server_addr_port(tent_engine_t engine, char *addr_buf, size_t buf_len,
                              uint16_t *port);

/* Opens a segment by name; its id into *handle (the engine's own name: LOCAL_SEGMENT_ID).
 * Caller: handle is writable; segment_name is NUL-terminated. */
int tent_open_segment(tent_engine_t engine, tent_segment_id_t *handle, const char *segment_name);

int tent_close_segment(tent_engine_t engine, tent_segment_id_t handle);

/* The segment's buffers into *info (a malloc'd array: free with tent_free_segment_info).
 * Caller: info is writable. */
int tent_get_segment_info(tent_engine_t engine, tent_segment_id_t handle,
                          tent_segment_info_t *info);

/* Caller: info was filled by tent_get_segment_info and not freed since. */
void tent_free_segment_info(tent_segment_info_t *info);

/* Allocates size bytes at location (NULL: "*"), registered read-write; the address into
 * *addr. Caller: addr is writable; location is NULL or NUL-terminated. */
int tent_allocate_memory(tent_engine_t engine, void **addr, size_t size, const char *location);

/* Frees memory from tent_allocate_memory. */
int tent_free_memory(tent_engine_t engine, void *addr);

/* Registers [addr, addr+size) for remote reads and writes. Caller: the range is memory of
 * this process that stays allocated until it is unregistered. */
int tent_register_memory(tent_engine_t engine, void *addr, size_t size);

/* Unregisters the region at addr (te knows its size). */
int tent_unregister_memory(tent_engine_t engine, void *addr, size_t size);

/* A batch of batch_size tasks, or 0. */
tent_batch_id_t tent_allocate_batch(tent_engine_t engine, size_t batch_size);

/* Frees a batch whose tasks have all ended. */
int tent_free_batch(tent_engine_t engine, tent_batch_id_t batch_id);

/* Adds count requests to the batch. Caller: entries is readable for count requests; each
 * local range lies in registered memory kept allocated until its task ends. */
int tent_submit(tent_engine_t engine, tent_batch_id_t batch_id, tent_request_t *entries,
                size_t count);

/* As tent_submit; the owner of the first request's segment receives (name, message) once
 * every task of the batch has completed. Caller: also name and message NUL-terminated. */
int tent_submit_notif(tent_engine_t engine, tent_batch_id_t batch_id, tent_request_t *entries,
                      size_t count, const char *name, const char *message);

/* Sends (name, message) to the owner of segment handle without a transfer.
 * Caller: name and message are NUL-terminated. */
int tent_send_notifs(tent_engine_t engine, tent_segment_id_t handle, const char *name,
                     const char *message);

/* The notifications received (drained) into *info: a malloc'd array, free with
 * tent_free_notifs; each record's handle is the id of an open segment named as the sender,
 * else 0. Caller: info is writable. */
int tent_recv_notifs(tent_engine_t engine, tent_notifi_info *info);

/* Caller: info was filled by tent_recv_notifs and not freed since. */
void tent_free_notifs(tent_notifi_info *info);

/* Caller: status is writable. */
int tent_task_status(tent_engine_t engine, tent_batch_id_t batch_id, size_t task_id,
                     tent_status_t *status);

int tent_cancel_task(tent_engine_t engine, tent_batch_id_t batch_id, size_t task_id);

/* COMPLETED when all completed; the worst ending once all ended; PENDING or WAITING before.
 * Caller: status is writable. */
int tent_overall_status(tent_engine_t engine, tent_batch_id_t batch_id, tent_status_t *status);

/* 1 for a live engine handle, 0 otherwise. */
int tent_available(tent_engine_t engine);

/* As tent_register_memory with a PERM_* permission. */
int tent_register_memory_with_perm(tent_engine_t engine, void *addr, size_t size,
                                   int permission);

/* Registers count ranges, all or none. Caller: addrs and sizes are readable for count
 * entries; every range is memory of this process kept allocated until unregistered. */
int tent_register_memory_batch(tent_engine_t engine, void **addrs, size_t *sizes, size_t count,
                               int permission);

/* Unregisters count regions (each tried; a failure is reported). Caller: addrs is readable
 * for count pointers; sizes is not used (it may be NULL). */
int tent_unregister_memory_batch(tent_engine_t engine, void **addrs, size_t *sizes, size_t count);

/* As tent_allocate_memory, tent_register_memory and tent_register_memory_batch with options.
 * Caller: opts is NULL or readable. */
int tent_allocate_memory_ex(tent_engine_t engine, void **addr, size_t size,
                            tent_memory_options_t *opts);
int tent_register_memory_ex(tent_engine_t engine, void *addr, size_t size,
                            tent_memory_options_t *opts);
int tent_register_memory_batch_ex(tent_engine_t engine, void **addrs, size_t *sizes,
                                  size_t count, tent_memory_options_t *opts);

/* Every task's status, up to *count of them; *count becomes the number of tasks.
 * Caller: count is readable and writable; statuses is writable for *count entries. */
int tent_task_status_list(tent_engine_t engine, tent_batch_id_t batch_id,
                          tent_status_t *statuses, size_t *count);

struct tent_nic_load_stat {
    char device_name[64];
    uint64_t inflight_bytes;
    double ewma_bandwidth_bps;
};
typedef struct tent_nic_load_stat tent_nic_load_stat_t;

/* Each NIC's load, up to *count entries; *count becomes how many there are.
 * Caller: count is readable and writable; stats is writable for *count entries. */
int tent_get_nic_load_stats(tent_engine_t engine, tent_nic_load_stat_t *stats, size_t *count);

#ifdef __cplusplus
}
#endif

#endif /* TENT_API_H */
