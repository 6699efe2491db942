/*
 * transfer_engine_c.h: te's libtransfer_engine.so, the C API of Mooncake's Transfer Engine
 * (0.3.13) on te. Same symbols, types, struct layouts, constants and return conventions as
 * Mooncake's header, so a program built against Mooncake's library runs on te's unchanged.
 *
 * Return conventions (Mooncake's, mixed):
 *   - createTransferEngine: a handle, or NULL on failure;
 *   - registration, segments, notifications: 0, or a negative ERR_* code
 *     (-1 invalid argument, -3 address not registered, -4 busy, -7 address overlapped, ...);
 *   - submitTransfer, submitTransferWithNotify, getTransferStatus, freeBatchID: 0, or a
 *     positive Status code (1 invalid argument, 3 address not registered, 4 batch busy, ...);
 *   - allocateBatchID: a batch id, or INVALID_BATCH.
 *
 * What te adds at the boundary: an engine handle is looked up, never dereferenced, so a
 * destroyed, stale or made-up handle gives the error above instead of a crash; batch ids are
 * checked the same way; NULL pointers, counts whose bytes overflow and strings that are not
 * UTF-8 are refused; no Rust panic unwinds into C.
 *
 * Contracts on the caller's pointers are stated with each function ("Caller:"). As in
 * Mooncake, no "char *" argument is kept after the call returns.
 */

#ifndef TRANSFER_ENGINE_C
#define TRANSFER_ENGINE_C

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define segment_handle_t int32_t
#define segment_id_t int32_t
#define batch_id_t uint64_t
#define LOCAL_SEGMENT (0)
#define INVALID_BATCH UINT64_MAX

#define OPCODE_READ (0)
#define OPCODE_WRITE (1)

/* One transfer: `length` bytes between local `source` and `target_offset` (an address) in
 * segment `target_id`. */
struct transfer_request {
    int opcode;
    void *source;
    segment_id_t target_id;
    uint64_t target_offset;
    uint64_t length;
};
typedef struct transfer_request transfer_request_t;

/* A notification: who sends it and what it says (NUL-terminated strings). */
struct notify_msg {
    char *name;
    char *msg;
};
typedef struct notify_msg notify_msg_t;

#define STATUS_WAITING (0)
#define STATUS_PENDING (1)
#define STATUS_INVALID (2)
#define STATUS_CANCELED (3)
#define STATUS_COMPLETED (4)
#define STATUS_TIMEOUT (5)
#define STATUS_FAILED (6)

struct transfer_status {
    int status;
    uint64_t transferred_bytes;
};

/* Mooncake's legacy segment description: no function takes it; kept for source
 * compatibility. */
struct segment_desc {
    int type;
    union {
        struct {
            void *addr;
            uint64_t size;
            const char *location;
        } rdma;
        struct {
            const char *file_path;
            const char *subsystem_name;
            const char *proto;
            const char *ip;
            uint64_t port;
        } nvmeof;
    } desc_;
};

typedef struct transfer_status transfer_status_t;

struct buffer_entry {
    void *addr;
    size_t length;
};
typedef struct buffer_entry buffer_entry_t;

typedef struct segment_desc segment_desc_t;
typedef void *transfer_engine_t;
typedef void *transport_t;

/* Starts an engine named `local_server_name` (peer to peer, "P2PHANDSHAKE": its host, the
 * port picked by te; with a metadata service, "etcd://", "redis://", "http://": the name as
 * given, with ":rpc_port" added when it has no port and rpc_port is not 0). A non-empty
 * `ip_or_host_name` is the host peers reach peer to peer. `auto_discover` != 0 installs
 * transports as Mooncake's discovery does (RDMA where there are devices and MC_FORCE_TCP is
 * unset, TCP otherwise); 0 installs none (call installTransport).
 * Returns a handle, or NULL on failure.
 * Caller: the strings are NUL-terminated (ip_or_host_name may be NULL). */
transfer_engine_t createTransferEngine(const char *metadata_conn_string,
                                       const char *local_server_name,
                                       const char *ip_or_host_name,
                                       uint64_t rpc_port, int auto_discover);

/* te discovers the topology at start: 0 (-1 for a bad handle). */
int discoverTopology(transfer_engine_t engine);

/* Writes the segment name ("ip:port" peer to peer, what peers pass to openSegment) and a NUL.
 * Returns 0, or -1 for a bad handle or a buffer too small.
 * Caller: buf_out is writable for buf_len bytes. */
int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);

/* Installs "tcp", or "rdma" on the devices named by args[0] (a comma-separated list; NULL,
 * or Mooncake's NIC priority matrix JSON, means every device: te discovers its own
 * topology). Returns a non-NULL token (the same one again for a protocol installed already,
 * as Mooncake does), or NULL on failure (unknown protocol, no RDMA device).
 * Caller: proto is NUL-terminated; args is NULL or holds at least one pointer, and args[0]
 * is NULL or NUL-terminated. */
transport_t installTransport(transfer_engine_t engine, const char *proto, void **args);

/* te cannot remove an installed transport (it goes with the engine): returns -303
 * (ERR_NOT_IMPLEMENTED), or -1 for a bad handle or string.
 * Caller: proto is NUL-terminated. */
int uninstallTransport(transfer_engine_t engine, const char *proto);

/* Opens a peer's segment by name (the handshake): its id >= 0 (the engine's own name gives
 * LOCAL_SEGMENT), or a negative ERR_* code.
 * Caller: segment_name is NUL-terminated. */
segment_id_t openSegment(transfer_engine_t engine, const char *segment_name);

/* As openSegment, fetching the descriptor again even when it is cached. */
segment_id_t openSegmentNoCache(transfer_engine_t engine, const char *segment_name);

/* Closes a segment: 0, or a negative ERR_* code. */
int closeSegment(transfer_engine_t engine, segment_id_t segment_id);

/* EFA pre-connection in Mooncake; te has no EFA transport: 0 (-1 for a bad handle or
 * string). Caller: segment_name is NUL-terminated. */
int warmupEfaSegment(transfer_engine_t engine, const char *segment_name);

/* Not offered by te (destroying the engine withdraws its segment): -303, or -1 for a bad
 * handle or string. Caller: segment_name is NUL-terminated. */
int removeLocalSegment(transfer_engine_t engine, const char *segment_name);

/* Shuts the engine down (listeners closed, memory unregistered) and invalidates the handle:
 * later calls with it return errors. Unknown handles are ignored. */
void destroyTransferEngine(transfer_engine_t engine);

/* Registers [addr, addr+length) at `location` ("*": found by te; "cpu:N"; "cuda:N"); peers
 * may read and write it when remote_accessible != 0. Returns 0, or a negative ERR_* code
 * (-1 bad argument, -7 overlaps a registered region).
 * Caller: location is NUL-terminated; the range is memory of this process that stays
 * allocated until it is unregistered (peers write into it from te's threads). */
int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length,
                        const char *location, int remote_accessible);

/* Unregisters the region starting at addr, waiting up to 2 s for peers' requests that still
 * hold it. Returns 0, or -3 (not a region's start) or -4 (still busy). */
int unregisterLocalMemory(transfer_engine_t engine, void *addr);

/* Registers buffer_len ranges, all or none, remotely accessible. Returns 0 or a negative
 * ERR_* code.
 * Caller: buffer_list is readable for buffer_len entries; location is NUL-terminated; each
 * range is memory of this process kept allocated until unregistered. */
int registerLocalMemoryBatch(transfer_engine_t engine, buffer_entry_t *buffer_list,
                             size_t buffer_len, const char *location);

/* Unregisters addr_len regions, all or none: 0, or a negative ERR_* code.
 * Caller: addr_list is readable for addr_len pointers. */
int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list, size_t addr_len);

/* A batch of batch_size tasks (1 .. MC_MAX_BATCH_SIZE), or INVALID_BATCH. */
batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);

/* Adds `count` requests to the batch (repeatable until it is full). Returns 0, or a positive
 * Status code (1 invalid argument or handle, 2 too many requests, 3 a range not registered
 * on either side, ...). Nothing is added unless every request is valid.
 * Caller: entries is readable for `count` requests; each local range lies in memory
 * registered with this engine (te checks it), kept allocated until the task ends. */
int submitTransfer(transfer_engine_t engine, batch_id_t batch_id,
                   struct transfer_request *entries, size_t count);

/* As submitTransfer; once every task of the batch has completed, the owner of the first
 * request's segment receives notify_msg (after the data).
 * Caller: as submitTransfer; notify_msg.name and .msg are NUL-terminated. */
int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
                             struct transfer_request *entries, size_t count,
                             notify_msg_t notify_msg);

/* The notifications received (drained): a malloc'd array of *size entries with malloc'd
 * strings, or NULL (and *size 0) when there are none. Free it with freeNotifsMsgBuf.
 * Caller: size is writable for one int. */
notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size);

/* Frees an array from getNotifsFromEngine: 0.
 * Caller: msg is NULL or such an array of `size` entries, not freed before. */
int freeNotifsMsgBuf(notify_msg_t *msg, int size);

/* Sends notify_msg to the owner of segment target_id (an id from openSegment, or
 * LOCAL_SEGMENT) without a transfer: 0, or a negative ERR_* code.
 * Caller: notify_msg.name and .msg are NUL-terminated. */
int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id, notify_msg_t notify_msg);

/* Fills *status with task task_id of the batch: 0, or a positive Status code (then
 * status->status is STATUS_INVALID).
 * Caller: status is writable for one struct transfer_status. */
int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
                      struct transfer_status *status);

/* te's extension, not in Mooncake's header: waits up to timeout_us microseconds for every
 * task of the batch to end, asleep (no polling, no spinning core), and fills *status with the
 * batch's state and bytes moved: a terminal state (COMPLETED, or the worst of FAILED, TIMEOUT,
 * CANCELED) when it ended, STATUS_WAITING or STATUS_PENDING when the time ran out first.
 * Returns 0, or a positive Status code (then status->status is STATUS_INVALID). The batch is
 * not freed: call freeBatchID after it ended.
 * Caller: status is writable for one struct transfer_status. */
int te_waitBatch(transfer_engine_t engine, batch_id_t batch_id, uint64_t timeout_us,
                 struct transfer_status *status);

/* te's extension: cancels a batch: no more of its slices start, those on the wire finish, and
 * it ends CANCELED (or COMPLETED, when nothing was left). Returns 0, or a positive Status code
 * (1 for an unknown or freed batch). The batch is not freed: wait for its end (te_waitBatch),
 * then call freeBatchID. */
int te_cancelBatch(transfer_engine_t engine, batch_id_t batch_id);

/* te's extension: opens the regular file at path as a segment, READ only or, with writable,
 * READ and WRITE. Returns its segment id (submitTransfer's target_id; a request's
 * target_offset is the file offset), or a negative ERR_* code (a missing, empty or irregular
 * file, one that cannot be opened so, no file transport installed). The file keeps its size.
 * Caller: path is a NUL-terminated string. */
segment_id_t te_openFile(transfer_engine_t engine, const char *path, int writable);

/* te's extension (Mooncake's Python API has it as allocate_managed_buffer): length bytes the
 * engine allocates and registers for peers to read and write: shared memory where shm runs (a
 * process on this host maps it, whatever ptrace allows), the CXL device where cxl runs without
 * shm, else host memory. Returns the address, or NULL. Free with te_freeManagedBuffer; the
 * engine frees what is left when destroyed. */
void *te_allocateManagedBuffer(transfer_engine_t engine, size_t length);

/* te's extension: unregisters and frees a buffer from te_allocateManagedBuffer, length as
 * allocated: 0, or a negative ERR_* code (not such a buffer, or another length). */
int te_freeManagedBuffer(transfer_engine_t engine, void *addr, size_t length);

/* te's extension: the engine's figures as JSON and a NUL (TENT's totals by name, such as
 * "tent_write_bytes_total", then "series": per transport and operation, requests, bytes,
 * failures by kind, latency and size histograms; see te's docs/metrics.md). With count 0 or 1,
 * counting is switched off or on first (it is off unless TENT_METRICS_ENABLED or MC_TE_METRIC
 * is set); -1 leaves it. Returns 0, or ERR_INVALID_ARGUMENT for a bad handle, a count other
 * than -1/0/1 or a buffer too small.
 * Caller: buf_out is writable for buf_len bytes. */
int te_getMetrics(transfer_engine_t engine, char *buf_out, size_t buf_len, int count);

/* Frees a batch whose tasks have all ended: 0, or a positive Status code (4 while tasks
 * still move, 1 for an unknown or freed batch). */
int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);

/* Fetches every open segment's descriptor again: 0, or a negative ERR_* code. */
int syncSegmentCache(transfer_engine_t engine);

struct nic_load_stat {
    char device_name[64];
    uint64_t inflight_bytes;
    double ewma_bandwidth_bps;
};
typedef struct nic_load_stat nic_load_stat_t;

/* Fills up to *count entries with each NIC's (rail's) load and sets *count to how many
 * there are. Returns 0; -1 for NULL arguments; a positive Status code for a bad handle.
 * Caller: count is readable and writable; stats is writable for *count entries (it may be
 * NULL when *count is 0, to ask how many there are). */
int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats, size_t *count);

/* te always shuts down gracefully on destroyTransferEngine: nothing to enable. */
void enableGracefulShutdown(transfer_engine_t engine);

/* Writes the link table (one line per rail, or a JSON array when json != 0) and a NUL.
 * Returns 0, or -1 for a bad handle or a buffer too small.
 * Caller: buf_out is writable for buf_len bytes. */
int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len, int json);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFER_ENGINE_C */
