// Test harness for libnccl-net-strait.so: loads the built library with dlopen, resolves the
// exported tables and drives them the way NCCL does (non-blocking connect/accept retried, requests
// polled with test()). Used by the in-process tests and by the multi-process node binary.
// Not thread-safe beyond what the plugin itself guarantees; each helper fails with a message
// (never hangs) when the plugin does not make progress within its deadline.
#ifndef STRAIT_TESTS_PLUGINS_PLUGIN_HARNESS_H_
#define STRAIT_TESTS_PLUGINS_PLUGIN_HARNESS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "plugins/nccl/nccl_net.h"

namespace strait::nccl::testing {

struct LoadedPlugin {
  void* dl = nullptr;
  ncclNet_v12_t* v12 = nullptr;
  ncclNet_v11_t* v11 = nullptr;
  ncclNet_v10_t* v10 = nullptr;
  ncclNet_v9_t* v9 = nullptr;
  ncclNet_v8_t* v8 = nullptr;
  std::string error;  // why loading failed, when dl == nullptr
};

// dlopen()s `path` once per process (RTLD_NOW | RTLD_LOCAL) and resolves the five net tables.
const LoadedPlugin& LoadPlugin(const std::string& path);

// A logger to pass to init(): records every line (level + formatted text).
void CaptureLogger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                   const char* fmt, ...);
std::vector<std::string> LoggedWarnings();
std::vector<std::string> LoggedLines();
void ClearLog();
// True if some WARN line contains every one of `parts`.
bool WarnedWith(const std::vector<std::string>& parts);

// Seconds every wait in the harness may take before it gives up.
constexpr double kDeadlineSeconds = 60;

// Deterministic bytes for message `seed`.
void FillPattern(void* data, size_t size, uint64_t seed);
// Index of the first byte that differs from the pattern, or -1.
long long FirstMismatch(const void* data, size_t size, uint64_t seed);

// Retries connect() on `handle` and accept() on `listen_comm` alternately until both give a
// comm. Returns "" or an error. `connect_nulls` counts connect calls that said "call again".
struct Pair {
  void* send = nullptr;
  void* recv = nullptr;
  int connect_nulls = 0;
  int accept_nulls = 0;
};
std::string ConnectAccept(const ncclNet_v11_t* net, void* ctx, void* handle, void* listen_comm,
                          Pair* pair);
std::string ConnectAccept(const ncclNet_v12_t* net, void* ctx, void* handle, void* listen_comm,
                          Pair* pair);

// Polls `request` until done. Returns the last result (ncclInternalError after the deadline).
template <typename Net>
ncclResult_t WaitRequest(const Net* net, void* request, int* sizes);

}  // namespace strait::nccl::testing

#include "tests/plugins/plugin_harness_inl.h"  // IWYU pragma: keep

#endif  // STRAIT_TESTS_PLUGINS_PLUGIN_HARNESS_H_
