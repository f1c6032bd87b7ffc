// The libuv loop thread and its cross-thread queue.
#include "plugins/nccl/event_loop.h"

#include <pthread.h>
#include <signal.h>

#include <condition_variable>

namespace strait::nccl {

EventLoop::~EventLoop() {
  Stop();
}

Status EventLoop::Start() {
  if (running()) return Status::Ok();
  int rc = uv_loop_init(&loop_);
  if (rc != 0) return UnavailableError(std::string("uv_loop_init: ") + uv_strerror(rc));
  rc = uv_async_init(&loop_, &async_, &EventLoop::OnAsync);
  if (rc != 0) {
    (void)uv_loop_close(&loop_);
    return UnavailableError(std::string("uv_async_init: ") + uv_strerror(rc));
  }
  async_.data = this;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = false;
  }
  // A peer (or the gateway) that goes away turns the loop's next write into SIGPIPE, whose
  // default action would kill the rank; the loop thread blocks it and sees EPIPE instead. The
  // thread inherits the mask at creation; the caller's own mask is restored at once.
  sigset_t pipe_only;
  sigset_t previous;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &previous);
  thread_ = std::thread([this] { uv_run(&loop_, UV_RUN_DEFAULT); });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return Status::Ok();
}

void EventLoop::Stop() {
  if (!running()) return;
  Post([this] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    // Whatever is still open (a comm NCCL never closed) is closed now so the loop can end; its
    // memory is then leaked on purpose rather than freed under a caller that may still hold it.
    uv_walk(
        &loop_,
        [](uv_handle_t* h, void*) {
          if (!uv_is_closing(h)) uv_close(h, nullptr);
        },
        nullptr);
  });
  thread_.join();
  (void)uv_loop_close(&loop_);
  std::lock_guard<std::mutex> lock(mu_);
  queue_.clear();
}

void EventLoop::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    queue_.push_back(std::move(fn));
  }
  uv_async_send(&async_);
}

void EventLoop::RunSync(std::function<void()> fn) {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  Post([&] {
    fn();
    std::lock_guard<std::mutex> lock(m);
    done = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return done; });
}

void EventLoop::OnAsync(uv_async_t* async) {
  static_cast<EventLoop*>(async->data)->Drain();
}

void EventLoop::Drain() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(queue_);
  }
  for (auto& fn : batch) fn();
}

}  // namespace strait::nccl
