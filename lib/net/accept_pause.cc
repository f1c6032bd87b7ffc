// AcceptPause (see accept_pause.h): the pause timer and the rate-limited log line.
#include "net/accept_pause.h"

#include <chrono>
#include <utility>

#include "common/clock.h"
#include "common/log.h"
#include "common/units.h"

namespace strait::net {

AcceptPause::AcceptPause(const asio::any_io_executor& executor, std::string what,
                         std::string log_subsystem, Options options)
    : timer_(executor),
      what_(std::move(what)),
      log_subsystem_(std::move(log_subsystem)),
      options_(options) {}

void AcceptPause::OnFailure(const asio::error_code& ec, std::function<void()> retry) {
  ++failures_in_a_row_;
  const int64_t now = MonotonicNanos();
  if (failures_in_a_row_ == 1 || now - last_logged_ns_ >= options_.log_interval_ns) {
    last_logged_ns_ = now;
    ++lines_logged_;
    STRAIT_LOG(kWarn, log_subsystem_)
        << "accepting " << what_ << " failed: " << ec.message() << " (" << failures_in_a_row_
        << " in a row); pausing accepts for " << FormatDuration(options_.pause_ns)
        << " each time (raise the descriptor limit, LimitNOFILE)";
  }
  const uint64_t generation = ++generation_;
  timer_.expires_after(std::chrono::nanoseconds(options_.pause_ns));
  timer_.async_wait([this, generation, retry = std::move(retry)](const asio::error_code& wait_ec) {
    // Cancelled (shutdown, or replaced by a newer failure): `this` may be on its way out.
    if (wait_ec) return;
    if (generation != generation_) return;  // cancelled or replaced after it had expired
    if (retry) retry();
  });
}

void AcceptPause::Cancel() {
  ++generation_;
  timer_.cancel();
}

}  // namespace strait::net
