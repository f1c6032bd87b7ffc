// NetTransport: frames collective messages with a 16-byte header and sorts what arrives into
// a mailbox keyed by (peer, tag). The only file of strait::collective that uses strait::net.
#include "collective/net_transport.h"

#include <cstring>
#include <utility>

#include "common/log.h"
#include "net/link.h"

namespace strait::collective {
namespace {

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string NameOf(const std::vector<std::string>& names, int peer) {
  std::string name = "rank " + std::to_string(peer);
  if (peer >= 0 && static_cast<size_t>(peer) < names.size() &&
      !names[static_cast<size_t>(peer)].empty()) {
    name += " (" + names[static_cast<size_t>(peer)] + ")";
  }
  return name;
}

}  // namespace

NetTransport::NetTransport(int rank, int size, std::vector<std::string> names, uint32_t channel)
    : rank_(rank),
      size_(size),
      names_(std::move(names)),
      channel_(channel),
      links_(static_cast<size_t>(size > 0 ? size : 0)) {
  mailbox_ =
      std::make_shared<Mailbox>(size, [names = names_](int peer) { return NameOf(names, peer); });
}

NetTransport::~NetTransport() = default;

std::string NetTransport::PeerName(int peer) const {
  return NameOf(names_, peer);
}

NetTransport::Receiver NetTransport::ReceiverFor(int peer, Receiver other) {
  return [mailbox = mailbox_, channel = channel_, peer, name = PeerName(peer),
          other = std::move(other)](uint32_t ch, std::vector<uint8_t> message) {
    if (ch != channel) {
      if (other) other(ch, std::move(message));
      return;
    }
    std::string problem;
    if (message.size() < kNetTransportHeaderSize) {
      problem = "a " + std::to_string(message.size()) + "-byte message, shorter than the header";
    } else if (message[0] != kNetTransportVersion) {
      problem = "collective message version " + std::to_string(message[0]) +
                " (this build "
                "speaks " +
                std::to_string(kNetTransportVersion) + "; upgrade the older side)";
    } else if (message[1] != 0) {
      problem = "unknown collective message kind " + std::to_string(message[1]);
    } else if (GetU32(&message[4]) != static_cast<uint32_t>(peer)) {
      problem = "a message claiming sender rank " + std::to_string(GetU32(&message[4])) +
                " (rank numbering differs between the gateways' configurations)";
    }
    if (!problem.empty()) {
      STRAIT_LOG(kWarn, "collective") << name << " sent " << problem;
      mailbox->FailPeer(peer, DataLossError(name + " sent " + problem));
      return;
    }
    const uint64_t tag = GetU64(&message[8]);
    message.erase(message.begin(), message.begin() + kNetTransportHeaderSize);
    mailbox->Deliver(peer, tag, std::move(message));
  };
}

void NetTransport::SetLink(int peer, std::shared_ptr<net::Link> link) {
  if (peer < 0 || peer >= size_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    links_[static_cast<size_t>(peer)] = std::move(link);
  }
  mailbox_->ClearPeerFailure(peer);
}

void NetTransport::Send(int peer, uint64_t tag, std::vector<uint8_t> bytes, Deadline deadline,
                        SendDone done) {
  if (peer < 0 || peer >= size_) {
    done(InvalidArgumentError("send to rank " + std::to_string(peer) +
                              ", which is outside the world of " + std::to_string(size_)));
    return;
  }
  if (peer == rank_) {
    mailbox_->Deliver(peer, tag, std::move(bytes));
    done(Status::Ok());
    return;
  }
  std::shared_ptr<net::Link> link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    link = links_[static_cast<size_t>(peer)];
  }
  if (link == nullptr) {
    done(FailedPreconditionError("no link to " + PeerName(peer) +
                                 " (the gateway is not connected to that region)"));
    return;
  }
  std::vector<uint8_t> message(kNetTransportHeaderSize + bytes.size());
  message[0] = kNetTransportVersion;
  PutU32(&message[4], static_cast<uint32_t>(rank_));
  PutU64(&message[8], tag);
  if (!bytes.empty()) {
    std::memcpy(message.data() + kNetTransportHeaderSize, bytes.data(), bytes.size());
  }
  bytes = {};
  link->Send(
      channel_, std::move(message), deadline,
      [mailbox = mailbox_, peer, name = PeerName(peer), done = std::move(done)](Status status) {
        if (status.code() == StatusCode::kUnavailable) {
          // The link is gone: nothing more will come from that peer either.
          mailbox->FailPeer(peer, status.WithContext("link to " + name));
        }
        done(std::move(status));
      });
}

Status NetTransport::Recv(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out) {
  return mailbox_->Receive(peer, tag, deadline, out);
}

}  // namespace strait::collective
