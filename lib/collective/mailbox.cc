// Mailbox: one mutex and one condition variable; the waits are short-lived and few (a handful
// of threads per operation), so finer locking would buy nothing.
#include "collective/mailbox.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "collective/transport.h"

namespace strait::collective {
namespace {

std::string TagText(uint64_t tag) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(tag));
  return buf;
}

}  // namespace

Mailbox::Mailbox(int peers, std::function<std::string(int)> peer_name)
    : peers_(peers), peer_name_(std::move(peer_name)), failures_(static_cast<size_t>(peers)) {}

std::string Mailbox::Name(int peer) const {
  return peer_name_ ? peer_name_(peer) : "rank " + std::to_string(peer);
}

void Mailbox::Deliver(int peer, uint64_t tag, std::vector<uint8_t> bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (forgotten_.count(OpOfTag(tag)) > 0) {
      ++dropped_messages_;
      return;
    }
    buffered_bytes_ += bytes.size();
    ++buffered_messages_;
    messages_[{peer, tag}].push_back(Message{std::move(bytes), MonotonicNanos()});
  }
  cv_.notify_all();
}

Status Mailbox::Receive(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out,
                        int64_t* arrived_ns) {
  if (peer < 0 || peer >= peers_) {
    return InvalidArgumentError("receive from rank " + std::to_string(peer) +
                                ", which is outside the world of " + std::to_string(peers_));
  }
  std::unique_lock<std::mutex> lock(mu_);
  const auto key = std::make_pair(peer, tag);
  const uint64_t op = OpOfTag(tag);
  while (true) {
    if (auto f = forgotten_.find(op); f != forgotten_.end()) return f->second;
    auto it = messages_.find(key);
    if (it != messages_.end()) {
      *out = std::move(it->second.front().bytes);
      if (arrived_ns != nullptr) *arrived_ns = it->second.front().arrived_ns;
      it->second.pop_front();
      if (it->second.empty()) messages_.erase(it);
      buffered_bytes_ -= out->size();
      --buffered_messages_;
      return Status::Ok();
    }
    const Status& failure = failures_[static_cast<size_t>(peer)];
    if (!failure.ok()) return failure;
    if (deadline.Expired()) {
      return DeadlineExceededError("no message from " + Name(peer) + " (tag " + TagText(tag) +
                                   ") before the deadline; the peer is slow, stalled or gone");
    }
    // Wait in slices of at most a second so that an infinite deadline cannot overflow the
    // clock arithmetic.
    const int64_t wait_ns = std::min<int64_t>(deadline.RemainingNanos(), 1'000'000'000);
    cv_.wait_for(lock, std::chrono::nanoseconds(wait_ns));
  }
}

void Mailbox::FailPeer(int peer, Status why) {
  if (peer < 0 || peer >= peers_ || why.ok()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status& slot = failures_[static_cast<size_t>(peer)];
    if (slot.ok()) slot = std::move(why);
  }
  cv_.notify_all();
}

void Mailbox::ClearPeerFailure(int peer) {
  if (peer < 0 || peer >= peers_) return;
  std::lock_guard<std::mutex> lock(mu_);
  failures_[static_cast<size_t>(peer)] = Status::Ok();
}

template <typename Pred>
size_t Mailbox::DropLocked(Pred pred) {
  size_t dropped = 0;
  for (auto it = messages_.begin(); it != messages_.end();) {
    if (pred(it->first.first, it->first.second)) {
      for (const auto& m : it->second) buffered_bytes_ -= m.bytes.size();
      dropped += it->second.size();
      buffered_messages_ -= it->second.size();
      it = messages_.erase(it);
    } else {
      ++it;
    }
  }
  return dropped;
}

size_t Mailbox::Discard(uint64_t lo, uint64_t hi) {
  std::lock_guard<std::mutex> lock(mu_);
  return DropLocked([lo, hi](int, uint64_t tag) { return tag >= lo && tag <= hi; });
}

size_t Mailbox::ForgetLocked(uint64_t op_id, Status why) {
  op_id &= kOpIdMask;
  // A scan of every buffered key: an operation has at most a few hundred messages buffered, and
  // forgetting happens once per failed operation.
  const size_t dropped =
      DropLocked([op_id](int, uint64_t tag) { return OpOfTag(tag) == op_id; });
  if (forgotten_.emplace(op_id, std::move(why)).second) {
    forgotten_order_.push_back(op_id);
    if (forgotten_order_.size() > kMaxForgottenOps) {
      forgotten_.erase(forgotten_order_.front());
      forgotten_order_.pop_front();
    }
  }
  return dropped;
}

size_t Mailbox::Discard(uint64_t op_id) {
  size_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped = ForgetLocked(op_id, CancelledError("operation " + TagText(op_id) +
                                                 " was discarded on this rank"));
  }
  cv_.notify_all();
  return dropped;
}

size_t Mailbox::Abort(uint64_t op_id, Status why) {
  if (why.ok()) why = AbortedError("operation " + TagText(op_id) + " was aborted");
  size_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped = ForgetLocked(op_id, std::move(why));
  }
  cv_.notify_all();
  return dropped;
}

size_t Mailbox::DiscardPeer(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  return DropLocked([peer](int p, uint64_t) { return p == peer; });
}

uint64_t Mailbox::DroppedMessages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_messages_;
}

size_t Mailbox::ForgottenOps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return forgotten_.size();
}

size_t Mailbox::BufferedMessages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return buffered_messages_;
}

size_t Mailbox::BufferedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return buffered_bytes_;
}

}  // namespace strait::collective
