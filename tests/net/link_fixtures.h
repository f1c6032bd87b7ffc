// What the loopback link tests share (link_test.cc: traffic, pools, pacing and closing;
// link_peers_test.cc: bad peers, bad configuration, unreachable peers; link_wan_test.cc and
// tls_reload_test.cc take the certificates and waits): throwaway certificates
// for "us", "eu", "ap" and a rogue "eu" of another CA, endpoint options with short timers, a
// listening Server that collects what it receives, and bounded waits. Every wait has a deadline.
#ifndef STRAIT_TESTS_NET_LINK_FIXTURES_H_
#define STRAIT_TESTS_NET_LINK_FIXTURES_H_

#include <gtest/gtest.h>

#include <array>
#include <asio.hpp>
#include <asio/ssl.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "net/link.h"
#include "strait/status.h"
#include "tests/net/test_certs.h"

namespace strait::net {

using testing::CertFiles;
using testing::TestPki;

inline std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v[i] = static_cast<uint8_t>(x);
  }
  return v;
}

// Collects received messages per channel; waits with a deadline.
class Collector {
 public:
  MessageCallback Callback(std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    return [this, delay](uint32_t channel, std::vector<uint8_t> message) {
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      std::lock_guard<std::mutex> lock(mu_);
      messages_[channel].push_back(std::move(message));
      ++count_;
      cv_.notify_all();
    };
  }
  bool WaitFor(size_t n, double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return count_ >= n; });
  }
  std::map<uint32_t, std::vector<std::vector<uint8_t>>> messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return count_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint32_t, std::vector<std::vector<uint8_t>>> messages_;
  size_t count_ = 0;
};

// Counts send completions; waits with a deadline.
class SendTracker {
 public:
  SendDone Done() {
    return [this](Status s) {
      std::lock_guard<std::mutex> lock(mu_);
      results_.push_back(std::move(s));
      cv_.notify_all();
    };
  }
  bool WaitFor(size_t n, double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                        [&] { return results_.size() >= n; });
  }
  std::vector<Status> results() {
    std::lock_guard<std::mutex> lock(mu_);
    return results_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Status> results_;
};

template <typename Pred>
bool Eventually(Pred pred, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

class NetLink : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto pki = TestPki::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_.emplace(std::move(pki).value());
    ASSERT_TRUE(pki_->MakeCa("cluster-ca").ok());
    ASSERT_TRUE(pki_->MakeCa("other-ca").ok());
    auto make = [](const char* ca, const char* region, const char* stem) {
      auto files = pki_->MakeGateway(ca, region, stem);
      EXPECT_TRUE(files.ok()) << files.status();
      return files.ok() ? *files : CertFiles{};
    };
    us_ = make("cluster-ca", "us", "us");
    eu_ = make("cluster-ca", "eu", "eu");
    ap_ = make("cluster-ca", "ap", "ap");
    rogue_eu_ = make("other-ca", "eu", "rogue-eu");
  }
  static void TearDownTestSuite() { pki_.reset(); }

  static EndpointOptions Options(const std::string& region, const CertFiles& files,
                                 std::vector<std::string> peers,
                                 Transport transport = Transport::kTls) {
    EndpointOptions o;
    o.region = region;
    o.transport = transport;
    o.ca_file = files.ca;
    o.cert_file = files.cert;
    o.key_file = files.key;
    o.peer_regions = std::move(peers);
    o.link.streams = 4;
    o.link.chunk_bytes = 64 * 1024;
    o.link.handshake_timeout_ns = 2'000'000'000;
    o.link.redial_initial_ns = 10'000'000;
    o.link.redial_max_ns = 100'000'000;
    o.link.unreachable_after_ns = 3'000'000'000;
    o.link.ping_interval_ns = 50'000'000;
    return o;
  }

  // An endpoint made from `options`, with a link dialled to the "us" listener at `port`, once
  // `streams` of the link's streams are up (0: at once, before any is): the set-up most tests
  // start from.
  struct Dialled {
    std::unique_ptr<Endpoint> endpoint;  // declared first: the link goes before it
    std::shared_ptr<Link> link;
  };
  static StatusOr<Dialled> Dial(EndpointOptions options, uint16_t port, int streams = 4,
                                MessageCallback on_message = nullptr) {
    auto endpoint = Endpoint::Create(std::move(options), nullptr);
    if (!endpoint.ok()) return endpoint.status();
    Dialled d{std::move(endpoint).value(), nullptr};
    auto link = d.endpoint->Connect("us", "127.0.0.1", port, std::move(on_message));
    if (!link.ok()) return link.status();
    d.link = std::move(link).value();
    if (streams > 0) {
      STRAIT_RETURN_IF_ERROR(d.link->WaitForStreams(streams, Deadline::AfterSeconds(10)));
    }
    return d;
  }

  static inline std::optional<TestPki> pki_;
  static inline CertFiles us_, eu_, ap_, rogue_eu_;
};

// A listening "us" endpoint that collects what accepted links receive.
struct Server {
  // The endpoint first: its I/O thread may still be delivering into `received` (a send
  // completes once acknowledged, which may be before the receive callback returned).
  ~Server() { endpoint.reset(); }

  std::unique_ptr<Endpoint> endpoint;
  uint16_t port = 0;
  Collector received;
  std::mutex mu;
  std::vector<std::shared_ptr<Link>> links;

  Status Start(EndpointOptions options, std::chrono::milliseconds delay = {}) {
    auto e = Endpoint::Create(std::move(options), [this, delay](std::shared_ptr<Link> link) {
      std::lock_guard<std::mutex> lock(mu);
      links.push_back(std::move(link));
      return received.Callback(delay);
    });
    if (!e.ok()) return e.status();
    endpoint = std::move(e).value();
    auto p = endpoint->Listen("127.0.0.1", 0);
    if (!p.ok()) return p.status();
    port = *p;
    return Status::Ok();
  }
  std::shared_ptr<Link> link(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    return i < links.size() ? links[i] : nullptr;
  }
};

// Opens a raw connection to the listener (TLS with `tls` when given), writes `bytes`, and
// reports whether the listener closed the connection within `seconds`.
inline bool RawPeerIsClosed(uint16_t port, const CertFiles* tls, const std::vector<uint8_t>& bytes,
                     double seconds) {
  asio::io_context io;
  asio::ip::tcp::endpoint at(asio::ip::make_address("127.0.0.1"), port);
  asio::error_code ec;
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  std::optional<asio::ssl::stream<asio::ip::tcp::socket>> ssl;
  std::optional<asio::ip::tcp::socket> plain;
  if (tls != nullptr) {
    ctx.load_verify_file(tls->ca, ec);
    ctx.use_certificate_chain_file(tls->cert, ec);
    ctx.use_private_key_file(tls->key, asio::ssl::context::pem, ec);
    if (ec) return false;
    ssl.emplace(io, ctx);
    ssl->next_layer().connect(at, ec);
    if (ec) return false;
    ssl->handshake(asio::ssl::stream_base::client, ec);
    if (ec) return true;  // refused during the handshake
    asio::write(*ssl, asio::buffer(bytes), ec);
  } else {
    plain.emplace(io);
    plain->connect(at, ec);
    if (ec) return false;
    asio::write(*plain, asio::buffer(bytes), ec);
  }
  // Reads (the listener's hello, if any) until the connection fails or the time is up.
  bool closed = false;
  std::array<uint8_t, 256> buf;
  std::function<void(const asio::error_code&, size_t)> on_read;
  auto read_more = [&] {
    if (ssl) {
      ssl->async_read_some(asio::buffer(buf), on_read);
    } else {
      plain->async_read_some(asio::buffer(buf), on_read);
    }
  };
  on_read = [&](const asio::error_code& rec, size_t) {
    if (rec) {
      closed = true;
    } else {
      read_more();
    }
  };
  read_more();
  io.run_for(std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(seconds)));
  return closed;
}

}  // namespace strait::net

#endif  // STRAIT_TESTS_NET_LINK_FIXTURES_H_
