// LocalWorld: every rank's transport writes straight into the destination rank's mailbox.
#include "collective/local_transport.h"

#include <utility>

namespace strait::collective {

class LocalWorld::Rank final : public Transport {
 public:
  Rank(LocalWorld* world, int rank) : world_(world), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return world_->size(); }

  void Send(int peer, uint64_t tag, std::vector<uint8_t> bytes, Deadline /*deadline*/,
            SendDone done) override {
    Status status;
    if (peer < 0 || peer >= size()) {
      status = InvalidArgumentError("send to rank " + std::to_string(peer) +
                                    ", which is outside the world of " + std::to_string(size()));
    } else if (world_->failed_[static_cast<size_t>(peer)].load(std::memory_order_acquire)) {
      status = world_->failure_[static_cast<size_t>(peer)];
    } else {
      world_->mailboxes_[static_cast<size_t>(peer)]->Deliver(rank_, tag, std::move(bytes));
    }
    if (done) done(std::move(status));
  }

  Status Recv(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out) override {
    return world_->mailboxes_[static_cast<size_t>(rank_)]->Receive(peer, tag, deadline, out);
  }

  Status RecvStamped(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out,
                     int64_t* arrived_ns) override {
    return world_->mailboxes_[static_cast<size_t>(rank_)]->Receive(peer, tag, deadline, out,
                                                                   arrived_ns);
  }

  void Abort(uint64_t op_id, const Status& why, const std::string& /*note*/) override {
    for (int r = 0; r < size(); ++r) {
      if (r != rank_ && world_->failed_[static_cast<size_t>(r)].load(std::memory_order_acquire)) {
        continue;
      }
      world_->mailboxes_[static_cast<size_t>(r)]->Abort(
          op_id, AbortedError((r == rank_ ? std::string("this rank") : PeerName(rank_)) +
                              " aborted the operation: " + why.ToString()));
    }
  }

 private:
  LocalWorld* world_;
  int rank_;
};

LocalWorld::LocalWorld(int size)
    : failed_(std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(size))),
      failure_(static_cast<size_t>(size)) {
  for (int r = 0; r < size; ++r) {
    ranks_.push_back(std::make_unique<Rank>(this, r));
    mailboxes_.push_back(std::make_unique<Mailbox>(size));
    failed_[static_cast<size_t>(r)].store(false);
  }
}

LocalWorld::~LocalWorld() = default;

Transport& LocalWorld::transport(int rank) {
  return *ranks_.at(static_cast<size_t>(rank));
}

size_t LocalWorld::BufferedMessages(int rank) const {
  return mailboxes_.at(static_cast<size_t>(rank))->BufferedMessages();
}

void LocalWorld::FailRank(int rank, Status why) {
  // The status is written before the flag is published, and never again, so senders that see
  // the flag read a complete status.
  if (failed_[static_cast<size_t>(rank)].load()) return;
  failure_[static_cast<size_t>(rank)] = why;
  failed_[static_cast<size_t>(rank)].store(true, std::memory_order_release);
  for (auto& mailbox : mailboxes_) mailbox->FailPeer(rank, why);
}

}  // namespace strait::collective
