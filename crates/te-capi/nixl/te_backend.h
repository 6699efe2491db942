/*
 * te_backend.h: NIXL's backend "TE", a nixlBackendEngine over te's C API (transfer_engine_c.h).
 *
 * One te engine per NIXL agent, peer to peer (P2PHANDSHAKE): the connection info NIXL passes
 * between agents is the engine's segment name, and loading it opens the peer's segment. A
 * prepared transfer is one te batch per post, of any number of descriptors; checkXfer asks te
 * for the batch's state in one call (te_waitBatch with no time), and releaseReqH cancels what
 * is still moving and waits for it to end before the handle goes. Notifications ride on te's
 * (after the data of a transfer, or alone).
 */
#ifndef TE_NIXL_BACKEND_H
#define TE_NIXL_BACKEND_H

#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "nixl_abi.h"
#include "transfer_engine_c.h"

namespace te_nixl {

/* What one of the plugin's MD objects stands for. */
enum class RegionKind {
    memory,      /* this agent's registered DRAM or VRAM; also the target of its own transfers */
    peer_memory, /* a peer's registered memory, loaded from its public data */
    file,        /* a file of this agent, opened as a te file segment */
    peer_file,   /* a peer's file: te moves file bytes for their own process only */
};

/* A registration as the agent names it: memory kind, address, length, device. */
using RegionKey = std::tuple<int, uintptr_t, size_t, uint64_t>;

inline RegionKey regionKey(nixl_mem_t mem, uintptr_t base, size_t len, uint64_t dev) {
    return {static_cast<int>(mem), base, len, dev};
}

struct Region : public nixlBackendMD {
    Region(RegionKind kind, uintptr_t base, size_t len, nixl_mem_t mem, uint64_t dev = 0)
        : nixlBackendMD(kind == RegionKind::memory || kind == RegionKind::file),
          kind(kind), base(base), len(len), mem(mem), dev(dev) {}

    RegionKey key() const { return regionKey(mem, base, len, dev); }

    RegionKind kind;
    uintptr_t base;
    size_t len;
    nixl_mem_t mem;
    uint64_t dev;
    /* te's segment of a file; unused for memory. */
    segment_id_t segment = LOCAL_SEGMENT;
    /* Registrations of the same range share one te registration. */
    int refs = 1;
};

/* One prepared transfer: te's requests, built once at prepXfer, and the batch of its latest
 * post. */
struct Request : public nixlBackendReqH {
    std::vector<transfer_request_t> requests;
    std::string remote_agent;
    bool to_self = false;
    batch_id_t batch = INVALID_BATCH;
    /* A notification for this agent itself, delivered when the transfer completes. */
    bool self_notif = false;
    std::string self_notif_msg;
};

class Backend : public nixlBackendEngine {
public:
    explicit Backend(const nixlBackendInitParams *init);
    ~Backend() override;

    bool supportsRemote() const override { return true; }
    bool supportsLocal() const override { return true; }
    bool supportsNotif() const override { return true; }
    nixl_mem_list_t getSupportedMems() const override;

    nixl_status_t
    registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem, nixlBackendMD *&out) override;
    nixl_status_t deregisterMem(nixlBackendMD *meta) override;

    nixl_status_t connect(const std::string &remote_agent) override;
    nixl_status_t disconnect(const std::string &remote_agent) override;
    nixl_status_t unloadMD(nixlBackendMD *input) override;

    nixl_status_t prepXfer(const nixl_xfer_op_t &operation,
                           const nixl_meta_dlist_t &local,
                           const nixl_meta_dlist_t &remote,
                           const std::string &remote_agent,
                           nixlBackendReqH *&handle,
                           const nixl_opt_b_args_t *opt_args) const override;
    nixl_status_t postXfer(const nixl_xfer_op_t &operation,
                           const nixl_meta_dlist_t &local,
                           const nixl_meta_dlist_t &remote,
                           const std::string &remote_agent,
                           nixlBackendReqH *&handle,
                           const nixl_opt_b_args_t *opt_args) const override;
    nixl_status_t checkXfer(nixlBackendReqH *handle) const override;
    nixl_status_t releaseReqH(nixlBackendReqH *handle) const override;

    nixl_status_t getPublicData(const nixlBackendMD *meta, std::string &str) const override;
    nixl_status_t getConnInfo(std::string &str) const override;
    nixl_status_t loadRemoteConnInfo(const std::string &remote_agent,
                                     const std::string &remote_conn_info) override;
    nixl_status_t loadRemoteMD(const nixlBlobDesc &input,
                               const nixl_mem_t &nixl_mem,
                               const std::string &remote_agent,
                               nixlBackendMD *&output) override;
    nixl_status_t loadLocalMD(nixlBackendMD *input, nixlBackendMD *&output) override;

    nixl_status_t getNotifs(notif_list_t &notif_list) override;
    nixl_status_t genNotif(const std::string &remote_agent, const std::string &msg) const override;

private:
    /* The peer's segment id, or a negative value when its connection info was not loaded. */
    segment_id_t peerSegment(const std::string &agent) const;
    /* Ends a post's batch: frees it once it has ended (cancelling it first with `cancel`).
     * False when it did not end within the release limit (it is kept). */
    bool endBatch(Request &req, bool cancel) const;
    void queueSelfNotif(const std::string &msg) const;

    transfer_engine_t engine_ = nullptr;
    std::string segment_name_;
    /* How long releaseReqH waits for a cancelled transfer to end. */
    uint64_t release_ms_ = 0;
    bool file_transport_ = false;

    mutable std::mutex lock_;
    std::unordered_map<std::string, segment_id_t> peers_;
    /* This agent's registrations. */
    std::map<RegionKey, Region *> regions_;
    mutable std::deque<std::pair<std::string, std::string>> self_notifs_;
};

/* The memory kinds TE serves. */
nixl_mem_list_t supportedMems();

/* The options create_backend takes, with their defaults ("" = chosen at start). */
nixl_b_params_t backendOptions();

/* Notification text on te's wire (which carries UTF-8 strings) for NIXL's byte strings:
 * printable ASCII but '%' as is, every other byte as %XX. */
std::string encodeNotif(const std::string &bytes);
/* The inverse; a string that is not such an encoding comes back as it is. */
std::string decodeNotif(const std::string &text);

} // namespace te_nixl

#endif /* TE_NIXL_BACKEND_H */
