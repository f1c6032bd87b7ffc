// dlopen loader, capturing logger and connection helper for the plugin tests.
#include "tests/plugins/plugin_harness.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <thread>

namespace strait::nccl::testing {
namespace {

std::mutex g_log_mu;
std::vector<std::pair<int, std::string>>& Log() {
  static auto* log = new std::vector<std::pair<int, std::string>>();
  return *log;
}

uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

const LoadedPlugin& LoadPlugin(const std::string& path) {
  static LoadedPlugin* loaded = [&] {
    auto* p = new LoadedPlugin();
    p->dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (p->dl == nullptr) {
      p->error = dlerror();
      return p;
    }
    p->v12 = static_cast<ncclNet_v12_t*>(dlsym(p->dl, "ncclNetPlugin_v12"));
    p->v11 = static_cast<ncclNet_v11_t*>(dlsym(p->dl, "ncclNetPlugin_v11"));
    p->v10 = static_cast<ncclNet_v10_t*>(dlsym(p->dl, "ncclNetPlugin_v10"));
    p->v9 = static_cast<ncclNet_v9_t*>(dlsym(p->dl, "ncclNetPlugin_v9"));
    p->v8 = static_cast<ncclNet_v8_t*>(dlsym(p->dl, "ncclNetPlugin_v8"));
    return p;
  }();
  return *loaded;
}

void CaptureLogger(ncclDebugLogLevel level, unsigned long /*flags*/, const char* /*file*/,
                   int /*line*/, const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (level == NCCL_LOG_WARN) std::fprintf(stderr, "[plugin WARN] %s\n", buf);
  std::lock_guard<std::mutex> lock(g_log_mu);
  Log().emplace_back(static_cast<int>(level), buf);
}

std::vector<std::string> LoggedWarnings() {
  std::lock_guard<std::mutex> lock(g_log_mu);
  std::vector<std::string> out;
  for (const auto& [level, line] : Log()) {
    if (level == NCCL_LOG_WARN) out.push_back(line);
  }
  return out;
}

std::vector<std::string> LoggedLines() {
  std::lock_guard<std::mutex> lock(g_log_mu);
  std::vector<std::string> out;
  for (const auto& entry : Log()) out.push_back(entry.second);
  return out;
}

void ClearLog() {
  std::lock_guard<std::mutex> lock(g_log_mu);
  Log().clear();
}

bool WarnedWith(const std::vector<std::string>& parts) {
  for (const std::string& line : LoggedWarnings()) {
    bool all = true;
    for (const std::string& p : parts) all = all && line.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

void FillPattern(void* data, size_t size, uint64_t seed) {
  auto* p = static_cast<unsigned char*>(data);
  uint64_t state = seed * 0x100000001b3ULL + 7;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const uint64_t v = SplitMix(state);
    for (int b = 0; b < 8; ++b) p[i + b] = static_cast<unsigned char>(v >> (8 * b));
  }
  if (i < size) {
    const uint64_t v = SplitMix(state);
    for (int b = 0; i < size; ++i, ++b) p[i] = static_cast<unsigned char>(v >> (8 * b));
  }
}

long long FirstMismatch(const void* data, size_t size, uint64_t seed) {
  std::vector<unsigned char> expect(size);
  FillPattern(expect.data(), size, seed);
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    if (p[i] != expect[i]) return static_cast<long long>(i);
  }
  return -1;
}

namespace {

// v11 and v12 connect and accept alike (same signatures); only the table type differs.
template <typename Net>
std::string ConnectAcceptAnyVersion(const Net* net, void* ctx, void* handle, void* listen_comm,
                                    Pair* pair) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(kDeadlineSeconds);
  while (pair->send == nullptr || pair->recv == nullptr) {
    if (pair->send == nullptr) {
      ncclNetDeviceHandle_t* dev = nullptr;
      const ncclResult_t r = net->connect(ctx, 0, handle, &pair->send, &dev);
      if (r != ncclSuccess) return "connect returned " + std::to_string(r);
      if (pair->send == nullptr) ++pair->connect_nulls;
    }
    if (pair->recv == nullptr) {
      ncclNetDeviceHandle_t* dev = nullptr;
      const ncclResult_t r = net->accept(listen_comm, &pair->recv, &dev);
      if (r != ncclSuccess) return "accept returned " + std::to_string(r);
      if (pair->recv == nullptr) ++pair->accept_nulls;
    }
    if (std::chrono::steady_clock::now() > deadline) return "connect/accept timed out";
    std::this_thread::yield();
  }
  return "";
}

}  // namespace

std::string ConnectAccept(const ncclNet_v11_t* net, void* ctx, void* handle, void* listen_comm,
                          Pair* pair) {
  return ConnectAcceptAnyVersion(net, ctx, handle, listen_comm, pair);
}

std::string ConnectAccept(const ncclNet_v12_t* net, void* ctx, void* handle, void* listen_comm,
                          Pair* pair) {
  return ConnectAcceptAnyVersion(net, ctx, handle, listen_comm, pair);
}

}  // namespace strait::nccl::testing
