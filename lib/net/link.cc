// The public Link handle (see link.h): each method posts its work to the link's LinkCore on the
// I/O thread, or reads the snapshot the link publishes; the blocking helpers wait here, on the
// caller's thread. The link itself is LinkCore (link_core.h and the link_*.cc files); the
// endpoint that creates links is endpoint.cc.
#include "net/link.h"

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <utility>

#include "net/link_core.h"
#include "net/runtime.h"

namespace strait::net {

Link::Link(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Link::~Link() = default;

const std::string& Link::peer_region() const { return impl_->core->peer_region(); }

std::shared_ptr<Link> Link::WithChannelBase(uint32_t base) const {
  auto view = std::make_shared<Link>(std::make_unique<Impl>(*impl_));
  view->channel_base_ = channel_base_ + base;
  return view;
}

void Link::Send(uint32_t channel, std::vector<uint8_t> message, Deadline deadline,
                SendDone done) {
  channel += channel_base_;
  auto shared_done = std::make_shared<SendDone>(std::move(done));
  const bool posted = impl_->runtime->Post(
      [core = impl_->core, channel, message = std::move(message), deadline,
       shared_done]() mutable { core->Send(channel, std::move(message), deadline,
                                           std::move(*shared_done)); });
  if (!posted && *shared_done) {
    (*shared_done)(UnavailableError("link to region " + peer_region() +
                                    " is gone: its endpoint was shut down"));
  }
}

Status Link::SendAndWait(uint32_t channel, std::vector<uint8_t> message, Deadline deadline) {
  if (impl_->runtime->OnIoThread()) {
    return FailedPreconditionError("SendAndWait called from the link's I/O thread");
  }
  auto promise = std::make_shared<std::promise<Status>>();
  std::future<Status> future = promise->get_future();
  Send(channel, std::move(message), deadline,
       [promise](Status status) { promise->set_value(std::move(status)); });
  // The link itself fails the send at the deadline (checked every tick); the margin covers that.
  const auto until = MonoClock::time_point(std::chrono::nanoseconds(
      deadline.IsInfinite() ? INT64_MAX / 2 : deadline.at_nanos() + 1'000'000'000));
  if (future.wait_until(until) != std::future_status::ready) {
    return DeadlineExceededError("send to region " + peer_region() + " did not complete");
  }
  return future.get();
}

Status Link::WaitForStreams(int streams, Deadline deadline) {
  if (impl_->runtime->OnIoThread()) {
    return FailedPreconditionError("WaitForStreams called from the link's I/O thread");
  }
  return impl_->core->WaitForStreams(streams, deadline);
}

LinkEstimates Link::Estimates() const { return impl_->core->Snapshot(); }

void Link::Close() {
  impl_->runtime->Post([core = impl_->core] {
    core->Close(CancelledError("link to " + core->peer_name() + " closed by its owner"));
  });
}

void Link::KillStreamForTest(int index) {
  impl_->runtime->Post([core = impl_->core, index] { core->KillStream(index); });
}

void Link::SetStreamsForTest(int streams) {
  impl_->runtime->Post(
      [core = impl_->core, streams] { core->ResizePool(streams, MonotonicNanos()); });
}

}  // namespace strait::net
