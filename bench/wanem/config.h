// strait-wanem's configuration: the link specification shared by flags and schedule files, the
// per-pair table, and the schedule of changes over time.
//
// Link spec (flags --link and --pair, and the settings of a schedule line): tokens separated by
// commas or spaces, each `key=value`, or a bare rate ("100mbit") or duration ("25ms", the
// one-way delay):
//   rate=100mbit | unlimited | 30%     (a percentage is of the pair's base rate)
//   delay=25ms  jitter=2ms  reorder=on|off (or bare `reorder`)
//   loss=1% | 0.01                     (Bernoulli, per packet)
//   ge=P:R[:LOSS_BAD[:LOSS_GOOD]]      (Gilbert-Elliott; each a fraction or a percentage)
//   queue=256KiB | bdp                 (tail-drop limit; default one bandwidth-delay product)
//   flowrate=50mbit | off  flowburst=64KiB   (per-5-tuple policer)
//   syn=drop | pass                    (drop: TCP connection attempts over this link are
//                                       dropped, a one-way firewall; see LinkParams::drop_syn)
//   base                               (first reset the pair to its base settings)
// Pair selectors: `i:j` both directions, `i>j` from region i to region j, `*>j` every link into
// region j, `i>*` every link out of region i, `*` every pair. `--pair '*>2=syn=drop'` puts
// region 2 behind NAT: it admits no inbound TCP connection, its own connections out work.
//
// Schedule file: one change per line, `#` starts a comment:
//   <time since start> <pair selector> <link spec>
//   20s  *    rate=30%
//   40s  *    rate=100%
//   25s  0>1  loss=2% delay=80ms
// Lines may come in any order; equal times apply in file order. Changes accumulate.
#ifndef STRAIT_BENCH_WANEM_CONFIG_H_
#define STRAIT_BENCH_WANEM_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bench/wanem/link_model.h"
#include "strait/status.h"

namespace strait::wanem {

inline constexpr int kMaxRegions = 64;

// Parses `spec` as changes on top of `start`; percentages of rate refer to `base`.
StatusOr<LinkParams> ParseLinkSpec(std::string_view spec, const LinkParams& start,
                                   const LinkParams& base);

// A directed pair (src, dst) list selected by "i:j", "i>j" or "*" among `regions` regions.
StatusOr<std::vector<std::pair<int, int>>> ParsePairSelector(std::string_view text, int regions);

// Per directed pair settings, [src][dst]; the diagonal is unused.
struct LinkTable {
  int regions = 0;
  std::vector<std::vector<LinkParams>> params;
  const LinkParams& at(int src, int dst) const { return params[src][dst]; }
  LinkParams& at(int src, int dst) { return params[src][dst]; }
};

// Builds the table: every pair gets `link`, then each "SELECTOR=SPEC" override is applied in
// order (e.g. "0:1=rate=20mbit,delay=80ms").
StatusOr<LinkTable> BuildLinkTable(int regions, std::string_view link,
                                   const std::vector<std::string>& pair_overrides);

// One resolved change: at `at_ns` after start, pair (src, dst) takes `params`.
struct ScheduleEvent {
  int64_t at_ns = 0;
  int src = 0;
  int dst = 0;
  LinkParams params;
};

// Parses a schedule (the file's text) against the base table and resolves it into absolute
// settings, sorted by time. `origin` names the file in error messages.
StatusOr<std::vector<ScheduleEvent>> ParseSchedule(std::string_view text, const LinkTable& base,
                                                   std::string_view origin);
StatusOr<std::vector<ScheduleEvent>> LoadScheduleFile(const std::string& path,
                                                      const LinkTable& base);

// Checks --cc against the kernel's space-separated lists net.ipv4.tcp_available_congestion_control
// (loaded algorithms) and tcp_allowed_congestion_control (those a namespace other than the root
// one may make its default, which is what every region does). The tool calls it before it creates
// any namespace, so that a typo costs no setup; the error names the algorithms a region can use.
Status CheckCongestionControl(std::string_view cc, std::string_view available,
                              std::string_view allowed);

}  // namespace strait::wanem

#endif  // STRAIT_BENCH_WANEM_CONFIG_H_
