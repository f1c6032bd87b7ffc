// StragglerDetector (straggler.h): the per-peer windows and the naming rule.
#include "gateway/straggler.h"

#include <algorithm>
#include <utility>

#include "common/units.h"

namespace strait::gateway {
namespace {

constexpr size_t kCalmSamples = 32;  // the single-peer reference: recent calm waits
constexpr size_t kMinCalmSamples = 4;

int64_t Median(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}

}  // namespace

size_t StragglerDetector::SlowOps(const Peer& peer) {
  return static_cast<size_t>(std::count_if(peer.window.begin(), peer.window.end(),
                                           [](const Sample& x) { return x.slow; }));
}

StragglerDetector::StragglerDetector(std::vector<std::string> peers, int self,
                                     StragglerOptions options)
    : names_(std::move(peers)), self_(self), options_(options), peers_(names_.size()) {}

std::vector<StragglerDetector::Verdict> StragglerDetector::Record(
    std::span<const int64_t> peer_wait_ns) {
  std::vector<Verdict> changes;
  if (peer_wait_ns.size() != names_.size()) return changes;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t p = 0; p < peers_.size(); ++p) {
    if (static_cast<int>(p) == self_) continue;
    Peer& peer = peers_[p];
    std::vector<int64_t> others;
    for (size_t q = 0; q < peers_.size(); ++q) {
      if (q != p && static_cast<int>(q) != self_) others.push_back(peer_wait_ns[q]);
    }
    // Without other peers the reference is this peer's own calm past; until there is enough of
    // it nothing can be called slow.
    const bool own_reference = others.empty();
    if (own_reference && peer.calm.size() < kMinCalmSamples) {
      peer.calm.push_back(peer_wait_ns[p]);
      continue;
    }
    const int64_t reference =
        own_reference ? Median({peer.calm.begin(), peer.calm.end()}) : Median(std::move(others));
    const int64_t wait = peer_wait_ns[p];
    const bool slow = wait - reference >= options_.min_excess_ns &&
                      static_cast<double>(wait) >= options_.ratio * static_cast<double>(reference);
    peer.window.push_back(Sample{wait, reference, slow});
    if (peer.window.size() > options_.window) peer.window.pop_front();
    if (!slow && own_reference) {
      peer.calm.push_back(wait);
      if (peer.calm.size() > kCalmSamples) peer.calm.pop_front();
    }
    const size_t slow_ops = SlowOps(peer);
    const bool was = peer.named;
    if (!peer.named && slow_ops >= options_.min_slow) peer.named = true;
    if (peer.named && slow_ops <= options_.clear_at) peer.named = false;
    if (peer.named != was) changes.push_back(VerdictOf(p));
  }
  return changes;
}

StragglerDetector::Verdict StragglerDetector::VerdictOf(size_t p) const {
  const Peer& peer = peers_[p];
  Verdict v;
  v.peer = static_cast<int>(p);
  v.name = names_[p];
  v.slow = peer.named;
  std::vector<int64_t> waits, references;
  for (const Sample& x : peer.window) {
    waits.push_back(x.wait);
    references.push_back(x.reference);
  }
  v.wait_ns = Median(std::move(waits));
  v.others_ns = Median(std::move(references));
  v.slow_ops = SlowOps(peer);
  return v;
}

std::vector<StragglerDetector::Verdict> StragglerDetector::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Verdict> out;
  for (size_t p = 0; p < peers_.size(); ++p) {
    if (static_cast<int>(p) != self_) out.push_back(VerdictOf(p));
  }
  return out;
}

std::string StragglerDetector::SlowText() const {
  std::string text;
  for (const Verdict& v : Snapshot()) {
    if (!v.slow) continue;
    if (!text.empty()) text += ", ";
    text += v.name + " (waited " + FormatDuration(v.wait_ns) + " per op against " + FormatDuration(v.others_ns) + ")";
  }
  return text;
}

}  // namespace strait::gateway
