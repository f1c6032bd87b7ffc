// Traffic probes between emulated regions, used by `strait-wanem selfcheck` and the integration
// tests: UDP echo round-trip time, TCP goodput over one or many flows, UDP loss. Each endpoint is
// a thread that enters its region's namespace, so no external tool is needed. Every wait has a
// deadline. All calls block until their measurement is done.
#ifndef STRAIT_BENCH_WANEM_PROBE_H_
#define STRAIT_BENCH_WANEM_PROBE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "strait/status.h"

namespace strait::wanem {

// Where the probes run: namespace names indexed by region (Emulator::Namespaces()).
using RegionNamespaces = std::vector<std::string>;

struct RttResult {
  int samples = 0;
  int lost = 0;
  double min_ms = 0;
  double median_ms = 0;
  double max_ms = 0;
};
// `count` UDP echoes of small datagrams from `from` to `to`, one every `interval_ns`.
StatusOr<RttResult> MeasureUdpRtt(const RegionNamespaces& ns, int from, int to, int count,
                                  int64_t interval_ns);

struct Flow {
  int src = 0;
  int dst = 0;
};
struct GoodputResult {
  Flow flow;
  uint64_t bytes = 0;          // Received in the measured window.
  double seconds = 0;          // Length of the measured window.
  double bits_per_second = 0;  // TCP payload goodput in the window.
};
// One TCP stream per flow, all at once, for warmup + window; goodput counts the window only
// (after slow start). Port numbers start at `base_port` inside the namespaces.
StatusOr<std::vector<GoodputResult>> MeasureTcpGoodput(const RegionNamespaces& ns,
                                                       const std::vector<Flow>& flows,
                                                       int64_t warmup_ns, int64_t window_ns);

struct UdpLossResult {
  uint64_t sent = 0;
  uint64_t received = 0;
  double loss = 0;
};
// `packets` datagrams of `payload` bytes from `from` to `to`, paced at `packets_per_second`.
StatusOr<UdpLossResult> MeasureUdpLoss(const RegionNamespaces& ns, int from, int to, int packets,
                                       int payload, int packets_per_second);

}  // namespace strait::wanem

#endif  // STRAIT_BENCH_WANEM_PROBE_H_
