// The link channel map: every channel a gateway's WAN and region links carry, in one table.
//
// A net::Link multiplexes numbered channels (messages keep their order per channel; the link
// cuts channels round-robin). Each user of a link owns a named range below; nothing else may send
// on it. The ranges are wire values between gateways (regions run different versions during an
// upgrade): never move one; add new ones in free space. static_asserts below prove that no two
// overlap.
//
//   channels      owner (format defined in)
//   8             policy offers and replies (gateway/policy.h, policy message version 2)
//   9             generations and result recovery (gateway/generation.h)
//   10            measured link rates for shard weights (gateway/policy.h, rates message
//                 version 2; before version 2 they shared channel 8 with the policy offers)
//   16..31        the cross-region collective's lanes (collective/net_transport.h)
//   32..47        the region collective's lanes, on links between a region's gateways
//   1024..1279    cross-region tunnels, hashed by tunnel id (gateway/tunnel.h)
//
// Shard blocks: the table above is shard 0's. A straitd serving several shards (config `shards`)
// shares one link per peer gateway among them, so shard k uses the same ranges shifted by
// k x kShardChannelStride (net::Link::WithChannelBase), and the receiving gateway hands a message
// to shard channel / kShardChannelStride with the channel taken modulo the stride. Every gateway
// sends its shard's block, one process per shard or not, so the layout of the peer does not
// matter. (Before multi-shard gateways every shard used block 0: gateways of shard index >= 1
// must be upgraded in every region together.)
//
// ChannelRouter dispatches a received message to the owner of its channel's range (a table, so
// that adding a range is one line, not another branch of an if-chain). Thread-safe once built:
// Route() while setting up, Dispatch() from any I/O thread.
#ifndef STRAIT_LIB_COLLECTIVE_CHANNELS_H_
#define STRAIT_LIB_COLLECTIVE_CHANNELS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <vector>

namespace strait::collective {

// Channels [first, first + count).
struct ChannelRange {
  uint32_t first = 0;
  uint32_t count = 0;
  constexpr uint32_t end() const { return first + count; }
  constexpr bool Contains(uint32_t channel) const {
    return channel >= first && channel - first < count;
  }
  constexpr bool Overlaps(const ChannelRange& o) const {
    return first < o.end() && o.first < end();
  }
};

inline constexpr ChannelRange kPolicyChannels{8, 1};
inline constexpr ChannelRange kGenerationChannels{9, 1};
inline constexpr ChannelRange kRatesChannels{10, 1};
inline constexpr ChannelRange kCollectiveChannels{16, 16};
inline constexpr ChannelRange kRegionCollectiveChannels{32, 16};
inline constexpr ChannelRange kTunnelChannels{1024, 256};

// The stride between shards' channel blocks; every range above lies below it.
inline constexpr uint32_t kShardChannelStride = 1u << 16;
// The highest shard index a channel block exists for.
inline constexpr uint32_t kMaxShardIndex = (~0u / kShardChannelStride) - 1;

// The single channels by name.
inline constexpr uint32_t kPolicyChannel = kPolicyChannels.first;
inline constexpr uint32_t kGenerationChannel = kGenerationChannels.first;
inline constexpr uint32_t kRatesChannel = kRatesChannels.first;
// The first lane of the collectives, and how many lanes they have (both links' kinds alike).
inline constexpr uint32_t kDefaultCollectiveChannel = kCollectiveChannels.first;
inline constexpr uint32_t kCollectiveChannelCount = kCollectiveChannels.count;
inline constexpr uint32_t kRegionCollectiveChannel = kRegionCollectiveChannels.first;

inline constexpr ChannelRange kAllChannelRanges[] = {
    kPolicyChannels,     kGenerationChannels,       kRatesChannels,
    kCollectiveChannels, kRegionCollectiveChannels, kTunnelChannels,
};

constexpr bool NoTwoOverlap(const ChannelRange* ranges, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (ranges[i].count == 0) return false;
    for (size_t j = i + 1; j < n; ++j) {
      if (ranges[i].Overlaps(ranges[j])) return false;
    }
  }
  return true;
}
static_assert(NoTwoOverlap(kAllChannelRanges, std::size(kAllChannelRanges)),
              "two link channel ranges overlap");
static_assert(kTunnelChannels.end() <= kShardChannelStride,
              "every channel range lies within one shard's block");
static_assert(kRegionCollectiveChannels.count == kCollectiveChannels.count,
              "both collectives cut an op id into the same number of lanes");

// Dispatches messages by channel to the handler of the range holding it.
class ChannelRouter {
 public:
  using Handler = std::function<void(int peer, uint32_t channel, std::vector<uint8_t> message)>;

  // Sends every message on `range` to `handler`. A range that overlaps one routed already is a
  // programmer error (std::logic_error).
  void Route(ChannelRange range, Handler handler);
  // Hands the message to its range's handler; false when no routed range holds `channel` (the
  // caller says what it drops). Runs the handler on the calling thread.
  bool Dispatch(int peer, uint32_t channel, std::vector<uint8_t> message) const;

 private:
  struct Entry {
    ChannelRange range;
    Handler handler;
  };
  std::vector<Entry> routes_;  // sorted by range.first
};

}  // namespace strait::collective

#endif  // STRAIT_LIB_COLLECTIVE_CHANNELS_H_
