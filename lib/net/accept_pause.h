// AcceptPause: what an Asio accept loop does when accept fails -- pause, retry on a timer, and
// say so in the log at a bounded rate -- in one place for every listener of a process (the WAN
// endpoint, the HTTP server; the gateway's local socket once it moves onto Asio).
//
// Why it exists: when the process is out of descriptors (EMFILE, ENFILE) or memory (ENOBUFS,
// ENOMEM), the connection stays in the listen backlog and accept fails again at once. A loop that
// re-arms accept immediately then spins: straitd's WAN acceptor used 84% of a core and logged
// 800,000 lines in 8 s at its descriptor limit. Pausing a moment per failure keeps the loop
// cheap, and the backlog is taken as soon as descriptors are free again.
//
// Usage, inside the accept handler (on the loop's thread):
//   acceptor.async_accept([this](const asio::error_code& ec, asio::ip::tcp::socket socket) {
//     if (ec == asio::error::operation_aborted) return;        // the acceptor was closed
//     if (ec) return pause_.OnFailure(ec, [this] { Accept(); });  // retried after the pause
//     pause_.OnSuccess();
//     ...                                                       // serve `socket`, then Accept()
//   });
// and at shutdown, on the loop's thread, pause_.Cancel() next to closing the acceptor.
//
// Log lines: one WARN when a run of failures starts, naming the error and the fix (raise the
// descriptor limit, LimitNOFILE), then at most one per `log_interval_ns` while the run lasts,
// with the count. The line reads "accepting <what> failed: <error> (<n> in a row); pausing
// accepts for <pause> each time (raise the descriptor limit, LimitNOFILE)".
//
// Threads and ownership: not thread-safe; every method runs on the thread of the loop whose
// executor it was given. `retry` is called on that thread, never from inside OnFailure. A
// pending retry holds `retry` (and whatever it captured) until it runs or is cancelled; the
// owner keeps the AcceptPause alive at least that long (make it a member of the object whose
// loop it is, as the timer it holds must be).
#ifndef STRAIT_LIB_NET_ACCEPT_PAUSE_H_
#define STRAIT_LIB_NET_ACCEPT_PAUSE_H_

#include <asio.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace strait::net {

class AcceptPause {
 public:
  struct Options {
    // How long accepting pauses after each failure: long enough not to spin on a backlog the
    // process cannot take, short enough for a probe's timeout.
    int64_t pause_ns = 100'000'000;
    // While failures continue, at most one WARN line per interval (the first one at once).
    int64_t log_interval_ns = 10'000'000'000;
  };

  // `what` names the connections in the log line ("a WAN connection"); `log_subsystem` is the
  // logger's subsystem ("net", "http"). Does not block.
  AcceptPause(const asio::any_io_executor& executor, std::string what, std::string log_subsystem,
              Options options);
  AcceptPause(const asio::any_io_executor& executor, std::string what, std::string log_subsystem)
      : AcceptPause(executor, std::move(what), std::move(log_subsystem), Options()) {}
  AcceptPause(const AcceptPause&) = delete;
  AcceptPause& operator=(const AcceptPause&) = delete;

  // An accept failed with `ec` (anything but operation_aborted): counts it, logs if due, and
  // calls `retry` once the pause has passed, unless Cancel() runs first. At most one retry is
  // pending: a second OnFailure before it ran replaces it.
  void OnFailure(const asio::error_code& ec, std::function<void()> retry);

  // An accept succeeded: the run of failures (if any) is over; the next failure logs at once.
  void OnSuccess() { failures_in_a_row_ = 0; }

  // Drops a pending retry without calling it (shutdown). Idempotent.
  void Cancel();

  // Failures since the last success.
  uint64_t failures_in_a_row() const { return failures_in_a_row_; }
  // WARN lines written so far (for tests).
  uint64_t lines_logged() const { return lines_logged_; }

 private:
  asio::steady_timer timer_;
  std::string what_;
  std::string log_subsystem_;
  Options options_;
  uint64_t failures_in_a_row_ = 0;
  uint64_t lines_logged_ = 0;
  int64_t last_logged_ns_ = 0;
  // Bumped by Cancel() and each OnFailure, so that a wait that was cancelled (or replaced) but
  // whose handler was already queued does not retry.
  uint64_t generation_ = 0;
};

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_ACCEPT_PAUSE_H_
