// Internal to lib/gateway: how the gateways of one shard agree on the identity of every
// all-reduce, by construction instead of by counting (the rule that replaced per-key op numbering
// after gateway restarts were seen to pair one region's step k + 1 with the others' step k).
//
// Generations: every comm (a rank's strait_comm, the GPU backend's, a CollNet comm) joins its job
// once, when it is created (local kJoinJob). Its gateway proposes a generation and the gateways
// of every region exchange proposals on link channel kGenerationChannel until all of them propose
// the same number g; each then answers its rank with g. Proposals only grow: a gateway proposes
// max(its agreed generation + 1, every peer's last proposal, every peer's agreed generation + 1),
// and raises its proposal whenever a peer proposes more. A gateway proposes nothing before it has
// heard every peer's state for the job since it started (its first join asks for it with
// proposal 0): a restarted gateway, which remembers nothing, must not mistake the survivors'
// generation g -- agreed with its previous life -- for agreement on g with it; it proposes g + 1,
// and the survivors' steps of g end at once (next paragraph). The comm numbers its own
// operations 0, 1, 2, ... within g; an operation's identity is (job, g, sequence, tensor key,
// dtype, op, count, ...), and its op id is a hash of all of it, so contributions of different
// steps never meet.
//
// Failure is symmetric: a gateway that hears of a newer generation of a job (a peer's proposal,
// i.e. some region's ranks created a new comm after a failure or a restart) aborts its own
// operations of older generations at once (their abort reaches every region, so every rank fails
// the same step), and refuses later requests of those generations: a held abort or a late message
// of an old generation can never touch a step of the new one, because their identities differ.
//
// Announcements: when an operation starts, its gateway sends its identity text to every peer
// (kind kAnnounce). A gateway whose own operation at the same (job, generation, sequence) has
// another identity fails it with kFailedPrecondition naming both -- regions that disagree on what
// step s is get a clear error, never a sum and never a silent wait for the deadline.
//
// Wire (channel kGenerationChannel, little-endian), version kGenerationMessageVersion = 1:
//   off size field
//     0    1 version
//     1    1 kind: 1 = join (answer with your state), 2 = state (an answer; not answered),
//                  3 = announce (explicit values, never renumbered)
//     2    2 job length J (1..kMaxGenerationJobBytes)
//     4    8 join/state: the sender's proposal; announce: the generation
//    12    8 join/state: the sender's agreed generation; announce: the sequence
//    20    8 join/state: the sender's resume position (below); announce: 0
//    28    J job
//    28+J  . announce: the identity text (at most kMaxIdentityBytes); fetched: the result
// Kinds 4 and 5 (kFetch: generation, sequence; kFetched: generation, sequence, found 0/1, then
// the result) are the gateway's result recovery, and kind 6 (kConfirmed: op id, the region's
// rank, 0) a commit confirmation relayed by a third region (gateway_impl.h, ConfirmCommit);
// Generations refuses them.
//
// Resume positions: a joining rank may say how many all-reduces of the job its process completed
// (kJoinJob's resume). A step can succeed in some regions and fail in one whose gateway was
// killed after it confirmed the result (Commit) and before its rank read it, or whose links
// went down just as the regions confirmed it, so that a confirmation came only after the step's
// deadline. (One pair cut, as bench/chaos.sh's flap saw, is covered: the third region relays each
// confirmation, gateway_impl.h's ConfirmCommit; cuts that isolate a region are not, and no
// protocol closes that window.) Then the regions' ranks would go on one step apart, so a join whose regions
// resume at different positions is refused everywhere with kFailedPrecondition naming them --
// a clear error instead of a silent sum of different steps.
// A message of another version, an unknown kind or a bad length is refused with kDataLoss naming
// the field (the caller logs it and drops the message).
//
// Thread-safe; never blocks except in AwaitJoin.
#ifndef STRAIT_LIB_GATEWAY_GENERATION_H_
#define STRAIT_LIB_GATEWAY_GENERATION_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "collective/channels.h"
#include "common/clock.h"
#include "strait/status.h"

namespace strait::gateway {

// The link channel of generation messages (collective/channels.h, the one channel map).
using collective::kGenerationChannel;
inline constexpr uint8_t kGenerationMessageVersion = 1;
inline constexpr size_t kMaxGenerationJobBytes = 1024;
inline constexpr size_t kMaxIdentityBytes = 1024;

enum class GenerationMessageKind : uint8_t {
  kJoin = 1,
  kState = 2,
  kAnnounce = 3,
  kFetch = 4,    // "send me your committed result of (generation, sequence)" (the gateway's)
  kFetched = 5,  // the answer: found (1) and the result as payload, or not (0)
  kConfirmed = 6,  // "region b confirmed operation a" (relayed; the gateway's ConfirmCommit)
};
// The header of every generation-channel message (layout above); kFetch / kFetched use it with
// (generation, sequence, found) and carry the result after the job.
inline constexpr size_t kGenerationHeaderBytes = 28;
std::vector<uint8_t> EncodeGenerationMessage(GenerationMessageKind kind, const std::string& job,
                                             uint64_t a, uint64_t b, uint64_t c,
                                             std::span<const uint8_t> payload = {});

class Generations {
 public:
  // `rank` is this gateway's index among `names` (every region's gateway of the shard, in rank
  // order; names appear in errors).
  Generations(int rank, std::vector<std::string> names);

  // ---- Joining (local kJoinJob) ----
  // Starts (or continues) this gateway's join of `job`: fixes its proposal by the rule above and
  // returns the kJoin message to send to every peer. Operations of `job` in flight here with an
  // older generation are to be aborted: their op ids and the reason are appended to `aborts`.
  // `resume`: the joining rank's position (0 = unknown; see "Resume positions").
  std::vector<uint8_t> BeginJoin(const std::string& job, uint64_t resume,
                                 std::vector<std::pair<uint64_t, Status>>* aborts);
  // Waits until every peer's last proposal equals this gateway's (the join is then agreed: the
  // generation becomes the job's current one) or `slice` passes (kDeadlineExceeded naming the
  // regions not there yet) or `stop` returns true (kUnavailable). Returns kDeadlineExceeded early
  // when this gateway's proposal changed (a peer proposed more, or every peer's state is known
  // now): call again after sending StateMessage(kJoin) to Missing() peers. New aborts (steps of
  // generations the new proposal replaces) are appended to `aborts`.
  StatusOr<uint64_t> AwaitJoin(const std::string& job, Deadline slice,
                               const std::function<bool()>& stop,
                               std::vector<std::pair<uint64_t, Status>>* aborts = nullptr);
  // Peers whose last proposal differs from this gateway's (the ones to send JoinMessage again).
  std::vector<int> Missing(const std::string& job) const;
  // This gateway's state for `job` as a kJoin (want a reply) or kState message.
  std::vector<uint8_t> StateMessage(const std::string& job, GenerationMessageKind kind) const;
  // The job's agreed generation here (0 = never joined).
  uint64_t Current(const std::string& job) const;

  // ---- Operations ----
  // An operation of (job, generation, sequence) with `identity` (a readable text of everything
  // that must match) starts here under `op_id`. Refuses (nothing registered) a generation this
  // gateway never agreed (kFailedPrecondition) or one a newer generation replaced (kAborted), and
  // an identity a peer announced differently (kFailedPrecondition naming both). On success
  // `*announce` is the kAnnounce message for every peer; call EndOp(op_id) when it ends. On a
  // disagreement `*announce` is set too (nothing registered): send it, so that the peers running
  // the step under their identity abort it at once (see OnMessage).
  Status BeginOp(const std::string& job, uint64_t generation, uint64_t sequence,
                 const std::string& identity, uint64_t op_id, std::vector<uint8_t>* announce);
  // Unregisters the operation; returns the mismatch a peer's announcement revealed while it ran
  // (OK if none): that, not the abort it caused, is the operation's error.
  Status EndOp(uint64_t op_id);
  // How many operations began and did not end yet (the stats' numbered_ops_in_flight).
  size_t OpsInFlight() const;

  // ---- Messages from peers (a link's I/O thread) ----
  struct Effects {
    std::optional<std::vector<uint8_t>> reply;           // send to the peer
    std::vector<std::pair<uint64_t, Status>> aborts;     // op ids to abort (transport), and why
  };
  StatusOr<Effects> OnMessage(int peer, std::span<const uint8_t> message);

 private:
  struct PeerState {
    uint64_t proposal = 0;
    uint64_t current = 0;
    bool heard = false;  // a message came from it since this process started
    uint64_t resume = 0;
  };
  struct Job {
    uint64_t current = 0;   // agreed generation (0 = none yet)
    uint64_t proposal = 0;  // >= current; > current while a join is pending
    bool joining = false;   // a local join waits
    uint64_t resume = 0;    // the local joining rank's position
    Status refused;         // the last join's refusal (positions differ), until the next join
    // What this gateway offers peers: its proposal, or 0 while a join waits to hear every peer
    // before it proposes (a question, which matches no proposal).
    uint64_t Offer() const { return joining && proposal <= current ? 0 : proposal; }
    std::vector<PeerState> peers;
    // (generation, sequence) -> peer -> identity text, of announcements not yet matched; a few
    // hundred kept (older ones dropped first).
    std::map<std::pair<uint64_t, uint64_t>, std::map<int, std::string>> announced;
  };
  struct Op {
    std::string job;
    uint64_t generation = 0;
    uint64_t sequence = 0;
    std::string identity;
    Status mismatch;
  };

  Job& JobLocked(const std::string& job);
  // Raises j's proposal by the rule above (the first one of a join only once every peer was heard
  // from); true if it changed.
  bool RaiseLocked(Job& j) const;
  // The highest generation any region proposed or agreed for `j`, and who (for errors).
  std::pair<uint64_t, int> NewestLocked(const Job& j) const;
  void SupersededLocked(const std::string& job, uint64_t newer, int by,
                        std::vector<std::pair<uint64_t, Status>>* aborts);
  std::string Describe(const std::string& job, uint64_t generation, uint64_t sequence,
                       const std::string& identity) const;

  const int rank_;
  const std::vector<std::string> names_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Job> jobs_;
  std::map<uint64_t, Op> ops_;  // in flight, by op id
};

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_GENERATION_H_
