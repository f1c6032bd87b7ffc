// Internal to lib/gateway: the state behind Gateway, shared by the files that implement its
// request handlers (gateway.cc: sockets, jobs, all-reduce, lifecycle). Not installed.
//
// Locking: `mu` guards links, jobs and sequences; counters are atomics. Handlers run on the
// connection's thread and may block up to their request's deadline.
#ifndef STRAIT_LIB_GATEWAY_GATEWAY_IMPL_H_
#define STRAIT_LIB_GATEWAY_GATEWAY_IMPL_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "strait/codec.h"
#include "collective/net_transport.h"
#include "gateway/config.h"
#include "gateway/gateway.h"
#include "gateway/local_protocol.h"
#include "gateway/policy.h"
#include "net/link.h"

namespace strait::gateway {

struct Gateway::Impl {
  GatewayConfig config;
  std::vector<std::string> world;
  int rank = 0;
  std::unique_ptr<collective::NetTransport> transport;
  std::unique_ptr<net::Endpoint> endpoint;
  uint16_t wan_port = 0;
  ErrorFeedbackStore feedback;

  std::mutex mu;
  std::condition_variable links_cv;
  std::vector<std::shared_ptr<net::Link>> links;
  std::map<std::string, JobPolicy> jobs;
  std::map<std::pair<std::string, std::string>, uint64_t> sequences;

  int listen_fd = -1;
  std::atomic<bool> stopping{false};
  std::atomic<int> in_flight{0};
  std::thread accept_thread;
  struct Connection {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Connection> connection_threads;  // finished ones are joined at the next accept
  bool shut_down = false;

  // Counters for the stats request.
  std::atomic<uint64_t> connections{0}, refused_connections{0}, bad_requests{0};
  std::atomic<uint64_t> allreduce_ok{0}, allreduce_failed{0}, bytes_sent{0}, bytes_received{0};

  int RankOf(const std::string& region) const {
    auto it = std::find(world.begin(), world.end(), region);
    return it == world.end() ? -1 : static_cast<int>(it - world.begin());
  }
  void KeepLink(int peer, std::shared_ptr<net::Link> link) {
    transport->SetLink(peer, link);
    std::lock_guard<std::mutex> lock(mu);
    links[static_cast<size_t>(peer)] = std::move(link);
    links_cv.notify_all();
  }
  Status WaitForLinks(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      std::string missing;
      for (size_t p = 0; p < links.size(); ++p) {
        if (static_cast<int>(p) != rank && links[p] == nullptr) {
          missing += (missing.empty() ? "" : ", ") + world[p];
        }
      }
      if (missing.empty()) return Status::Ok();
      if (deadline.Expired() || stopping.load()) {
        return UnavailableError("no link yet to the gateway(s) of " + missing + " (shard " +
                                std::to_string(config.shard_index) +
                                "); check that they run and that peers.* addresses are right");
      }
      links_cv.wait_for(lock, std::chrono::milliseconds(50));
    }
  }

  Status ServeSocket();
  void AcceptLoop();
  void ServeConnection(int fd);
  // Takes the request's data (an all-reduce answers in place).
  Message Handle(Message& request);
  Message HandleAllReduce(Message& request);
};

// A reply to a request of type `to` carrying `status` (and nothing else yet).
Message Reply(MessageType to, const Status& status);

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_GATEWAY_IMPL_H_
