/*
 * nixl_abi.h: te's declarations of NIXL's backend plugin interface (plugin API version 1, the
 * 1.x line's backend headers), written for te from NIXL's published interface.
 *
 * NIXL has no C ABI for backends: its agent passes C++ objects and calls a backend through the
 * vtable of nixlBackendEngine, reads the engine's base members through inline accessors, and
 * walks descriptor lists whose layout it owns. So every class below has NIXL's member order,
 * member types and virtual-function order exactly; a change to any of them breaks the plugin at
 * run time, not at build time. Only what the plugin uses is declared beyond the layouts, and
 * nothing here calls into libnixl: the plugin links against te's library alone.
 */
#ifndef TE_NIXL_ABI_H
#define TE_NIXL_ABI_H

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

/* The plugin API version this plugin implements; NIXL's agent refuses a plugin whose
 * nixlBackendPlugin::api_version differs from its own. */
constexpr int te_nixl_plugin_api_version = 1;

enum nixl_mem_t { DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG };

enum nixl_xfer_op_t { NIXL_READ, NIXL_WRITE };

enum nixl_status_t {
    NIXL_IN_PROG = 1,
    NIXL_SUCCESS = 0,
    NIXL_ERR_NOT_POSTED = -1,
    NIXL_ERR_INVALID_PARAM = -2,
    NIXL_ERR_BACKEND = -3,
    NIXL_ERR_NOT_FOUND = -4,
    NIXL_ERR_MISMATCH = -5,
    NIXL_ERR_NOT_ALLOWED = -6,
    NIXL_ERR_REPOST_ACTIVE = -7,
    NIXL_ERR_UNKNOWN = -8,
    NIXL_ERR_NOT_SUPPORTED = -9,
    NIXL_ERR_REMOTE_DISCONNECT = -10,
    NIXL_ERR_CANCELED = -11,
    NIXL_ERR_NO_TELEMETRY = -12,
};

enum class nixl_thread_sync_t { none, strict, rw };

enum class nixl_cost_t { analytical_backend = 0 };

using nixl_backend_t = std::string;
using nixl_blob_t = std::string;
using nixl_mem_list_t = std::vector<nixl_mem_t>;
using nixl_b_params_t = std::unordered_map<std::string, std::string>;
using nixl_query_resp_t = std::optional<nixl_b_params_t>;
using nixlMemViewH = void *;
/* (sender agent, message) pairs, as getNotifs hands them to the agent. */
using notif_list_t = std::vector<std::pair<std::string, std::string>>;

/* The agent's optional arguments: only ever passed by pointer to estimateXferCost. */
struct nixlAgentOptionalArgs;

/* One event queued for NIXL's telemetry (the base engine keeps a vector of them). */
struct nixlTelemetryEvent {
    uint32_t event_type;
    uint64_t value;
};

/* A range of memory or of a file: address (or file offset), length, device (GPU index, file
 * descriptor, or whatever the caller put there for DRAM). */
class nixlBasicDesc {
public:
    uintptr_t addr;
    size_t len;
    uint64_t devId;
};

/* A registered range with its backend's serialised public data (getPublicData's string, on
 * the loading side). */
class nixlBlobDesc : public nixlBasicDesc {
public:
    nixl_blob_t metaInfo;
};

/* A list of descriptors of one memory kind. NIXL constructs, copies and destroys these; the
 * plugin only reads them. */
template <class T> class nixlDescList {
protected:
    nixl_mem_t type;
    std::vector<T> descs;

public:
    nixlDescList(const nixlDescList &) = delete;
    nixlDescList &operator=(const nixlDescList &) = delete;
    virtual ~nixlDescList() = default;

    nixl_mem_t getType() const { return type; }
    int descCount() const { return static_cast<int>(descs.size()); }
    const T &operator[](size_t index) const { return descs[index]; }
};

/* A backend's object for one registered or loaded range: NIXL keeps the pointer and hands it
 * back in descriptor lists, registration and unloading. */
class nixlBackendMD {
protected:
    bool isPrivateMD;

public:
    explicit nixlBackendMD(bool is_private) : isPrivateMD(is_private) {}
    virtual ~nixlBackendMD() {}
};

/* A backend's object for one prepared transfer. */
class nixlBackendReqH {
public:
    nixlBackendReqH() {}
    virtual ~nixlBackendReqH() {}
};

/* A descriptor in a prepared transfer: the range and the backend object of the registration
 * (local side) or of the loaded remote registration (remote side) that covers it. */
class nixlMetaDesc : public nixlBasicDesc {
public:
    nixlBackendMD *metadataP;
};

struct nixlRemoteMetaDesc : public nixlMetaDesc {
    std::string remoteAgent;
};

using nixl_meta_dlist_t = nixlDescList<nixlMetaDesc>;
using nixl_remote_meta_dlist_t = nixlDescList<nixlRemoteMetaDesc>;
using nixl_reg_dlist_t = nixlDescList<nixlBlobDesc>;

/* Per-post options: a notification to deliver with the transfer, a backend-specific blob. */
struct nixlBackendOptionalArgs {
    nixl_blob_t notifMsg;
    bool hasNotif = false;
    nixl_blob_t customParam;
};
using nixl_opt_b_args_t = nixlBackendOptionalArgs;

/* What the agent passes to create_engine. */
class nixlBackendInitParams {
public:
    std::string localAgent;
    nixl_backend_t type;
    nixl_b_params_t *customParams = nullptr;
    bool enableProgTh = false;
    uint64_t pthrDelay = 0;
    nixl_thread_sync_t syncMode;
    bool enableTelemetry_ = false;
};

/* The base of every backend engine. Its data members are read by the agent through inline
 * accessors compiled into libnixl, so their order and types are the interface too. */
class nixlBackendEngine {
private:
    nixl_backend_t backendType;
    nixl_b_params_t customParams;
    std::vector<nixlTelemetryEvent> telemetryEvents_;
    std::mutex telemetryEventsMutex_;

protected:
    bool initErr = false;
    const std::string localAgent;
    const bool enableTelemetry_;

    /* A parameter the agent was created with, or nullptr. */
    const std::string *param(const std::string &key) const {
        const auto it = customParams.find(key);
        return it == customParams.end() ? nullptr : &it->second;
    }
    const nixl_b_params_t &params() const { return customParams; }

public:
    explicit nixlBackendEngine(const nixlBackendInitParams *init)
        : backendType(init->type),
          customParams(init->customParams ? *init->customParams : nixl_b_params_t{}),
          localAgent(init->localAgent),
          enableTelemetry_(init->enableTelemetry_) {}

    nixlBackendEngine(const nixlBackendEngine &) = delete;
    nixlBackendEngine &operator=(const nixlBackendEngine &) = delete;

    /* The virtual functions, in NIXL's order (the vtable is the interface). */
    virtual ~nixlBackendEngine() = default;

    virtual bool supportsRemote() const = 0;
    virtual bool supportsLocal() const = 0;
    virtual bool supportsNotif() const = 0;
    virtual nixl_mem_list_t getSupportedMems() const = 0;

    virtual nixl_status_t
    registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem, nixlBackendMD *&out) = 0;
    virtual nixl_status_t deregisterMem(nixlBackendMD *meta) = 0;

    virtual nixl_status_t connect(const std::string &remote_agent) = 0;
    virtual nixl_status_t disconnect(const std::string &remote_agent) = 0;

    virtual nixl_status_t unloadMD(nixlBackendMD *input) = 0;

    virtual nixl_status_t prepXfer(const nixl_xfer_op_t &operation,
                                   const nixl_meta_dlist_t &local,
                                   const nixl_meta_dlist_t &remote,
                                   const std::string &remote_agent,
                                   nixlBackendReqH *&handle,
                                   const nixl_opt_b_args_t *opt_args = nullptr) const = 0;
    virtual nixl_status_t postXfer(const nixl_xfer_op_t &operation,
                                   const nixl_meta_dlist_t &local,
                                   const nixl_meta_dlist_t &remote,
                                   const std::string &remote_agent,
                                   nixlBackendReqH *&handle,
                                   const nixl_opt_b_args_t *opt_args = nullptr) const = 0;
    virtual nixl_status_t checkXfer(nixlBackendReqH *handle) const = 0;
    virtual nixl_status_t releaseReqH(nixlBackendReqH *handle) const = 0;

    virtual nixl_status_t prepMemView(const nixl_remote_meta_dlist_t &,
                                      nixlMemViewH &,
                                      const nixl_opt_b_args_t * = nullptr) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual nixl_status_t prepMemView(const nixl_meta_dlist_t &,
                                      nixlMemViewH &,
                                      const nixl_opt_b_args_t * = nullptr) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual void releaseMemView(nixlMemViewH) const {}

    virtual nixl_status_t getPublicData(const nixlBackendMD *, std::string &) const {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t getConnInfo(std::string &) const { return NIXL_ERR_BACKEND; }
    virtual nixl_status_t loadRemoteConnInfo(const std::string &, const std::string &) {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t
    loadRemoteMD(const nixlBlobDesc &, const nixl_mem_t &, const std::string &, nixlBackendMD *&) {
        return NIXL_ERR_BACKEND;
    }

    virtual nixl_status_t loadLocalMD(nixlBackendMD *, nixlBackendMD *&) {
        return NIXL_ERR_BACKEND;
    }

    virtual nixl_status_t getNotifs(notif_list_t &) { return NIXL_ERR_BACKEND; }
    virtual nixl_status_t genNotif(const std::string &, const std::string &) const {
        return NIXL_ERR_BACKEND;
    }

    virtual nixl_status_t
    queryMem(const nixl_reg_dlist_t &, std::vector<nixl_query_resp_t> &) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual nixl_status_t estimateXferCost(const nixl_xfer_op_t &,
                                           const nixl_meta_dlist_t &,
                                           const nixl_meta_dlist_t &,
                                           const std::string &,
                                           nixlBackendReqH *const &,
                                           std::chrono::microseconds &,
                                           std::chrono::microseconds &,
                                           nixl_cost_t &,
                                           const nixlAgentOptionalArgs * = nullptr) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
};

/* What nixl_plugin_init returns: the API version and the entry points. */
struct nixlBackendPlugin {
    int api_version;
    nixlBackendEngine *(*create_engine)(const nixlBackendInitParams *init_params);
    void (*destroy_engine)(nixlBackendEngine *engine);
    const char *(*get_plugin_name)();
    const char *(*get_plugin_version)();
    nixl_b_params_t (*get_backend_options)();
    nixl_mem_list_t (*get_backend_mems)();
};

/* Layout checks against NIXL's x86_64 build (libstdc++): the descriptors NIXL hands over. */
static_assert(sizeof(nixlBasicDesc) == 24);
static_assert(sizeof(nixlMetaDesc) == 32);
static_assert(sizeof(nixlBlobDesc) == 56);
/* NIXL 1.5.1's libnixl reads initErr at offset 160 (createBackend's `cmpb $0x0,0xa0(%rax)`). */
static_assert(sizeof(nixlBackendEngine) == 208);

#endif /* TE_NIXL_ABI_H */
