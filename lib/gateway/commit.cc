// The commit confirmation of a cross-region all-reduce (gateway_impl.h, ConfirmCommit): every
// region's gateway says it holds the whole result and waits until every other one said so, so
// that a step succeeds in every region or fails in every region.
//
// Confirmations go directly, on the operation's transport tag. A direct one can be held up where
// the others are not: one region pair's link cut just as the step commits (bench/chaos.sh's flap
// of one pair) left those two waiting for each other until their deadline while the third region,
// which had both, committed -- the regions then went on a step apart. So each confirmation a
// gateway receives it also relays to the other regions (kConfirmed on the generation channel), and
// a relay counts as the confirmation: it proves the region holds the result just the same.
//
// A peer the transport reports gone (its link failed: killed, or unreachable for longer than
// link.unreachable_after) can still be confirmed by a relay, from a region it confirmed to before
// it went; that relay comes right after the other regions' own confirmations, so the wait for it
// ends kRelayGraceNs after every other region confirmed, not at the deadline.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "common/endian.h"
#include "common/log.h"
#include "gateway/gateway_impl.h"

namespace strait::gateway {
namespace {

constexpr const char* kLog = "gateway";
// One wait on a peer's direct confirmation before the loop turns to the other peers and to the
// relays: short, so that a confirmation that came meanwhile is relayed on within this.
constexpr int64_t kConfirmSliceNs = 20'000'000;
// How long a peer reported gone may still be confirmed by a relay once nothing else is pending.
constexpr int64_t kRelayGraceNs = 1'000'000'000;

}  // namespace

Status Gateway::Impl::ConfirmCommit(uint64_t op_id, const std::string& job, Deadline deadline) {
  const uint64_t tag =
      collective::MakeTag(op_id, collective::TagPhase::kMeshScatter, collective::kCommitChunk);
  const int n = static_cast<int>(world.size());
  std::vector<int> pending;
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    transport->Send(p, tag, std::vector<uint8_t>{1}, deadline, [](Status) {});
    pending.push_back(p);
  }
  std::map<int, Status> gone;  // pending peers the transport reported gone, and why
  bool by_relay = false;       // a relay stood in for a direct confirmation
  int64_t only_gone_since = 0;
  const auto fail = [&](int p, Status s) {
    s = s.WithContext("waiting for " + world[static_cast<size_t>(p)] +
                      " to confirm it holds the result (directly or through another region)");
    transport->Abort(op_id, s);
    peer_control.relayed.Forget(op_id);
    return s;
  };
  // Tells the regions that may not hear from p directly (n == 2: nobody) that p confirmed.
  const auto relay = [&](int p) {
    std::vector<int> others;
    for (int q = 0; q < n; ++q) {
      if (q != rank && q != p) others.push_back(q);
    }
    if (others.empty()) return;
    SendToPeers(EncodeGenerationMessage(GenerationMessageKind::kConfirmed, job, op_id,
                                        static_cast<uint64_t>(p), 0),
                others, kGenerationChannel);
  };
  std::vector<uint8_t> got;
  while (!pending.empty()) {
    for (size_t i = 0; i < pending.size();) {
      const int p = pending[i];
      const Deadline slice = Deadline::After(std::min(deadline.RemainingNanos(), kConfirmSliceNs));
      bool relayed = peer_control.relayed.Has(op_id, p);
      const Status s = relayed ? Status::Ok() : transport->Recv(p, tag, slice, &got);
      if (!relayed && s.ok()) relay(p);
      if (!s.ok()) {
        if (s.code() == StatusCode::kAborted || s.code() == StatusCode::kCancelled) {
          return fail(p, s);
        }
        // A receive that failed before its slice ran out did not wait: the transport knows p is
        // gone (whatever the code of the link's failure).
        if (slice.Expired()) {
          gone.erase(p);  // its link works (again): a direct confirmation can still come
        } else {
          gone[p] = s;
          relayed = peer_control.relayed.WaitFor(op_id, p, slice);
        }
        if (!relayed && deadline.Expired()) return fail(p, s);
      }
      by_relay = by_relay || relayed;
      if (s.ok() || relayed) {
        gone.erase(p);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    if (pending.empty() || gone.size() < pending.size()) {
      only_gone_since = 0;
    } else if (only_gone_since == 0) {
      only_gone_since = MonotonicNanos();
    } else if (MonotonicNanos() - only_gone_since > kRelayGraceNs) {
      return fail(pending.front(), gone[pending.front()]);
    }
  }
  peer_control.relayed.Forget(op_id);
  // The direct confirmation a relay stood in for may still come: drop it then, not keep it.
  if (by_relay) transport->Forget(op_id);
  return Status::Ok();
}

void Gateway::Impl::OnConfirmedMessage(int peer, std::span<const uint8_t> m) {
  constexpr size_t kHead = kGenerationHeaderBytes;
  const size_t job_len = m.size() >= kHead ? GetU16(m.data() + 2) : 0;
  const uint64_t who = m.size() >= kHead ? GetU64(m.data() + 12) : 0;
  if (m.size() < kHead || m[0] != kGenerationMessageVersion || job_len == 0 ||
      job_len > kMaxGenerationJobBytes || kHead + job_len != m.size() || who >= world.size() ||
      static_cast<int>(who) == rank) {
    STRAIT_LOG(kWarn, kLog) << "bad relayed commit confirmation from "
                            << world[static_cast<size_t>(peer)] << " (" << m.size()
                            << " bytes); dropped";
    return;
  }
  peer_control.relayed.Record(GetU64(m.data() + 4), static_cast<int>(who));
}

}  // namespace strait::gateway
