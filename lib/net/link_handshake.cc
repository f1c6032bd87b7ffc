// Setting up a stream, both sides of it: the dialer's (LinkCore: TCP connect, TLS handshake and
// the check of the peer's certificate, the hello exchange, redial with backoff) and the
// acceptor's admission (EndpointCore: TLS handshake, the hello checks against certificate and
// configured peers, finding or creating the link the stream belongs to, refusals with one
// rate-limited warning and a counter). The hello itself is wire.h's.
//
// Apart from the rest of LinkCore and EndpointCore so that the two halves of one handshake are
// read side by side: a check added on one side usually needs its answer on the other.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include <asio.hpp>
#include <asio/ssl.hpp>

#include "common/log.h"
#include "common/log_limiter.h"
#include "net/endpoint_core.h"
#include "net/link_core.h"
#include "net/runtime.h"
#include "net/stream_conn.h"
#include "net/tls.h"

namespace strait::net {

using asio::ip::tcp;

// ---- Dialing (LinkCore) -----------------------------------------------------------------------

void LinkCore::Dial(int slot) {
  if (state_ != State::kActive || slot >= target_streams_) return;
  auto stream = std::make_shared<StreamConn>(tcp::socket(endpoint_->io()),
                                             in_region_ ? nullptr : endpoint_->tls(),
                                             peer_name_ + " stream " + std::to_string(slot));
  stream->slot = slot;
  dialing_[slot] = stream;
  auto self = shared_from_this();
  stream->ArmDeadline(options_.handshake_timeout_ns);
  stream->Lowest().async_connect(address_, [self, stream](const asio::error_code& ec) {
    if (ec) return self->DialFailed(stream, "connect: " + Describe(ec));
    if (Status s = stream->Configure(self->options_); !s.ok()) {
      STRAIT_LOG(kWarn, "net") << stream->peer() << ": socket options: " << s;
    }
    if (stream->tls() == nullptr) return self->SendHello(stream);
    stream->tls()->async_handshake(
        asio::ssl::stream_base::client, [self, stream](const asio::error_code& hec) {
          if (hec) return self->DialFailed(stream, "TLS handshake: " + Describe(hec));
          StatusOr<std::string> region = PeerRegion(stream->tls()->native_handle());
          if (!region.ok()) {
            self->endpoint_->Count([](EndpointCounters& c) { ++c.identity_mismatch; });
            return self->DialFailed(stream, region.status().message());
          }
          if (*region != self->peer_region_) {
            self->endpoint_->Count([](EndpointCounters& c) { ++c.identity_mismatch; });
            return self->DialFailed(stream, "peer certificate names region '" + *region +
                                                "', expected '" + self->peer_region_ + "'");
          }
          self->SendHello(stream);
        });
  });
}

void LinkCore::SendHello(const std::shared_ptr<StreamConn>& stream) {
  Hello hello;
  hello.flags = ever_attached_ ? kHelloResume : 0;
  hello.session_id = session_id_;
  hello.stream_index = static_cast<uint16_t>(stream->slot);
  hello.region = endpoint_->options().region;
  stream->hello = EncodeHello(hello);
  auto self = shared_from_this();
  stream->Write(asio::buffer(stream->hello), [self, stream](const asio::error_code& ec,
                                                            size_t) {
    if (ec) return self->DialFailed(stream, "sending hello: " + Describe(ec));
    stream->hello.assign(kHelloFixedBytes, 0);
    stream->Read(asio::buffer(stream->hello), [self, stream](const asio::error_code& rec,
                                                             size_t) {
      if (rec) {
        return self->DialFailed(stream, "reading the peer's hello: " + Describe(rec) +
                                            " (the peer refused this gateway; see its log)");
      }
      Hello reply;
      size_t region_length = 0;
      HelloError kind;
      Status s = ParseHelloFixed(stream->hello, &reply, &region_length, &kind);
      if (!s.ok()) {
        self->endpoint_->Count([kind](EndpointCounters& c) {
          if (kind == HelloError::kBadMagic) ++c.bad_magic;
          else if (kind == HelloError::kBadVersion) ++c.bad_version;
          else ++c.bad_hello;
        });
        return self->DialFailed(stream, s.message());
      }
      stream->hello.assign(region_length, 0);
      stream->Read(asio::buffer(stream->hello), [self, stream, reply](
                                                    const asio::error_code& gec, size_t) {
        if (gec) return self->DialFailed(stream, "reading the peer's hello: " + Describe(gec));
        std::string region(stream->hello.begin(), stream->hello.end());
        if (region == self->peer_region_ && (reply.flags & kHelloUnknownSession)) {
          stream->Close();
          self->End(State::kFailed,
                    UnavailableError("peer " + self->peer_name_ +
                                     " restarted: it no longer knows this link, so messages "
                                     "it had not acknowledged are lost; open a new link"),
                    true);
          return;
        }
        if (region != self->peer_region_ || reply.session_id != self->session_id_ ||
            reply.stream_index != stream->slot) {
          self->endpoint_->Count([](EndpointCounters& c) { ++c.identity_mismatch; });
          return self->DialFailed(stream, "peer answered as region '" + region +
                                              "' for another session or stream");
        }
        stream->DisarmDeadline();
        self->dialing_.erase(stream->slot);
        self->Attach(stream, stream->slot);
      });
    });
  });
}

void LinkCore::DialFailed(const std::shared_ptr<StreamConn>& stream, const std::string& why) {
  const bool timed_out = stream->timed_out();
  stream->Close();
  if (dialing_.count(stream->slot) && dialing_[stream->slot] == stream) {
    dialing_.erase(stream->slot);
  }
  if (state_ != State::kActive) return;
  ++est_.stream_failures;
  last_error_ = (timed_out ? "timed out (" + why + ")" : why);
  if (timed_out) endpoint_->Count([](EndpointCounters& c) { ++c.handshake_timeouts; });
  // The first failure since a stream was last up warns; redials failing the same way would
  // repeat it every backoff step for as long as the peer is away.
  if (!dial_warned_) {
    dial_warned_ = true;
    STRAIT_LOG(kWarn, "net") << "dialing " << stream->peer() << " failed: " << last_error_
                             << "; redialling with backoff (further failures are logged at "
                                "debug level until a stream comes up)";
  } else {
    STRAIT_LOG(kDebug, "net") << "dialing " << stream->peer() << " failed: " << last_error_;
  }
  ScheduleRedial(stream->slot);
  Publish();
}

void LinkCore::ScheduleRedial(int slot) {
  if (state_ != State::kActive || role_ != Role::kDialer || slot >= target_streams_) return;
  int& attempt = redial_attempts_[slot];
  const double base = std::min(static_cast<double>(options_.redial_max_ns),
                               static_cast<double>(options_.redial_initial_ns) *
                                   std::pow(2.0, std::min(attempt, 30)));
  ++attempt;
  const double jitter = 0.5 + 0.5 * static_cast<double>(RandomU64() >> 11) * 0x1.0p-53;
  auto timer = std::make_shared<asio::steady_timer>(endpoint_->io());
  timer->expires_after(std::chrono::nanoseconds(static_cast<int64_t>(base * jitter)));
  redial_timers_[slot] = timer;
  timer->async_wait([self = shared_from_this(), slot, timer](const asio::error_code& ec) {
    if (ec || self->redial_timers_[slot] != timer) return;
    self->redial_timers_.erase(slot);
    if (!self->slots_[slot] && !self->dialing_.count(slot)) self->Dial(slot);
  });
}

// ---- Admitting accepted streams (EndpointCore) ------------------------------------------------

void EndpointCore::Refuse(const std::shared_ptr<StreamConn>& stream, const std::string& why,
                          uint64_t EndpointCounters::*counter) {
  if (stream->timed_out()) counter = &EndpointCounters::handshake_timeouts;
  if (stream->evicted()) counter = &EndpointCounters::setup_overflows;
  Count([counter](EndpointCounters& c) { ++(c.*counter); });
  // A refused peer redials with backoff, from a new port each time: one WARN per source address
  // and reason, then one line per interval with the count (the counters have every refusal).
  const std::string reason =
      stream->timed_out() ? "timed out during setup (" + why + ")"
      : stream->evicted()
          ? "closed during setup for a newer connection (more than " +
                std::to_string(max_pending_) + " setting up at once: a flood?)"
          : why;
  const std::string& peer = stream->peer();
  const std::string host = peer.substr(0, peer.rfind(':'));
  const LogRateLimiter::Decision d = refusal_log_.Admit(host + " " + reason, MonotonicNanos());
  if (d.log) {
    const int64_t interval_s = refusal_log_.interval_ns() / 1'000'000'000;
    STRAIT_LOG(kWarn, "net") << "refused stream from " << peer << ": " << reason
                             << (d.suppressed == 0
                                     ? " (repeats from " + host + " are summarised every " +
                                           std::to_string(interval_s) + " s)"
                                     : " (and " + std::to_string(d.suppressed) +
                                           " more times from " + host + " since the last line)");
  }
  stream->Close();
  EndSetup(stream);
}

void EndpointCore::SetUpAccepted(std::shared_ptr<StreamConn> stream) {
  handshaking_.insert(stream);
  stream->ArmDeadline(options_.link.handshake_timeout_ns);
  if (Status s = stream->Configure(options_.link); !s.ok()) {
    STRAIT_LOG(kWarn, "net") << stream->peer() << ": socket options: " << s;
  }
  auto self = shared_from_this();
  if (stream->tls() == nullptr) return ReadHello(std::move(stream), "");
  stream->tls()->async_handshake(
      asio::ssl::stream_base::server, [self, stream](const asio::error_code& ec) {
        if (ec) {
          return self->Refuse(stream, "TLS handshake failed: " + ec.message(),
                              &EndpointCounters::tls_handshake_failures);
        }
        StatusOr<std::string> region = PeerRegion(stream->tls()->native_handle());
        if (!region.ok()) {
          return self->Refuse(stream, region.status().message(),
                              &EndpointCounters::unknown_region);
        }
        if (!self->AllowedPeer(*region)) {
          return self->Refuse(stream,
                              "certificate names region '" + *region +
                                  "', which is not among the configured peer regions",
                              &EndpointCounters::unknown_region);
        }
        self->ReadHello(stream, *region);
      });
}

void EndpointCore::ReadHello(std::shared_ptr<StreamConn> stream, std::string cert_region) {
  auto self = shared_from_this();
  stream->hello.assign(kHelloFixedBytes, 0);
  stream->Read(asio::buffer(stream->hello), [self, stream, cert_region](
                                                const asio::error_code& ec, size_t) {
    if (ec) {
      return self->Refuse(stream, "no hello: " + ec.message(), &EndpointCounters::bad_hello);
    }
    Hello hello;
    size_t region_length = 0;
    HelloError kind;
    if (Status s = ParseHelloFixed(stream->hello, &hello, &region_length, &kind); !s.ok()) {
      auto counter = kind == HelloError::kBadMagic     ? &EndpointCounters::bad_magic
                     : kind == HelloError::kBadVersion ? &EndpointCounters::bad_version
                                                       : &EndpointCounters::bad_hello;
      return self->Refuse(stream, s.message(), counter);
    }
    stream->hello.assign(region_length, 0);
    stream->Read(asio::buffer(stream->hello), [self, stream, cert_region, hello](
                                                  const asio::error_code& rec, size_t) mutable {
      if (rec) {
        return self->Refuse(stream, "hello truncated: " + rec.message(),
                            &EndpointCounters::bad_hello);
      }
      hello.region.assign(stream->hello.begin(), stream->hello.end());
      if (!IsValidRegionName(hello.region)) {
        return self->Refuse(stream, "hello names an invalid region", &EndpointCounters::bad_hello);
      }
      if (!cert_region.empty() && hello.region != cert_region) {
        return self->Refuse(stream,
                            "hello claims region '" + hello.region +
                                "' but the certificate names '" + cert_region + "'",
                            &EndpointCounters::identity_mismatch);
      }
      if (!self->AllowedPeer(hello.region)) {
        return self->Refuse(stream,
                            "region '" + hello.region + "' is not among the configured peers",
                            &EndpointCounters::unknown_region);
      }
      if (stream->in_region && hello.region != self->options_.region) {
        return self->Refuse(stream,
                            "hello claims region '" + hello.region +
                                "' on the plain listener for the gateways of region '" +
                                self->options_.region + "' (it admits only them)",
                            &EndpointCounters::identity_mismatch);
      }
      // Find or create the link this stream belongs to.
      const auto key = std::make_pair(hello.region, hello.session_id);
      std::shared_ptr<LinkCore> link;
      if (auto it = self->sessions_.find(key); it != self->sessions_.end()) {
        link = it->second;
        // A plain stream must not join a link set up over the WAN listener (nor the reverse):
        // its session id would be all a plain peer needs to read and inject the link's
        // messages. And a plain link's streams all come from the address of its first one, so
        // that one listed gateway cannot join another's link.
        if (link->in_region() != stream->in_region) {
          return self->Refuse(stream,
                              std::string("a stream from the ") +
                                  (stream->in_region ? "in-region" : "WAN") +
                                  " listener for a link set up over the " +
                                  (link->in_region() ? "in-region" : "WAN") + " listener",
                              &EndpointCounters::identity_mismatch);
        }
        if (stream->in_region) {
          asio::error_code aec;
          const tcp::endpoint from = stream->Lowest().remote_endpoint(aec);
          if (aec || UnmappedAddress(from.address()) != UnmappedAddress(link->address().address())) {
            return self->Refuse(stream,
                                "a plain stream for a link of another address (" +
                                    link->address().address().to_string() + ")",
                                &EndpointCounters::identity_mismatch);
          }
        }
      } else if (hello.flags & kHelloResume) {
        // A redial of a link this process never had: it restarted (or forgot a failed link).
        // Joining it to a fresh link would pair the dialer's sequence numbers and message ids
        // with a receiver starting from 0; say so, so that the dialer fails the link and opens
        // a new one.
        self->Count([](EndpointCounters& c) { ++c.unknown_sessions; });
        STRAIT_LOG(kInfo, "net") << "redial from " << hello.region
                                 << " for a link this process does not know (one side "
                                    "restarted): telling it to open a new link";
        Hello reply;
        reply.flags = kHelloUnknownSession;
        reply.session_id = hello.session_id;
        reply.stream_index = hello.stream_index;
        reply.region = self->options_.region;
        stream->hello = EncodeHello(reply);
        stream->Write(asio::buffer(stream->hello), [self, stream](const asio::error_code&,
                                                                  size_t) {
          stream->DisarmDeadline();
          stream->Close();
          self->EndSetup(stream);
        });
        return;
      } else {
        auto runtime = self->runtime_.lock();
        if (!runtime) return self->Refuse(stream, "shutting down", &EndpointCounters::bad_hello);
        asio::error_code pec;
        link = std::make_shared<LinkCore>(self, LinkCore::Role::kAcceptor, hello.region,
                                          stream->Lowest().remote_endpoint(pec),
                                          hello.session_id, nullptr, stream->in_region);
        self->sessions_[key] = link;
        self->links_.push_back(link);
        self->Count([](EndpointCounters& c) { ++c.links_accepted; });
        link->Start();
        STRAIT_LOG(kInfo, "net") << "accepted link from " << link->peer_name();
        if (self->on_accept_) {
          auto handle = std::make_shared<Link>(
              std::make_unique<Link::Impl>(Link::Impl{std::move(runtime), link}));
          link->set_on_message(self->on_accept_(std::move(handle)));
        }
      }
      // Answer with our hello, then join the stream to the link.
      Hello reply;
      reply.session_id = hello.session_id;
      reply.stream_index = hello.stream_index;
      reply.region = self->options_.region;
      stream->hello = EncodeHello(reply);
      const int index = hello.stream_index;
      stream->Write(asio::buffer(stream->hello), [self, stream, link, index](
                                                     const asio::error_code& wec, size_t) {
        if (wec) {
          return self->Refuse(stream, "sending hello: " + wec.message(),
                              &EndpointCounters::bad_hello);
        }
        stream->DisarmDeadline();
        self->EndSetup(stream);
        self->Count([](EndpointCounters& c) { ++c.streams_accepted; });
        if (!link->active()) {
          stream->Close();
          return;
        }
        link->AttachAccepted(stream, index);
      });
    });
  });
}

}  // namespace strait::net
