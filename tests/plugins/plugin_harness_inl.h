// Template part of plugin_harness.h (polling works on every table version).
#ifndef STRAIT_TESTS_PLUGINS_PLUGIN_HARNESS_INL_H_
#define STRAIT_TESTS_PLUGINS_PLUGIN_HARNESS_INL_H_

#include <chrono>
#include <thread>

namespace strait::nccl::testing {

template <typename Net>
ncclResult_t WaitRequest(const Net* net, void* request, int* sizes) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(kDeadlineSeconds);
  while (true) {
    int done = 0;
    const ncclResult_t r = net->test(request, &done, sizes);
    if (r != ncclSuccess || done) return r;
    if (std::chrono::steady_clock::now() > deadline) return ncclInternalError;
    std::this_thread::yield();
  }
}

}  // namespace strait::nccl::testing

#endif  // STRAIT_TESTS_PLUGINS_PLUGIN_HARNESS_INL_H_
