// The plugin's I/O thread: one libuv loop that owns every socket of every connection.
//
// NCCL's threads never touch a socket. They hand work to the loop with Post() (a queue plus
// uv_async_send, the only libuv call that may cross threads) and poll atomics for the result.
// RunSync() is Post() plus a wait for the closure to have run; the close calls use it so that
// when they return, the loop no longer reads or writes the caller's buffers.
//
// Thread-safety: Post/RunSync from any thread; everything a closure does runs on the loop thread.
#ifndef STRAIT_PLUGINS_NCCL_EVENT_LOOP_H_
#define STRAIT_PLUGINS_NCCL_EVENT_LOOP_H_

#include <uv.h>

#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "strait/status.h"

namespace strait::nccl {

class EventLoop {
 public:
  EventLoop() = default;
  ~EventLoop();  // Stop()s
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Starts the thread. Not thread-safe against Stop (the plugin serialises both).
  Status Start();
  // Runs the queued closures, closes every handle still open, joins the thread. Blocks.
  void Stop();
  bool running() const { return thread_.joinable(); }

  // Queues `fn` to run on the loop thread. Never blocks (beyond a short mutex).
  void Post(std::function<void()> fn);
  // Queues `fn` and waits until it has run. Must not be called from the loop thread.
  void RunSync(std::function<void()> fn);
  bool OnLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }

  uv_loop_t* loop() { return &loop_; }

 private:
  static void OnAsync(uv_async_t* async);
  void Drain();

  uv_loop_t loop_{};
  uv_async_t async_{};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::function<void()>> queue_;
  bool stopping_ = false;
};

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_EVENT_LOOP_H_
