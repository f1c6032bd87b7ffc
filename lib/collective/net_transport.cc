// NetTransport: frames collective messages with a 24-byte trailer and sorts what arrives into
// a mailbox keyed by (peer, tag); aborts and hellos are handled on arrival. The only file of
// strait::collective that uses strait::net.
#include "collective/net_transport.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <utility>

#include "common/endian.h"
#include "common/log.h"
#include "net/link.h"

namespace strait::collective {
namespace {

constexpr const char* kLog = "collective";
// How long an abort or a hello may take to reach a peer; both are tiny.
constexpr int64_t kControlSendNanos = 10'000'000'000;
// Old incarnations remembered per peer, so that their late messages are dropped.
constexpr size_t kRetiredIncarnations = 8;

std::string NameOf(const std::vector<std::string>& names, int peer) {
  std::string name = "rank " + std::to_string(peer);
  if (peer >= 0 && static_cast<size_t>(peer) < names.size() &&
      !names[static_cast<size_t>(peer)].empty()) {
    name += " (" + names[static_cast<size_t>(peer)] + ")";
  }
  return name;
}

// Random and nonzero: a restarted process must not reuse its predecessor's value.
uint64_t NewIncarnation() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return v == 0 ? 1 : v;
}

}  // namespace

int NetMessageSender(const std::vector<uint8_t>& message) {
  if (message.size() < kNetTransportTrailerSize) return -1;
  const uint32_t rank = GetU32(message.data() + message.size() - kNetTransportTrailerSize + 4);
  return rank > static_cast<uint32_t>(INT32_MAX) ? -1 : static_cast<int>(rank);
}

struct NetTransport::Shared {
  Shared(int size, std::function<std::string(int)> name)
      : mailbox(size, std::move(name)),
        links(static_cast<size_t>(size > 0 ? size : 0)),
        known(links.size(), 0),
        fresh(links.size(), false),
        retired(links.size()) {}

  Mailbox mailbox;
  mutable std::mutex mu;
  std::vector<std::shared_ptr<net::Link>> links;
  std::vector<uint64_t> known;               // last incarnation heard from each peer; 0: none
  std::vector<bool> fresh;                   // something arrived on the peer's current link
  std::vector<std::vector<uint64_t>> retired;  // earlier incarnations of each peer
  uint64_t restarts = 0;
  AbortListener on_abort;

  // Sorts a message's sender incarnation: false when it comes from a retired incarnation (drop
  // it). Drops the peer's old messages when it restarted.
  bool Admit(int peer, uint64_t incarnation, const std::string& name) {
    bool restarted = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      const size_t p = static_cast<size_t>(peer);
      auto& old = retired[p];
      if (std::find(old.begin(), old.end(), incarnation) != old.end()) return false;
      if (known[p] != 0 && known[p] != incarnation) {
        old.push_back(known[p]);
        if (old.size() > kRetiredIncarnations) old.erase(old.begin());
        restarted = true;
        ++restarts;
      }
      known[p] = incarnation;
      fresh[p] = true;
    }
    if (restarted) {
      // Everything buffered from the peer so far came from its old incarnation: a new one's
      // first message is what told us it restarted.
      const size_t dropped = mailbox.DiscardPeer(peer);
      mailbox.ClearPeerFailure(peer);
      STRAIT_LOG(kInfo, kLog) << name << " restarted (new incarnation); dropped " << dropped
                              << " message(s) of its previous incarnation";
    }
    return true;
  }

  // A failed send fails the peer only while the link it went out on is still the peer's link.
  void LinkFailed(int peer, const std::weak_ptr<net::Link>& link, const Status& status,
                  const std::string& name) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto current = link.lock();
      if (current == nullptr || current != links[static_cast<size_t>(peer)]) return;
    }
    mailbox.FailPeer(peer, status.WithContext("link to " + name));
  }
};

NetTransport::NetTransport(int rank, int size, std::vector<std::string> names, uint32_t channel,
                           uint32_t channels)
    : rank_(rank),
      size_(size),
      names_(std::move(names)),
      channel_(channel),
      channels_(channels > 0 ? channels : 1),
      incarnation_(NewIncarnation()) {
  shared_ =
      std::make_shared<Shared>(size, [names = names_](int peer) { return NameOf(names, peer); });
}

NetTransport::~NetTransport() = default;

std::string NetTransport::PeerName(int peer) const {
  return NameOf(names_, peer);
}

NetTransport::Receiver NetTransport::ReceiverFor(int peer, Receiver other) {
  return [shared = shared_, channel = channel_, channels = channels_, peer,
          name = PeerName(peer), other = std::move(other)](uint32_t ch,
                                                           std::vector<uint8_t> message) {
    if (ch < channel || ch - channel >= channels) {
      if (other) other(ch, std::move(message));
      return;
    }
    std::string problem;
    const uint8_t* trailer = message.size() < kNetTransportTrailerSize
                                 ? nullptr
                                 : message.data() + message.size() - kNetTransportTrailerSize;
    if (trailer == nullptr) {
      problem = "a " + std::to_string(message.size()) + "-byte message, shorter than the trailer";
    } else if (trailer[0] != kNetTransportVersion) {
      problem = "collective message version " + std::to_string(trailer[0]) +
                " (this build speaks " + std::to_string(kNetTransportVersion) +
                "; upgrade the older side)";
    } else if (GetU32(trailer + 4) != static_cast<uint32_t>(peer)) {
      problem = "a message claiming sender rank " + std::to_string(GetU32(trailer + 4)) +
                " (rank numbering differs between the gateways' configurations)";
    } else if (GetU64(trailer + 16) == 0) {
      problem = "a message with incarnation 0";
    }
    if (!problem.empty()) {
      STRAIT_LOG(kWarn, kLog) << name << " sent " << problem;
      shared->mailbox.FailPeer(peer, DataLossError(name + " sent " + problem));
      return;
    }
    const uint8_t kind = trailer[1];
    if (kind > static_cast<uint8_t>(NetMessageKind::kHello)) {
      STRAIT_LOG(kWarn, kLog) << name << " sent a collective message of kind " << int{kind}
                              << ", unknown to this build; dropped (upgrade this gateway)";
      return;
    }
    if (!shared->Admit(peer, GetU64(trailer + 16), name)) return;  // from a dead incarnation
    const uint64_t tag = GetU64(trailer + 8);
    // Shrinking keeps the buffer: the payload stays where it arrived.
    message.resize(message.size() - kNetTransportTrailerSize);
    switch (static_cast<NetMessageKind>(kind)) {
      case NetMessageKind::kData:
        shared->mailbox.Deliver(peer, tag, std::move(message));
        return;
      case NetMessageKind::kHello:
        return;
      case NetMessageKind::kAbort: {
        const uint8_t* body = message.data();
        const size_t size = message.size();
        if (size < 4 || GetU32(body) > size - 4) {
          STRAIT_LOG(kWarn, kLog) << name << " sent a malformed abort";
          shared->mailbox.FailPeer(peer, DataLossError(name + " sent a malformed abort message"));
          return;
        }
        const size_t reason_size = GetU32(body);
        const std::string reason(reinterpret_cast<const char*>(body + 4), reason_size);
        const std::string note(reinterpret_cast<const char*>(body + 4 + reason_size),
                               size - 4 - reason_size);
        const uint64_t op = tag & kOpIdMask;
        shared->mailbox.Abort(op, AbortedError(name + " aborted the operation: " + reason));
        AbortListener listener;
        {
          std::lock_guard<std::mutex> lock(shared->mu);
          listener = shared->on_abort;
        }
        if (listener) listener(peer, op, note);
        return;
      }
    }
  };
}

void NetTransport::SetLink(int peer, std::shared_ptr<net::Link> link) {
  if (peer < 0 || peer >= size_) return;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    auto& slot = shared_->links[static_cast<size_t>(peer)];
    // A replacing link may lead to a restarted peer: its incarnation counts again once something
    // arrived on the new link. (A first link keeps what arrived before SetLink: a dialed link
    // may deliver the peer's hello before the caller gets here.)
    if (slot != nullptr && slot != link) shared_->fresh[static_cast<size_t>(peer)] = false;
    slot = link;
  }
  shared_->mailbox.ClearPeerFailure(peer);
  if (link != nullptr && peer != rank_) {
    SendOn(link, peer, NetMessageKind::kHello, 0, nullptr, 0, 0,
           Deadline::After(kControlSendNanos), [](Status) {});
  }
}

void NetTransport::SetAbortListener(AbortListener listener) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->on_abort = std::move(listener);
}

uint64_t NetTransport::PeerIncarnation(int peer) const {
  if (peer == rank_) return incarnation_;
  if (peer < 0 || peer >= size_) return 0;
  std::lock_guard<std::mutex> lock(shared_->mu);
  const size_t p = static_cast<size_t>(peer);
  return shared_->fresh[p] ? shared_->known[p] : 0;
}

uint64_t NetTransport::PeerRestarts() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->restarts;
}

void NetTransport::Forget(uint64_t op_id) { shared_->mailbox.Discard(op_id); }

size_t NetTransport::BufferedMessages() const { return shared_->mailbox.BufferedMessages(); }

const Mailbox& NetTransport::mailbox() const { return shared_->mailbox; }

void NetTransport::AppendTrailer(NetMessageKind kind, uint64_t tag,
                                 std::vector<uint8_t>* message) const {
  const size_t at = message->size();
  // Without the headroom, one exact move to a larger buffer (resize alone would double it).
  if (message->capacity() - at < kNetTransportTrailerSize) {
    message->reserve(at + kNetTransportTrailerSize);
  }
  message->resize(at + kNetTransportTrailerSize);  // zero-fills the reserved bytes
  uint8_t* out = message->data() + at;
  out[0] = kNetTransportVersion;
  out[1] = static_cast<uint8_t>(kind);
  PutU32(out + 4, static_cast<uint32_t>(rank_));
  PutU64(out + 8, tag);
  PutU64(out + 16, incarnation_);
}

void NetTransport::SendOn(const std::shared_ptr<net::Link>& link, int peer, NetMessageKind kind,
                          uint64_t tag, const uint8_t* payload, size_t size, uint32_t lane,
                          Deadline deadline, SendDone done) {
  std::vector<uint8_t> message;
  message.reserve(size + kNetTransportTrailerSize);
  if (size > 0) message.assign(payload, payload + size);
  AppendTrailer(kind, tag, &message);
  SendMessage(link, peer, std::move(message), lane, deadline, std::move(done));
}

void NetTransport::SendMessage(const std::shared_ptr<net::Link>& link, int peer,
                               std::vector<uint8_t> message, uint32_t lane, Deadline deadline,
                               SendDone done) {
  link->Send(channel_ + lane, std::move(message), deadline,
             [shared = shared_, peer, weak = std::weak_ptr<net::Link>(link), name = PeerName(peer),
              done = std::move(done)](Status status) {
               if (status.code() == StatusCode::kUnavailable) {
                 // The link is gone: nothing more will come from that peer either.
                 shared->LinkFailed(peer, weak, status, name);
               }
               if (done) done(std::move(status));
             });
}

void NetTransport::Send(int peer, uint64_t tag, std::vector<uint8_t> bytes, Deadline deadline,
                        SendDone done) {
  if (peer < 0 || peer >= size_) {
    done(InvalidArgumentError("send to rank " + std::to_string(peer) +
                              ", which is outside the world of " + std::to_string(size_)));
    return;
  }
  if (peer == rank_) {
    shared_->mailbox.Deliver(peer, tag, std::move(bytes));
    done(Status::Ok());
    return;
  }
  std::shared_ptr<net::Link> link;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    link = shared_->links[static_cast<size_t>(peer)];
  }
  if (link == nullptr) {
    done(FailedPreconditionError("no link to " + PeerName(peer) +
                                 " (the gateway is not connected to that region)"));
    return;
  }
  // The op id's lane picks the channel (see the constructor).
  const uint32_t lane = static_cast<uint32_t>(OpOfTag(tag) % channels_);
  // Within the capacity the sender left (kSendHeadroom) the trailer is written in place; a
  // message without it is moved once into a larger buffer by the vector.
  AppendTrailer(NetMessageKind::kData, tag, &bytes);
  SendMessage(link, peer, std::move(bytes), lane, deadline, std::move(done));
}

Status NetTransport::Recv(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out) {
  return shared_->mailbox.Receive(peer, tag, deadline, out);
}

Status NetTransport::RecvStamped(int peer, uint64_t tag, Deadline deadline,
                                 std::vector<uint8_t>* out, int64_t* arrived_ns) {
  return shared_->mailbox.Receive(peer, tag, deadline, out, arrived_ns);
}

void NetTransport::Abort(uint64_t op_id, const Status& why, const std::string& note) {
  op_id &= kOpIdMask;
  shared_->mailbox.Abort(op_id, AbortedError("this gateway aborted the operation: " +
                                             why.ToString()));
  std::string reason = why.ToString().substr(0, kMaxAbortReasonBytes);
  const std::string cut_note = note.substr(0, kMaxAbortNoteBytes);
  std::vector<uint8_t> payload(4 + reason.size() + cut_note.size());
  PutU32(payload.data(), static_cast<uint32_t>(reason.size()));
  std::memcpy(payload.data() + 4, reason.data(), reason.size());
  if (!cut_note.empty()) {
    std::memcpy(payload.data() + 4 + reason.size(), cut_note.data(), cut_note.size());
  }
  std::vector<std::shared_ptr<net::Link>> links;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    links = shared_->links;
  }
  const uint32_t lane = static_cast<uint32_t>(op_id % channels_);
  for (int p = 0; p < size_; ++p) {
    const auto& link = links[static_cast<size_t>(p)];
    if (p == rank_ || link == nullptr) continue;
    SendOn(link, p, NetMessageKind::kAbort, op_id, payload.data(), payload.size(), lane,
           Deadline::After(kControlSendNanos), [](Status) {});
  }
}

}  // namespace strait::collective
