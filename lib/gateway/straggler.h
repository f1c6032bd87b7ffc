// Straggler and slow-link detection from the all-reduces' own timings (the idea of Alibaba's C4:
// the collective already knows whom it waited for, so no probe traffic is needed).
//
// Each successful all-reduce reports how long this gateway waited for each peer's frames
// (collective::AllReduceStats::peer_wait_ns). One slow op proves nothing (a compute hiccup, a
// retransmission); a peer is *named* when, in at least `min_slow` of the last `window` ops, this
// gateway waited for it `ratio` times longer than for the others (their median), and by at least
// `min_excess_ns`. With a single peer there are no others: its reference is then its own median
// wait over the ops before it turned slow. A named peer is cleared once at most `clear_at` of the
// last `window` ops were slow (hysteresis, so that a link on the edge does not flap the alert).
//
// The gateway turns a change into a metric (strait_peer_slow), a rate-limited WARN and /readyz's
// detail; strait-bench prints the final verdicts. Thread-safe (one mutex; Record is O(peers x
// window)).
#ifndef STRAIT_LIB_GATEWAY_STRAGGLER_H_
#define STRAIT_LIB_GATEWAY_STRAGGLER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace strait::gateway {

struct StragglerOptions {
  size_t window = 8;
  size_t min_slow = 6;  // of `window`: 6 of 8 names a peer within 6-10 ops of its slow-down
  size_t clear_at = 2;  // of `window`
  double ratio = 3.0;
  // Below this a peer's lateness is the hosts' own noise, not a slow link: a gateway that shares
  // a loaded machine is descheduled for ~10 ms at a time, op after op (seen in CI), while a WAN
  // link that matters costs a round trip or more (tens of ms).
  int64_t min_excess_ns = 20'000'000;
};

class StragglerDetector {
 public:
  // `peers` names every rank of the transport (index = rank); `self` is this gateway's.
  StragglerDetector(std::vector<std::string> peers, int self, StragglerOptions options = {});

  struct Verdict {
    int peer = -1;
    std::string name;
    bool slow = false;        // named now (after this op)
    int64_t wait_ns = 0;      // median wait for this peer over the window
    int64_t others_ns = 0;    // median reference (the others', or its own earlier median)
    size_t slow_ops = 0;      // of the window
  };
  // Records one successful op (peer_wait_ns indexed by rank, as many as peers; other sizes are
  // ignored) and returns the peers whose named/cleared state changed with it.
  std::vector<Verdict> Record(std::span<const int64_t> peer_wait_ns);
  // Every peer's current state (self excluded), named or not.
  std::vector<Verdict> Snapshot() const;
  // "r1 (waited 120.3 ms per op against 4.1 ms)", comma-separated; empty when none is named.
  std::string SlowText() const;

 private:
  struct Sample {
    int64_t wait = 0;
    int64_t reference = 0;
    bool slow = false;
  };
  struct Peer {
    std::deque<Sample> window;  // the last `window` ops
    std::deque<int64_t> calm;   // waits of ops that were not slow (own reference), <= 32
    bool named = false;
  };
  Verdict VerdictOf(size_t p) const;  // mu_ held
  static size_t SlowOps(const Peer& peer);

  const std::vector<std::string> names_;
  const int self_;
  const StragglerOptions options_;
  mutable std::mutex mu_;
  std::vector<Peer> peers_;
};

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_STRAGGLER_H_
