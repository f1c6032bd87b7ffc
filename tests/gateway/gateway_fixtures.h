// Test fixtures of the gateway's local server in this process: GatewayServer (one gateway, "us",
// whose peer "eu" never comes up) and GatewayPair (both up, one client each), shared by
// gateway_server_test.cc and gateway_shm_test.cc.
#ifndef STRAIT_TESTS_GATEWAY_GATEWAY_FIXTURES_H_
#define STRAIT_TESTS_GATEWAY_GATEWAY_FIXTURES_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gateway/gateway.h"
#include "localproto/client.h"

namespace strait::gateway {

class GatewayServer : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strait-gw-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    config_.file = "test";
    // "us" ranks above "eu", so it dials nobody and waits for eu, which never comes.
    config_.region = "us";
    config_.local_socket = dir_ + "/gw.sock";
    config_.allowed_uids = {::getuid()};
    config_.wan_listen = {"127.0.0.1", 0};
    config_.transport = net::Transport::kPlainTcp;
    config_.peers["eu"][0] = {"127.0.0.1", 1};
    config_.policy.min_lossy_bytes = 16;
    config_.shutdown_grace_ns = 1'000'000'000;
  }
  void TearDown() override {
    gateway_.reset();
    ::rmdir(dir_.c_str());
  }
  void StartGateway() {
    auto g = Gateway::Start(config_);
    ASSERT_TRUE(g.ok()) << g.status();
    gateway_ = std::move(g).value();
  }

  std::string dir_;
  GatewayConfig config_;
  std::unique_ptr<Gateway> gateway_;
};


// Two gateways in this process ("eu" dials "us" over loopback), one client each: what one
// connection carries step after step. The gateway keeps each connection's buffers from request
// to request; these tests hold it to giving every request its own right answer whatever the
// sizes before it, and to errors in between (a gateway error, a malformed request, a client
// that dies mid-frame) leaving the buffers and the other connections fine.
class GatewayPair : public GatewayServer {
 protected:
  void StartBoth() {
    StartGateway();  // "us"
    GatewayConfig eu = config_;
    eu.region = "eu";
    eu.local_socket = dir_ + "/eu.sock";
    eu.peers.clear();
    eu.peers["us"][0] = {"127.0.0.1", gateway_->wan_port()};
    if (eu_chunk_elements_ != 0) eu.chunk_elements = eu_chunk_elements_;
    eu_config_ = eu;
    auto g = Gateway::Start(eu);
    ASSERT_TRUE(g.ok()) << g.status();
    eu_ = std::move(g).value();
    for (const std::string& path : {config_.local_socket, eu.local_socket}) {
      auto c = localproto::Client::Connect(path, Deadline::AfterSeconds(5), "pair-test");
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_TRUE((*c)->RegisterJob("job", "none", Deadline::AfterSeconds(5)).ok());
      clients_.push_back(std::move(c).value());
    }
  }
  void TearDown() override {
    clients_.clear();
    eu_.reset();
    GatewayServer::TearDown();
  }
  GatewayConfig eu_config_;
  size_t eu_chunk_elements_ = 0;  // nonzero: "eu" runs with this allreduce.chunk_elements
  // Both clients all-reduce `count` floats (client c holds c + 1 + i % 5 at i, so the sum is
  // 3 + 2 * (i % 5)); returns how many elements came back wrong on either side.
  size_t AllReduceBoth(const std::string& key, size_t count) {
    std::vector<float> data[2];
    Status status[2];
    std::vector<std::thread> threads;
    for (int c = 0; c < 2; ++c) {
      data[c].resize(count);
      for (size_t i = 0; i < count; ++i) data[c][i] = float(c + 1 + static_cast<int>(i % 5));
      threads.emplace_back([&, c] {
        status[c] = clients_[static_cast<size_t>(c)]->AllReduce(
            "job", key, DataType::kFloat32, ReduceOp::kSum, data[c].data(), count,
            Deadline::AfterSeconds(20));
      });
    }
    for (auto& t : threads) t.join();
    size_t wrong = 0;
    for (int c = 0; c < 2; ++c) {
      EXPECT_TRUE(status[c].ok()) << key << " count " << count << ": " << status[c];
      for (size_t i = 0; i < count; ++i) {
        wrong += data[c][i] != float(3 + 2 * static_cast<int>(i % 5));
      }
    }
    return wrong;
  }

  std::unique_ptr<Gateway> eu_;
  std::vector<std::unique_ptr<localproto::Client>> clients_;
};

}  // namespace strait::gateway

#endif  // STRAIT_TESTS_GATEWAY_GATEWAY_FIXTURES_H_
