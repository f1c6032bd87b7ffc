// Certificate rotation without dropping links (Endpoint::ReloadIdentity): after the files are
// replaced and reloaded, new handshakes present the new certificate (a peer that trusts only
// the new CA accepts the new link) while a link set up before keeps its streams and delivers;
// a bad new file is refused with an error naming it, and the identity in use stays.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "net/link.h"
#include "tests/net/link_fixtures.h"

namespace strait::net {
namespace {

namespace fs = std::filesystem;
using testing::CertFiles;
using testing::TestPki;

// A listening endpoint that counts what its accepted links deliver.
struct Peer {
  ~Peer() { endpoint.reset(); }
  Status Start(EndpointOptions options) {
    auto e = Endpoint::Create(std::move(options), [this](std::shared_ptr<Link> link) {
      std::lock_guard<std::mutex> lock(mu);
      links.push_back(std::move(link));
      return [this](uint32_t, std::vector<uint8_t> message) {
        std::lock_guard<std::mutex> inner(mu);
        received += message.size();
        ++messages;
        cv.notify_all();
      };
    });
    if (!e.ok()) return e.status();
    endpoint = std::move(e).value();
    auto p = endpoint->Listen("127.0.0.1", 0);
    if (!p.ok()) return p.status();
    port = *p;
    return Status::Ok();
  }
  bool WaitForMessages(size_t n, double seconds) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return messages >= n; });
  }
  std::unique_ptr<Endpoint> endpoint;
  uint16_t port = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<Link>> links;
  size_t received = 0;
  size_t messages = 0;
};

MessageCallback Ignore() {
  return [](uint32_t, std::vector<uint8_t>) {};
}

EndpointOptions Options(const std::string& region, const std::string& ca, const std::string& cert,
                        const std::string& key, std::vector<std::string> peers) {
  EndpointOptions o;
  o.region = region;
  o.ca_file = ca;
  o.cert_file = cert;
  o.key_file = key;
  o.peer_regions = std::move(peers);
  o.link.streams = 2;
  o.link.adapt_streams = false;
  o.link.handshake_timeout_ns = 2'000'000'000;
  o.link.redial_initial_ns = 10'000'000;
  o.link.redial_max_ns = 100'000'000;
  o.link.unreachable_after_ns = 5'000'000'000;
  o.link.ping_interval_ns = 50'000'000;
  return o;
}

std::string Cat(const std::vector<std::string>& files) {
  std::string out;
  for (const std::string& f : files) {
    std::ifstream in(f);
    out += std::string(std::istreambuf_iterator<char>(in), {});
  }
  return out;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

class TlsReload : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = TestPki::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_.emplace(std::move(pki).value());
    ASSERT_TRUE(pki_->MakeCa("old-ca").ok());
    ASSERT_TRUE(pki_->MakeCa("new-ca").ok());
    auto make = [this](const char* ca, const char* region, const char* stem) {
      auto files = pki_->MakeGateway(ca, region, stem);
      EXPECT_TRUE(files.ok()) << files.status();
      return files.ok() ? *files : CertFiles{};
    };
    a_old_ = make("old-ca", "a", "a-old");
    a_new_ = make("new-ca", "a", "a-new");
    a_wrong_region_ = make("new-ca", "z", "z-new");
    b_ = make("old-ca", "b", "b");
    c_ = make("new-ca", "c", "c");
    char tmpl[] = "/tmp/strait-tls-reload-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    bundle_ = dir_ + "/bundle.pem";
    Write(bundle_, Cat({a_old_.ca, a_new_.ca}));
    // The files "a" is configured with; the test replaces their contents as an operator would.
    a_cert_ = dir_ + "/a.pem";
    a_key_ = dir_ + "/a.key";
    fs::copy_file(a_old_.cert, a_cert_);
    fs::copy_file(a_old_.key, a_key_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
    pki_.reset();
  }
  void Install(const CertFiles& files) {
    fs::copy_file(files.cert, a_cert_, fs::copy_options::overwrite_existing);
    fs::copy_file(files.key, a_key_, fs::copy_options::overwrite_existing);
  }

  std::optional<TestPki> pki_;
  CertFiles a_old_, a_new_, a_wrong_region_, b_, c_;
  std::string dir_, bundle_, a_cert_, a_key_;
};

TEST_F(TlsReload, NewHandshakesUseTheNewCertificateAndOldLinksStayUp) {
  // b trusts both CAs; c only the new one, so c accepts "a" only once it presents its new
  // certificate.
  Peer b, c;
  ASSERT_TRUE(b.Start(Options("b", bundle_, b_.cert, b_.key, {"a"})).ok());
  ASSERT_TRUE(c.Start(Options("c", c_.ca, c_.cert, c_.key, {"a"})).ok());
  auto a = Endpoint::Create(Options("a", bundle_, a_cert_, a_key_, {"b", "c"}), nullptr);
  ASSERT_TRUE(a.ok()) << a.status();

  auto ab = (*a)->Connect("b", "127.0.0.1", b.port, Ignore());
  ASSERT_TRUE(ab.ok()) << ab.status();
  ASSERT_TRUE((*ab)->WaitForStreams(2, Deadline::AfterSeconds(10)).ok());
  ASSERT_TRUE(
      (*ab)->SendAndWait(0, std::vector<uint8_t>(1000, 1), Deadline::AfterSeconds(10)).ok());

  // Before the reload c refuses "a": its certificate chains to the old CA only.
  auto ac_before = (*a)->Connect("c", "127.0.0.1", c.port, Ignore());
  ASSERT_TRUE(ac_before.ok());
  EXPECT_TRUE(Eventually([&] { return c.endpoint->Counters().tls_handshake_failures > 0; }, 10));
  EXPECT_EQ(c.endpoint->Counters().links_accepted, 0u);
  (*ac_before)->Close();

  Install(a_new_);
  ASSERT_TRUE((*a)->ReloadIdentity().ok());

  auto ac = (*a)->Connect("c", "127.0.0.1", c.port, Ignore());
  ASSERT_TRUE(ac.ok());
  EXPECT_TRUE((*ac)->WaitForStreams(2, Deadline::AfterSeconds(10)).ok());
  EXPECT_TRUE((*ac)->SendAndWait(0, std::vector<uint8_t>(500, 2), Deadline::AfterSeconds(10)).ok());
  EXPECT_TRUE(c.WaitForMessages(1, 10));

  // The old link kept its streams (no redial: b accepted no new stream) and still delivers.
  const uint64_t b_streams = b.endpoint->Counters().streams_accepted;
  EXPECT_TRUE(
      (*ab)->SendAndWait(0, std::vector<uint8_t>(2000, 3), Deadline::AfterSeconds(10)).ok());
  EXPECT_TRUE(b.WaitForMessages(2, 10));
  EXPECT_EQ(b.endpoint->Counters().streams_accepted, b_streams);
  EXPECT_EQ((*ab)->Estimates().stream_failures, 0u);
  EXPECT_EQ((*ab)->Estimates().streams_up, 2);
  a->reset();
}

TEST_F(TlsReload, BadNewFilesKeepTheOldIdentity) {
  Peer b;
  ASSERT_TRUE(b.Start(Options("b", bundle_, b_.cert, b_.key, {"a"})).ok());
  auto a = Endpoint::Create(Options("a", bundle_, a_cert_, a_key_, {"b"}), nullptr);
  ASSERT_TRUE(a.ok()) << a.status();

  // A key that is not PEM.
  Write(a_key_, "not a key\n");
  Status s = (*a)->ReloadIdentity();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(a_key_), std::string::npos) << s;
  EXPECT_NE(s.message().find("old one stays in use"), std::string::npos) << s;
  // A certificate naming another region.
  Install(a_wrong_region_);
  s = (*a)->ReloadIdentity();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("names region 'z'"), std::string::npos) << s;
  // A key that does not match the certificate.
  fs::copy_file(a_old_.cert, a_cert_, fs::copy_options::overwrite_existing);
  fs::copy_file(a_new_.key, a_key_, fs::copy_options::overwrite_existing);
  s = (*a)->ReloadIdentity();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("key values mismatch"), std::string::npos) << s;

  // New handshakes still use the identity loaded at start, which b accepts.
  auto ab = (*a)->Connect("b", "127.0.0.1", b.port, Ignore());
  ASSERT_TRUE(ab.ok());
  EXPECT_TRUE((*ab)->WaitForStreams(2, Deadline::AfterSeconds(10)).ok());
  EXPECT_TRUE((*ab)->SendAndWait(0, std::vector<uint8_t>(100, 4), Deadline::AfterSeconds(10)).ok());
  EXPECT_EQ(b.endpoint->Counters().tls_handshake_failures, 0u);
  a->reset();
}

TEST_F(TlsReload, PlainTcpHasNothingToReload) {
  EndpointOptions o = Options("a", "", "", "", {"b"});
  o.transport = Transport::kPlainTcp;
  auto a = Endpoint::Create(o, nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->ReloadIdentity().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace strait::net
