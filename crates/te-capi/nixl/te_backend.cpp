/*
 * te_backend.cpp: the TE backend's engine (see te_backend.h).
 */
#include "te_backend.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace te_nixl {

namespace {

/* The plugin's options (create_backend's parameters). */
constexpr const char *option_ip = "ip_address";
constexpr const char *option_protocol = "protocol";
constexpr const char *option_release_ms = "release_timeout_ms";

/* Connection info is "te/1 <segment name>"; longer ones are refused before parsing. */
constexpr const char *conn_prefix = "te/1 ";
constexpr size_t max_conn_info = 512;
/* Public data is "te/1 <kind> <base> <length>". */
constexpr const char *public_prefix = "te/1 ";
constexpr size_t max_public_data = 128;

void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void warn(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    std::fprintf(stderr, "te nixl: ");
    std::vfprintf(stderr, fmt, args);
    std::fputc('\n', stderr);
    va_end(args);
}

/* The first IPv4 address of an interface that is up and not loopback, else 127.0.0.1: the
 * host peers on other machines reach (NIXL_TE_IP_ADDR or the ip_address option choose). */
std::string defaultHost() {
    if (const char *env = std::getenv("NIXL_TE_IP_ADDR"); env && *env) {
        return env;
    }
    std::string found = "127.0.0.1";
    ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0) {
        return found;
    }
    for (ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET) {
            continue;
        }
        if ((ifa->ifa_flags & IFF_LOOPBACK) || !(ifa->ifa_flags & IFF_UP) ||
            !(ifa->ifa_flags & IFF_RUNNING)) {
            continue;
        }
        char host[NI_MAXHOST];
        if (getnameinfo(ifa->ifa_addr, sizeof(sockaddr_in), host, sizeof host, nullptr, 0,
                        NI_NUMERICHOST) == 0) {
            found = host;
            break;
        }
    }
    freeifaddrs(list);
    return found;
}

/* What one of te's (Mooncake's) negative error codes means; te logs its own reason (at
 * WARNING, MC_LOG_LEVEL's default). */
const char *teError(int code) {
    switch (code) {
    case -1:
        return "invalid argument";
    case -2:
        return "too many requests";
    case -3:
        return "not registered, or not allowed";
    case -4:
        return "busy";
    case -7:
        return "overlaps a registered range";
    case -8:
        return "no transport or device for it (no GPU, for VRAM)";
    case -102:
        return "connection failed or timed out";
    case -103:
        return "malformed reply";
    case -104:
        return "refused by the peer";
    case -200:
        return "metadata";
    case -202:
        return "transport failure";
    }
    return "error";
}

const char *kindName(RegionKind kind) {
    switch (kind) {
    case RegionKind::memory:
    case RegionKind::peer_memory:
        return "memory";
    case RegionKind::file:
    case RegionKind::peer_file:
        return "file";
    }
    return "?";
}

bool parseU64(const std::string &text, uint64_t &out) {
    if (text.empty() || text.size() > 20) {
        return false;
    }
    uint64_t v = 0;
    for (char c : text) {
        if (c < '0' || c > '9') {
            return false;
        }
        const uint64_t digit = static_cast<uint64_t>(c - '0');
        if (v > (UINT64_MAX - digit) / 10) {
            return false;
        }
        v = v * 10 + digit;
    }
    out = v;
    return true;
}

/* NIXL's status for a batch that ended otherwise than completed. */
nixl_status_t endedStatus(int state) {
    switch (state) {
    case STATUS_CANCELED:
        return NIXL_ERR_CANCELED;
    default:
        return NIXL_ERR_BACKEND;
    }
}

const char *stateName(int state) {
    switch (state) {
    case STATUS_WAITING:
        return "WAITING";
    case STATUS_PENDING:
        return "PENDING";
    case STATUS_INVALID:
        return "INVALID";
    case STATUS_CANCELED:
        return "CANCELED";
    case STATUS_COMPLETED:
        return "COMPLETED";
    case STATUS_TIMEOUT:
        return "TIMEOUT";
    case STATUS_FAILED:
        return "FAILED";
    }
    return "?";
}

bool terminal(int state) {
    return state != STATUS_WAITING && state != STATUS_PENDING;
}

} // namespace

std::string encodeNotif(const std::string &bytes) {
    static const char hex[] = "0123456789ABCDEF";
    std::string out;
    out.reserve(bytes.size());
    for (unsigned char c : bytes) {
        if (c >= 0x20 && c < 0x7f && c != '%') {
            out.push_back(static_cast<char>(c));
        } else {
            out.push_back('%');
            out.push_back(hex[c >> 4]);
            out.push_back(hex[c & 15]);
        }
    }
    return out;
}

std::string decodeNotif(const std::string &text) {
    auto nibble = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '%') {
            out.push_back(text[i]);
            continue;
        }
        if (i + 2 >= text.size()) {
            return text;
        }
        const int hi = nibble(text[i + 1]);
        const int lo = nibble(text[i + 2]);
        if (hi < 0 || lo < 0) {
            return text;
        }
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
    }
    return out;
}

Backend::Backend(const nixlBackendInitParams *init) : nixlBackendEngine(init) {
    const nixl_b_params_t options = backendOptions();
    for (const auto &[key, value] : params()) {
        if (!options.count(key)) {
            warn("backend option \"%s\" is not one of TE's (%s, %s, %s)", key.c_str(), option_ip,
                 option_protocol, option_release_ms);
            initErr = true;
            return;
        }
    }
    const std::string *ms = param(option_release_ms);
    if (!ms) {
        ms = &options.at(option_release_ms);
    }
    if (!parseU64(*ms, release_ms_)) {
        warn("backend option %s=\"%s\" is not a number of milliseconds", option_release_ms,
             ms->c_str());
        initErr = true;
        return;
    }
    const std::string *ip = param(option_ip);
    const std::string host = ip && !ip->empty() ? *ip : defaultHost();
    /* "auto": every transport te can start here (RDMA, TCP, same-host copies, files); te
     * picks one per peer and buffer. */
    std::string protocol = options.at(option_protocol);
    if (const std::string *p = param(option_protocol); p && !p->empty()) {
        protocol = *p;
    } else if (const char *env = std::getenv("NIXL_TE_PROTOCOL"); env && *env) {
        protocol = env;
    }
    engine_ = createTransferEngine("P2PHANDSHAKE", host.c_str(), host.c_str(), 0, 0);
    if (!engine_) {
        warn("te's engine did not start on host %s (see te's log above)", host.c_str());
        initErr = true;
        return;
    }
    file_transport_ = protocol == "auto" || protocol == "io_uring";
    if (!installTransport(engine_, protocol.c_str(), nullptr)) {
        warn("te cannot install transport \"%s\" (see te's log above)", protocol.c_str());
        initErr = true;
        return;
    }
    char name[256];
    if (getLocalIpAndPort(engine_, name, sizeof name) != 0) {
        warn("te's engine has no segment name");
        initErr = true;
        return;
    }
    segment_name_ = name;
}

Backend::~Backend() {
    for (auto &[key, region] : regions_) {
        delete region;
    }
    if (engine_) {
        destroyTransferEngine(engine_);
    }
}

nixl_b_params_t backendOptions() {
    return {{option_ip, ""}, {option_protocol, "auto"}, {option_release_ms, "10000"}};
}

nixl_mem_list_t supportedMems() {
    return {DRAM_SEG, VRAM_SEG, FILE_SEG};
}

nixl_mem_list_t Backend::getSupportedMems() const {
    return supportedMems();
}

nixl_status_t
Backend::registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem, nixlBackendMD *&out) {
    std::lock_guard<std::mutex> guard(lock_);
    const RegionKey key = regionKey(nixl_mem, mem.addr, mem.len, mem.devId);
    if (auto it = regions_.find(key); it != regions_.end()) {
        it->second->refs++;
        out = it->second;
        return NIXL_SUCCESS;
    }
    Region *region = nullptr;
    switch (nixl_mem) {
    case DRAM_SEG:
    case VRAM_SEG: {
        if (mem.len == 0) {
            warn("registering %s at 0x%" PRIxPTR ": an empty range",
                 nixl_mem == DRAM_SEG ? "DRAM" : "VRAM", mem.addr);
            return NIXL_ERR_INVALID_PARAM;
        }
        /* DRAM's devId is the caller's (vLLM puts its TP rank there): te finds the node. */
        const std::string location =
            nixl_mem == DRAM_SEG ? std::string("*") : "cuda:" + std::to_string(mem.devId);
        const int rc = registerLocalMemory(engine_, reinterpret_cast<void *>(mem.addr), mem.len,
                                           location.c_str(), 1);
        if (rc != 0) {
            warn("registering %zu bytes at 0x%" PRIxPTR " (%s) failed: te error %d (%s)", mem.len,
                 mem.addr, location.c_str(), rc, teError(rc));
            return nixl_mem == VRAM_SEG ? NIXL_ERR_NOT_SUPPORTED : NIXL_ERR_BACKEND;
        }
        region = new Region(RegionKind::memory, mem.addr, mem.len, nixl_mem, mem.devId);
        break;
    }
    case FILE_SEG: {
        /* te moves file bytes through its io_uring transport, installed with the first file. */
        if (!file_transport_) {
            if (!installTransport(engine_, "io_uring", nullptr)) {
                warn("te's file transport (io_uring) did not start");
                return NIXL_ERR_NOT_SUPPORTED;
            }
            file_transport_ = true;
        }
        /* NIXL names a file by its descriptor (devId); te opens it by path. */
        const std::string path = "/proc/self/fd/" + std::to_string(mem.devId);
        segment_id_t seg = te_openFile(engine_, path.c_str(), 1);
        if (seg < 0) {
            seg = te_openFile(engine_, path.c_str(), 0);
        }
        if (seg < 0) {
            warn("opening file descriptor %" PRIu64 " as a te segment failed: te error %d (%s)",
                 mem.devId, seg, teError(seg));
            return NIXL_ERR_BACKEND;
        }
        region = new Region(RegionKind::file, mem.addr, mem.len, nixl_mem, mem.devId);
        region->segment = seg;
        break;
    }
    default:
        warn("memory kind %d is not TE's (DRAM, VRAM, FILE)", static_cast<int>(nixl_mem));
        return NIXL_ERR_NOT_SUPPORTED;
    }
    regions_.emplace(key, region);
    out = region;
    return NIXL_SUCCESS;
}

nixl_status_t Backend::deregisterMem(nixlBackendMD *meta) {
    auto *region = static_cast<Region *>(meta);
    std::lock_guard<std::mutex> guard(lock_);
    auto it = regions_.find(region->key());
    if (it == regions_.end() || it->second != region) {
        warn("deregistering a range TE did not register");
        return NIXL_ERR_NOT_FOUND;
    }
    if (--region->refs > 0) {
        return NIXL_SUCCESS;
    }
    int rc = 0;
    if (region->kind == RegionKind::file) {
        rc = closeSegment(engine_, region->segment);
    } else {
        rc = unregisterLocalMemory(engine_, reinterpret_cast<void *>(region->base));
    }
    if (rc != 0) {
        /* Still in use by a peer's request: kept, so a later deregistration can try again. */
        region->refs++;
        warn("deregistering %s at 0x%" PRIxPTR " failed: te error %d (%s)", kindName(region->kind),
             region->base, rc, teError(rc));
        return NIXL_ERR_BACKEND;
    }
    regions_.erase(it);
    delete region;
    return NIXL_SUCCESS;
}

nixl_status_t Backend::connect(const std::string &remote_agent) {
    if (remote_agent == localAgent || peerSegment(remote_agent) >= 0) {
        return NIXL_SUCCESS;
    }
    warn("connect to agent \"%s\": its connection info was not loaded", remote_agent.c_str());
    return NIXL_ERR_NOT_FOUND;
}

nixl_status_t Backend::disconnect(const std::string &remote_agent) {
    std::lock_guard<std::mutex> guard(lock_);
    auto it = peers_.find(remote_agent);
    if (it == peers_.end()) {
        return NIXL_SUCCESS;
    }
    closeSegment(engine_, it->second);
    peers_.erase(it);
    return NIXL_SUCCESS;
}

nixl_status_t Backend::unloadMD(nixlBackendMD *input) {
    auto *region = static_cast<Region *>(input);
    /* A local registration loaded as its own target is the registration itself. */
    if (region->kind == RegionKind::peer_memory || region->kind == RegionKind::peer_file) {
        delete region;
    }
    return NIXL_SUCCESS;
}

nixl_status_t Backend::getPublicData(const nixlBackendMD *meta, std::string &str) const {
    const auto *region = static_cast<const Region *>(meta);
    str = std::string(public_prefix) + kindName(region->kind) + " " +
          std::to_string(region->base) + " " + std::to_string(region->len);
    return NIXL_SUCCESS;
}

nixl_status_t Backend::getConnInfo(std::string &str) const {
    str = std::string(conn_prefix) + segment_name_;
    return NIXL_SUCCESS;
}

nixl_status_t Backend::loadRemoteConnInfo(const std::string &remote_agent,
                                          const std::string &remote_conn_info) {
    const size_t prefix = std::strlen(conn_prefix);
    if (remote_conn_info.size() > max_conn_info ||
        remote_conn_info.compare(0, prefix, conn_prefix) != 0 ||
        remote_conn_info.size() == prefix) {
        warn("agent \"%s\": connection info is not TE's (\"%s<segment>\", at most %zu bytes)",
             remote_agent.c_str(), conn_prefix, max_conn_info);
        return NIXL_ERR_INVALID_PARAM;
    }
    const std::string segment = remote_conn_info.substr(prefix);
    for (unsigned char c : segment) {
        if (c <= 0x20 || c >= 0x7f) {
            warn("agent \"%s\": segment name in its connection info is not printable",
                 remote_agent.c_str());
            return NIXL_ERR_INVALID_PARAM;
        }
    }
    const segment_id_t id = openSegment(engine_, segment.c_str());
    if (id < 0) {
        warn("agent \"%s\": opening its segment %s failed: te error %d (%s)", remote_agent.c_str(),
             segment.c_str(), id, teError(id));
        return NIXL_ERR_BACKEND;
    }
    std::lock_guard<std::mutex> guard(lock_);
    auto [it, inserted] = peers_.try_emplace(remote_agent, id);
    if (!inserted && it->second != id) {
        closeSegment(engine_, it->second);
        it->second = id;
    }
    return NIXL_SUCCESS;
}

nixl_status_t Backend::loadRemoteMD(const nixlBlobDesc &input,
                                    const nixl_mem_t &nixl_mem,
                                    const std::string &remote_agent,
                                    nixlBackendMD *&output) {
    const std::string &data = input.metaInfo;
    const size_t prefix = std::strlen(public_prefix);
    bool ok = data.size() <= max_public_data && data.compare(0, prefix, public_prefix) == 0;
    std::string fields[3];
    if (ok) {
        size_t pos = prefix;
        for (int i = 0; i < 3 && ok; ++i) {
            const size_t end = i < 2 ? data.find(' ', pos) : data.size();
            ok = end != std::string::npos && end > pos;
            if (ok) {
                fields[i] = data.substr(pos, end - pos);
                pos = end + 1;
            }
        }
    }
    uint64_t base = 0;
    uint64_t len = 0;
    ok = ok && (fields[0] == "memory" || fields[0] == "file") && parseU64(fields[1], base) &&
        parseU64(fields[2], len) && base <= UINT64_MAX - len;
    if (!ok) {
        warn("agent \"%s\": a registration's public data is not TE's", remote_agent.c_str());
        return NIXL_ERR_INVALID_PARAM;
    }
    const RegionKind kind = fields[0] == "memory" ? RegionKind::peer_memory : RegionKind::peer_file;
    output = new Region(kind, base, len, nixl_mem);
    return NIXL_SUCCESS;
}

nixl_status_t Backend::loadLocalMD(nixlBackendMD *input, nixlBackendMD *&output) {
    output = input;
    return NIXL_SUCCESS;
}

segment_id_t Backend::peerSegment(const std::string &agent) const {
    std::lock_guard<std::mutex> guard(lock_);
    auto it = peers_.find(agent);
    return it == peers_.end() ? -1 : it->second;
}

nixl_status_t Backend::prepXfer(const nixl_xfer_op_t &operation,
                                const nixl_meta_dlist_t &local,
                                const nixl_meta_dlist_t &remote,
                                const std::string &remote_agent,
                                nixlBackendReqH *&handle,
                                const nixl_opt_b_args_t *) const {
    if (operation != NIXL_READ && operation != NIXL_WRITE) {
        warn("operation %d is neither READ nor WRITE", static_cast<int>(operation));
        return NIXL_ERR_INVALID_PARAM;
    }
    const int count = local.descCount();
    if (count != remote.descCount()) {
        warn("%d local descriptors against %d remote ones", count, remote.descCount());
        return NIXL_ERR_INVALID_PARAM;
    }
    const bool to_self = remote_agent == localAgent;
    segment_id_t peer = LOCAL_SEGMENT;
    if (!to_self) {
        peer = peerSegment(remote_agent);
        if (peer < 0) {
            warn("agent \"%s\": its connection info was not loaded", remote_agent.c_str());
            return NIXL_ERR_NOT_FOUND;
        }
    }
    auto req = std::make_unique<Request>();
    req->remote_agent = remote_agent;
    req->to_self = to_self;
    req->requests.reserve(static_cast<size_t>(count));
    const int opcode = operation == NIXL_READ ? OPCODE_READ : OPCODE_WRITE;
    for (int i = 0; i < count; ++i) {
        const nixlMetaDesc &l = local[static_cast<size_t>(i)];
        const nixlMetaDesc &r = remote[static_cast<size_t>(i)];
        const auto *lr = static_cast<const Region *>(l.metadataP);
        const auto *rr = static_cast<const Region *>(r.metadataP);
        if (l.len != r.len) {
            warn("descriptor %d: %zu local bytes against %zu remote ones", i, l.len, r.len);
            return NIXL_ERR_INVALID_PARAM;
        }
        if (!lr || !rr || lr->kind != RegionKind::memory) {
            warn("descriptor %d: not a transfer between TE registrations", i);
            return NIXL_ERR_INVALID_PARAM;
        }
        segment_id_t target = peer;
        switch (rr->kind) {
        case RegionKind::memory:
            if (!to_self) {
                warn("descriptor %d: a local registration named for agent \"%s\"", i,
                     remote_agent.c_str());
                return NIXL_ERR_INVALID_PARAM;
            }
            break;
        case RegionKind::peer_memory:
            if (to_self) {
                warn("descriptor %d: a peer's registration named for this agent", i);
                return NIXL_ERR_INVALID_PARAM;
            }
            break;
        case RegionKind::file:
            if (!to_self) {
                warn("descriptor %d: this agent's file named for agent \"%s\"", i,
                     remote_agent.c_str());
                return NIXL_ERR_INVALID_PARAM;
            }
            target = rr->segment;
            break;
        case RegionKind::peer_file:
            warn("descriptor %d: agent \"%s\"'s file: te moves file bytes for the file's own "
                 "process only",
                 i, remote_agent.c_str());
            return NIXL_ERR_NOT_SUPPORTED;
        }
        if (l.len == 0) {
            continue;
        }
        const bool in_local =
            l.addr >= lr->base && l.len <= lr->len && l.addr - lr->base <= lr->len - l.len;
        const bool in_remote = rr->kind == RegionKind::file ||
            (r.addr >= rr->base && r.len <= rr->len && r.addr - rr->base <= rr->len - r.len);
        if (!in_local || !in_remote) {
            warn("descriptor %d: outside the registration that covers it", i);
            return NIXL_ERR_INVALID_PARAM;
        }
        req->requests.push_back(transfer_request_t{opcode, reinterpret_cast<void *>(l.addr),
                                                   target, r.addr, l.len});
    }
    handle = req.release();
    return NIXL_SUCCESS;
}

nixl_status_t Backend::postXfer(const nixl_xfer_op_t &,
                                const nixl_meta_dlist_t &,
                                const nixl_meta_dlist_t &,
                                const std::string &,
                                nixlBackendReqH *&handle,
                                const nixl_opt_b_args_t *opt_args) const {
    auto *req = static_cast<Request *>(handle);
    if (req->batch != INVALID_BATCH && !endBatch(*req, false)) {
        return NIXL_ERR_REPOST_ACTIVE;
    }
    const bool notif = opt_args && opt_args->hasNotif;
    req->self_notif = false;
    if (req->requests.empty()) {
        if (notif) {
            return genNotif(req->remote_agent, opt_args->notifMsg);
        }
        return NIXL_SUCCESS;
    }
    const batch_id_t batch = allocateBatchID(engine_, req->requests.size());
    if (batch == INVALID_BATCH) {
        warn("te gave no batch of %zu tasks (MC_MAX_BATCH_SIZE bounds it)", req->requests.size());
        return NIXL_ERR_BACKEND;
    }
    int rc = 0;
    /* te sends a transfer's notification to the first request's segment once every task has
     * completed; a transfer to this agent itself delivers its own at checkXfer. */
    if (notif && !req->to_self) {
        const std::string name = encodeNotif(localAgent);
        const std::string msg = encodeNotif(opt_args->notifMsg);
        notify_msg_t note{const_cast<char *>(name.c_str()), const_cast<char *>(msg.c_str())};
        rc = submitTransferWithNotify(engine_, batch, req->requests.data(), req->requests.size(),
                                      note);
    } else {
        rc = submitTransfer(engine_, batch, req->requests.data(), req->requests.size());
        if (notif) {
            req->self_notif = true;
            req->self_notif_msg = opt_args->notifMsg;
        }
    }
    if (rc != 0) {
        freeBatchID(engine_, batch);
        warn("te refused a transfer of %zu descriptors: status %d", req->requests.size(), rc);
        return NIXL_ERR_BACKEND;
    }
    req->batch = batch;
    return NIXL_IN_PROG;
}

nixl_status_t Backend::checkXfer(nixlBackendReqH *handle) const {
    auto *req = static_cast<Request *>(handle);
    if (req->batch == INVALID_BATCH) {
        return NIXL_SUCCESS;
    }
    transfer_status st{};
    if (te_waitBatch(engine_, req->batch, 0, &st) != 0) {
        warn("te does not know the transfer's batch");
        req->batch = INVALID_BATCH;
        return NIXL_ERR_BACKEND;
    }
    if (!terminal(st.status)) {
        return NIXL_IN_PROG;
    }
    freeBatchID(engine_, req->batch);
    req->batch = INVALID_BATCH;
    if (st.status != STATUS_COMPLETED) {
        warn("transfer with agent \"%s\" ended %s after %" PRIu64 " bytes",
             req->remote_agent.c_str(), stateName(st.status), st.transferred_bytes);
        return endedStatus(st.status);
    }
    if (req->self_notif) {
        req->self_notif = false;
        queueSelfNotif(req->self_notif_msg);
    }
    return NIXL_SUCCESS;
}

bool Backend::endBatch(Request &req, bool cancel) const {
    transfer_status st{};
    if (te_waitBatch(engine_, req.batch, 0, &st) != 0) {
        req.batch = INVALID_BATCH;
        return true;
    }
    if (!terminal(st.status)) {
        if (!cancel) {
            return false;
        }
        te_cancelBatch(engine_, req.batch);
        if (te_waitBatch(engine_, req.batch, release_ms_ * 1000, &st) != 0) {
            req.batch = INVALID_BATCH;
            return true;
        }
        if (!terminal(st.status)) {
            warn("a cancelled transfer with agent \"%s\" did not end within %" PRIu64 " ms",
                 req.remote_agent.c_str(), release_ms_);
            return false;
        }
    }
    freeBatchID(engine_, req.batch);
    req.batch = INVALID_BATCH;
    return true;
}

nixl_status_t Backend::releaseReqH(nixlBackendReqH *handle) const {
    auto *req = static_cast<Request *>(handle);
    if (req->batch != INVALID_BATCH && !endBatch(*req, true)) {
        /* Its memory may still be written: the handle stays, and NIXL reports the failure. */
        return NIXL_ERR_BACKEND;
    }
    delete req;
    return NIXL_SUCCESS;
}

void Backend::queueSelfNotif(const std::string &msg) const {
    std::lock_guard<std::mutex> guard(lock_);
    self_notifs_.emplace_back(localAgent, msg);
}

nixl_status_t Backend::getNotifs(notif_list_t &notif_list) {
    {
        std::lock_guard<std::mutex> guard(lock_);
        while (!self_notifs_.empty()) {
            notif_list.push_back(std::move(self_notifs_.front()));
            self_notifs_.pop_front();
        }
    }
    int size = 0;
    notify_msg_t *msgs = getNotifsFromEngine(engine_, &size);
    for (int i = 0; i < size; ++i) {
        notif_list.emplace_back(decodeNotif(msgs[i].name), decodeNotif(msgs[i].msg));
    }
    if (msgs) {
        freeNotifsMsgBuf(msgs, size);
    }
    return NIXL_SUCCESS;
}

nixl_status_t Backend::genNotif(const std::string &remote_agent, const std::string &msg) const {
    if (remote_agent == localAgent) {
        queueSelfNotif(msg);
        return NIXL_SUCCESS;
    }
    const segment_id_t seg = peerSegment(remote_agent);
    if (seg < 0) {
        warn("notification to agent \"%s\": its connection info was not loaded",
             remote_agent.c_str());
        return NIXL_ERR_NOT_FOUND;
    }
    const std::string name = encodeNotif(localAgent);
    const std::string text = encodeNotif(msg);
    notify_msg_t note{const_cast<char *>(name.c_str()), const_cast<char *>(text.c_str())};
    const int rc = genNotifyInEngine(engine_, static_cast<uint64_t>(seg), note);
    if (rc != 0) {
        warn("notification to agent \"%s\" failed: te error %d (%s)", remote_agent.c_str(), rc,
             teError(rc));
        return NIXL_ERR_BACKEND;
    }
    return NIXL_SUCCESS;
}

} // namespace te_nixl
