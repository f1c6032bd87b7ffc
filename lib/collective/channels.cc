// The link channel router (see channels.h).
#include "collective/channels.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace strait::collective {

void ChannelRouter::Route(ChannelRange range, Handler handler) {
  for (const Entry& e : routes_) {
    if (e.range.Overlaps(range)) {
      throw std::logic_error("link channels " + std::to_string(range.first) + ".." +
                             std::to_string(range.end() - 1) + " overlap a routed range");
    }
  }
  routes_.push_back(Entry{range, std::move(handler)});
  std::sort(routes_.begin(), routes_.end(),
            [](const Entry& a, const Entry& b) { return a.range.first < b.range.first; });
}

bool ChannelRouter::Dispatch(int peer, uint32_t channel, std::vector<uint8_t> message) const {
  // The last range starting at or below the channel is the only one that can hold it.
  auto it = std::upper_bound(routes_.begin(), routes_.end(), channel,
                             [](uint32_t c, const Entry& e) { return c < e.range.first; });
  if (it == routes_.begin()) return false;
  --it;
  if (!it->range.Contains(channel)) return false;
  it->handler(peer, channel, std::move(message));
  return true;
}

}  // namespace strait::collective
