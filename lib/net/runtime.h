// Runtime: the io_context and the one thread that runs it, shared by an Endpoint and its Link
// handles. Internal to strait::net (included by the link_*.cc and endpoint.cc files only); other
// modules use net/link.h.
//
// It is apart from the links because its lifetime is: the Endpoint and every Link handle keep
// it, nothing that lives inside the io_context does, so that nothing keeps itself alive.
#ifndef STRAIT_LIB_NET_RUNTIME_H_
#define STRAIT_LIB_NET_RUNTIME_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include <asio.hpp>

#include "common/clock.h"

namespace strait::net {

// The io_context and its thread. Post() refuses work once shutdown began, so a caller can fail
// its own callback instead of posting into a loop that will never run it.
class Runtime {
 public:
  Runtime() : guard_(asio::make_work_guard(io_)) {
    thread_ = std::thread([this] {
      thread_id_.store(std::this_thread::get_id());
      io_.run();
    });
  }
  ~Runtime() { Shutdown(nullptr, nullptr, nullptr, 0); }

  template <typename F>
  bool Post(F&& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    asio::post(io_, std::forward<F>(fn));
    return true;
  }

  // Runs `begin` on the I/O thread after everything posted before, keeps the loop running until
  // `drained` returns true or `grace_ns` passed, runs `finish`, then stops and joins. Any of the
  // functions may be empty.
  void Shutdown(std::function<void()> begin, std::function<bool()> drained,
                std::function<void()> finish, int64_t grace_ns) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopped_) {
        stopped_ = true;
        drained_ = std::move(drained);
        finish_ = std::move(finish);
        asio::post(io_, [this, begin = std::move(begin), grace_ns] {
          if (begin) begin();
          drain_until_ns_ = MonotonicNanos() + grace_ns;
          DrainStep();
        });
      }
    }
    if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
  }

  bool OnIoThread() const { return std::this_thread::get_id() == thread_id_.load(); }
  asio::io_context& io() { return io_; }

 private:
  void DrainStep() {
    if (!drained_ || drained_() || MonotonicNanos() >= drain_until_ns_) {
      if (finish_) finish_();
      drained_ = nullptr;
      finish_ = nullptr;
      io_.stop();
      return;
    }
    drain_timer_.expires_after(std::chrono::milliseconds(5));
    drain_timer_.async_wait([this](const asio::error_code&) { DrainStep(); });
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  asio::steady_timer drain_timer_{io_};
  std::function<bool()> drained_;
  std::function<void()> finish_;
  int64_t drain_until_ns_ = 0;
  std::mutex mu_;
  bool stopped_ = false;
  std::atomic<std::thread::id> thread_id_{};
  std::thread thread_;
};

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_RUNTIME_H_
