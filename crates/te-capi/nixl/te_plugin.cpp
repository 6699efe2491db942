/*
 * te_plugin.cpp: libplugin_TE.so's entry points. NIXL's agent finds the file in
 * NIXL_PLUGIN_DIR, names the backend after it ("TE"), checks api_version and creates one
 * engine per agent through create_engine.
 */
#include "te_backend.h"

#include <cstdio>
#include <exception>
#include <new>

namespace {

nixlBackendEngine *createEngine(const nixlBackendInitParams *init) {
    try {
        return new te_nixl::Backend(init);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "te nixl: creating the backend failed: %s\n", e.what());
        return nullptr;
    }
}

void destroyEngine(nixlBackendEngine *engine) {
    delete engine;
}

const char *pluginName() {
    return "TE";
}

const char *pluginVersion() {
    return TE_NIXL_VERSION;
}

nixlBackendPlugin plugin = {te_nixl_plugin_api_version, createEngine,
                            destroyEngine,              pluginName,
                            pluginVersion,              te_nixl::backendOptions,
                            te_nixl::supportedMems};

} // namespace

extern "C" {

__attribute__((visibility("default"))) nixlBackendPlugin *nixl_plugin_init() {
    return &plugin;
}

__attribute__((visibility("default"))) void nixl_plugin_fini() {}
}
