// Job compression policy: what a job asks for, clamped to what the gateway operator allows,
// agreed between the regions, and turned into a codec per tensor and per link.
//
// A job names its policy in one short string (STRAIT_COMPRESSION, or the register-job request)
// in the grammar of localproto/policy_grammar.h, e.g. "int8,ef", "zstd:3", "auto", "auto:int8";
// error feedback defaults to the gateway config. An empty string means the gateway's default.
// The gateway clamps the request to its PolicyLimits: a codec that is not allowed, or a lossy
// codec whose worst-case error exceeds max_relative_error, falls back to the best allowed
// lossless codec (zstd, else none), and the reason is kept so that logs and the job can see it.
// Per tensor, lossy codecs apply only to sum/avg of float32/bfloat16/float16 tensors of at
// least min_lossy_bytes; everything else goes lossless.
//
// `auto` (the rule; see ChooseLinkCodecs):
//   - Per tensor and per link, from that link's estimates (goodput) and the codecs' measured
//     speed and ratio (net::MeasureCodecProfiles, run once when the gateway starts), auto picks
//     the codec with the least expected time max(encode, bytes / ratio / goodput, decode)
//     (net::ChooseCodec), among the allowed lossless codecs (none, zstd) and, only with
//     "auto:<lossy>", that one lossy codec for the tensors that may go lossy. Plain "auto" never
//     goes lossy: quantized gradients are something a job opts into.
//   - Bit-identity: an owner encodes its shard's result once and every region decodes that
//     frame. A lossy result must therefore be one frame for every receiver: the owner goes lossy
//     for everyone when auto picks the lossy codec on its slowest link, and then sends that one
//     frame to all. Otherwise each link gets its own lossless choice (raw on a fast link, zstd
//     on a slow one): those frames differ in bytes but decode to the same values, so every
//     region still ends bit-identical. What a rank sends an owner (phase 1) is only ever decoded
//     by that owner, so it follows each link's choice freely, lossy included.
//   - Receivers accept a frame in any codec the agreed policy allows (frames say their codec).
//
// Agreement between regions (see MergePolicies and PolicyAgreement): before a job's first
// all-reduce, every gateway sends its resolved policy for the job, with its operator's limits,
// to every peer in a small versioned control message (EncodePolicyOffer; link channel
// kPolicyChannel), and each takes the same deterministic merge of the n offers, the most
// conservative one, so every region runs the job with one effective policy. A combination that
// cannot work (no lossless codec every region allows) is one clear error naming both sides.
//
// Thread-safe: plain values and pure functions, except PolicyAgreement and WeightsAgreement
// (internally locked).
//
// One header, four files by concern: policy.cc (error bounds, clamping a request),
// codec_choice.cc (the codec per tensor and per link), policy_agreement.cc (merging the regions'
// offers, the policy message, PolicyAgreement), shard_weights.cc (the rates message,
// WeightsAgreement).
#ifndef STRAIT_LIB_GATEWAY_POLICY_H_
#define STRAIT_LIB_GATEWAY_POLICY_H_

#include <compare>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collective/channels.h"
#include "common/clock.h"
#include "gateway/config.h"
#include "localproto/policy_grammar.h"
#include "net/adapt.h"
#include "net/estimates.h"
#include "strait/codec.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::gateway {

// The request grammar is the local protocol's (localproto/policy_grammar.h): one parser for the
// gateway, the plugin and library mode.
using localproto::ParsePolicyRequest;
using localproto::PolicyRequest;

// Worst-case quantization error of a lossy codec relative to its block's absmax (0 for lossless
// codecs): int8 1/254, int4 1/14, fp8 e4m3 1/16.
double CodecRelativeErrorBound(CodecId codec);

// A job's policy after clamping (one gateway) or after the regions' merge: used for every tensor
// of the job.
struct JobPolicy {
  // Fixed policy: the codec for eligible tensors. Auto: the lossy codec auto may pick for
  // eligible tensors, or lossless_fallback when auto stays lossless.
  CodecId codec = CodecId::kZstd;
  bool automatic = false;  // codec per link (see the file comment)
  // Shard weights from measured link rates (WeightsAgreement below): set by a gateway whose
  // config has no allreduce.shard_weights; after the merge, only if every region's offer has
  // it (a region that configured weights, or runs a version without rate offers, keeps the
  // job on configured or equal shards). Offer flag bit 2; older gateways ignore the bit.
  bool measured_weights = false;
  int zstd_level = 1;
  bool error_feedback = false;
  uint64_t min_lossy_bytes = 0;
  CodecId lossless_fallback = CodecId::kZstd;  // for tensors that may not go lossy
  // What the operator(s) allow: the codecs auto chooses among and receivers accept. Always holds
  // a lossless codec.
  std::vector<CodecId> allowed_codecs;
  double max_relative_error = 1;  // the operator's limit (the least of the regions' once merged)
  std::string note;               // why the request was changed ("" when taken as asked)
  // E.g. "int8+ef (lossy from 64 KiB, else zstd)", "auto (lossless per link: none, zstd)" or
  // "zstd:1 [int4 not allowed by the gateway's policy.allowed_codecs]".
  std::string ToString() const;
};

// Clamps `request` (empty string = the operator's default codec) to `limits`. Never fails for a
// syntactically valid request: the operator's limits win and `note` says why.
JobPolicy ClampPolicy(const PolicyRequest& request, const PolicyLimits& limits);
// ParsePolicyRequest + ClampPolicy; an empty text takes the limits' defaults.
StatusOr<JobPolicy> ResolvePolicy(std::string_view text, const PolicyLimits& limits);

// ---- Agreement between regions -----------------------------------------------------------------

// One region's resolved policy for a job, as sent to the other regions.
struct PolicyOffer {
  std::string region;  // filled by the receiver from the link, not sent
  JobPolicy policy;    // note is not sent
};

// The merge every region takes of the n offers (any order: the result does not depend on it):
//   allowed codecs      the intersection; without a lossless codec in it the job cannot run:
//                       kFailedPrecondition naming two regions whose lists do not meet.
//   max relative error  the least; min_lossy_bytes the largest.
//   lossy codec         only if every region's policy uses one (fixed or auto:<lossy>): among
//                       those codecs, the one with the least error bound that every region
//                       allows and whose bound is within every region's max_relative_error;
//                       else none (lossless), and the note names the region that kept it so.
//   automatic           only if every region's policy is auto; otherwise fixed.
//   measured weights    only if every region's offer has it.
//   lossless codec      auto: chosen per link; fixed: zstd if any region's lossless codec is
//                       zstd and every region allows it, else the allowed one.
//   zstd level          the lowest any region asked for (never slower than a region wanted;
//                       any level decodes everywhere).
//   error feedback      on if any region has it on (it only makes results more accurate).
// `offers` must be non-empty; regions should be distinct.
StatusOr<JobPolicy> MergePolicies(const std::string& job, std::span<const PolicyOffer> offers);

// Gateways exchange policy offers on link channel kPolicyChannel and rates on kRatesChannel
// (collective/channels.h, the one channel map).
using collective::kPolicyChannel;
using collective::kRatesChannel;

// Control message, version 2 (little-endian), on kPolicyChannel:
//   off size field
//     0    1 version (kPolicyMessageVersion = 2)
//     1    1 kind (PolicyMessageKind)
//     2    1 flags: bit 0 automatic, bit 1 error feedback, bit 2 measured shard weights
//     3    1 codec (CodecId)
//     4    1 lossless fallback (CodecId)
//     5    1 zstd level (int8)
//     6    2 allowed codecs: bit i set = CodecId i allowed
//     8    8 min_lossy_bytes
//    16    8 max_relative_error (IEEE double)
//    24    2 job length L (1..kMaxPolicyJobBytes)
//    26    L job
// A receiver refuses another version, an unknown kind or codec, or a length that does not
// match, with kDataLoss naming the field; unknown allowed-codec bits are ignored (a newer codec
// the peer allows cannot be in the intersection).
// Version 1 carried the rates messages too (kind 3, told apart by peeking at that byte); version
// 2 gives them kRatesChannel, so both messages changed version: a gateway of either version
// refuses the other's messages by their version byte (kDataLoss "version 1 ... upgrade"), never
// misparses them, and the job's policy wait names the refusing region (PolicyAgreement::Wait).
inline constexpr uint8_t kPolicyMessageVersion = 2;
inline constexpr size_t kMaxPolicyJobBytes = 1024;
enum class PolicyMessageKind : uint8_t {
  kOffer = 1,  // "here is my policy for this job; send me yours"
  kReply = 2,  // an answer to kOffer: "here is mine" (not answered again)
  kRates = 3,  // never on kPolicyChannel since version 2; byte 1 of a rates message
};
std::vector<uint8_t> EncodePolicyOffer(PolicyMessageKind kind, const std::string& job,
                                       const JobPolicy& policy);
struct DecodedPolicyOffer {
  PolicyMessageKind kind = PolicyMessageKind::kOffer;
  std::string job;
  JobPolicy policy;
};
StatusOr<DecodedPolicyOffer> DecodePolicyOffer(std::span<const uint8_t> message);

// Each gateway's side of the agreement, for the ranks of its world (rank = index in `world`).
// The gateway wires it to its links:
//   - on register-job: SetLocal(job, policy);
//   - on a message on kPolicyChannel from peer p: OnMessage(p, bytes); if it returns bytes, send
//     them back to p (the reply to an offer);
//   - before a job's all-reduce: Agreed(job); if not there yet, send LocalOffer(job) to every
//     peer (those that offered already are waiting for it; the others reply with theirs), then
//     Wait(job, ...) in slices of a second, offering again to Missing(job) after each (a peer
//     that registers later, restarted, or lost a message is reached without another trigger).
// Offers are kept per (job, peer); a newer offer from a peer (e.g. after it restarted with
// another config) replaces the old one and the merge is redone, so the change applies to
// operations started after it arrived. Operations racing such a change can disagree on codecs
// or chunk alignment; they then fail with a codec-mismatch or element-count error, never with a
// wrong sum. Thread-safe; Wait blocks, the rest does not.
class PolicyAgreement {
 public:
  PolicyAgreement(int rank, std::vector<std::string> world);

  // This gateway's resolved policy for `job` (replaces an earlier one).
  void SetLocal(const std::string& job, const JobPolicy& policy);
  // A control message from rank `peer`. Returns the reply to send back to it (for an offer of a
  // job registered here), nothing otherwise; kDataLoss for a malformed message.
  StatusOr<std::optional<std::vector<uint8_t>>> OnMessage(int peer,
                                                          std::span<const uint8_t> message);
  // The ranks whose offer for `job` has not arrived.
  std::vector<int> Missing(const std::string& job) const;
  // The offer message for `job` (kOffer), or nothing if the job is not registered here.
  std::optional<std::vector<uint8_t>> LocalOffer(const std::string& job) const;
  // The merged policy once every region's offer is in (else nothing); the merge error if the
  // offers cannot be merged.
  std::optional<StatusOr<JobPolicy>> Agreed(const std::string& job) const;
  // Blocks until Agreed(job) or the deadline (or `stop()` turns true, checked every 50 ms).
  // kDeadlineExceeded names the regions that sent no policy for the job (not registered
  // there, or unreachable), and why their last message was refused if it was (another version).
  StatusOr<JobPolicy> Wait(const std::string& job, Deadline deadline,
                           const std::function<bool()>& stop = nullptr) const;

 private:
  struct Job {
    std::map<int, JobPolicy> offers;  // by rank, this one's included once registered
    std::optional<StatusOr<JobPolicy>> merged;
  };
  void RemergeLocked(const std::string& job, Job& j);

  const int rank_;
  const std::vector<std::string> world_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::map<std::string, Job> jobs_;
  std::map<int, std::string> refusals_;  // peer -> why its last message was refused
};

// ---- Shard weights from measured link rates ----------------------------------------------------
//
// Shards proportional to what each owner's links can carry (DESIGN, "Cross-region all-reduce"):
// every gateway must cut an operation's tensor the same way, but each one measures only its own
// egress (net::LinkEstimates::goodput_bytes_per_s of its link to each peer). So the gateways
// exchange their rates and each computes collective::BalancedShardWeights of the same matrix
// (row i = gateway i's offer). The rule (see also gateway.h, "Shard weights"):
//   - Rounds. A job's weights are agreed per round: operation (world 0, epoch = generation, sequence)
//     of any tensor key uses round (world, epoch, sequence / kWeightsRoundOps). A gateway offers
//     its current rates for a round once (the first one wins: a round's matrix never changes),
//     when its first operation of the job reaches the round's middle of the round before (so it
//     normally arrived by the time it is needed), or at the latest when it needs the round; it
//     then waits for every peer's offer of that round, offering again every second to those
//     missing, until the operation's deadline. Every gateway numbers the same operations, so all
//     reach the same rounds and use the same matrix for each: identical weights with no extra
//     round trip after the first round of each epoch.
//   - Hysteresis: a round's weights are recomputed only when some rate moved by more than
//     kWeightsChangePercent from the matrix the current weights came from (the first round of an
//     epoch always computes); otherwise they stay, so shards (and their error-feedback residuals)
//     do not wander with measurement noise. Pure function of the sequence of matrices.
//   - Unknown rates give equal weights: a link counts as unmeasured (0) until it has carried
//     1 MiB of acknowledged data (before that its goodput estimate is of a few control
//     messages), so the first round of the first job on fresh links runs even shards. Equal or
//     nearly equal links (within kBalancedMinGainPercent of the even split) give equal weights
//     too (plan.h). All-equal weights are the plain, unhashed operation id.
//   - Which rate: net::LinkEstimates::peak_goodput_bytes_per_s, the best of the last 40 250 ms
//     windows (of acknowledged bytes) in which the link had data, 10 s of busy link. The
//     smoothed goodput_bytes_per_s reads low wherever a link drains its share of an operation
//     within part of a window, by different amounts on equal links (4.2-5.9 MB/s at a 6.25 MB/s
//     cap after a zstd job), and gave splits that made equal links 12% slower; the peak of a
//     kept-busy window is what the link can carry. A link that gets slower is followed within
//     10 s of busy windows; weights follow what links deliver under the job's own traffic.
//   - A gateway that misses a round (its operation failed before) could compute another chain;
//     the weights are therefore also hashed into the operation id (gateway.cc), so operations
//     with different splits never meet: a mismatch fails by the deadline, never a wrong sum.
inline constexpr uint64_t kWeightsRoundOps = 16;
inline constexpr uint64_t kWeightsChangePercent = 25;

struct WeightsRound {
  uint64_t world = 0;  // 0 (was the old numbering's world); epoch = the job's generation
  uint64_t epoch = 0;
  uint64_t round = 0;  // sequence / kWeightsRoundOps
  auto operator<=>(const WeightsRound&) const = default;
};

// Rates message, version 2 (little-endian), on kRatesChannel: one gateway's egress rates for one
// round of a job (version 1's layout, which travelled on the policy channel):
//   off size field
//     0    1 version (kRatesMessageVersion = 2)
//     1    1 kind (kRates = 3)
//     2    2 n: number of rates (the world size)
//     4    8 world
//    12    8 epoch
//    20    8 round
//    28  8n rates in bytes/s by rank (0 = not measured; the sender's own entry 0)
//  28+8n   2 job length L (1..kMaxPolicyJobBytes)
//  30+8n   L job
// A receiver refuses another version or kind, n other than its world size, or lengths that do
// not match, with kDataLoss naming the field.
inline constexpr uint8_t kRatesMessageVersion = 2;
std::vector<uint8_t> EncodeRatesOffer(const std::string& job, const WeightsRound& round,
                                      const std::vector<uint64_t>& rates);
struct DecodedRatesOffer {
  std::string job;
  WeightsRound round;
  std::vector<uint64_t> rates;
};
StatusOr<DecodedRatesOffer> DecodeRatesOffer(std::span<const uint8_t> message);

// Whether some off-diagonal rate of `now` differs from `base` by more than `percent` percent of
// the base (a rate that became known or unknown counts as changed). Both world*world. Pure.
bool RatesChanged(const std::vector<uint64_t>& base, const std::vector<uint64_t>& now,
                  uint64_t percent);

// Each gateway's side of the rate exchange, for the ranks of its world (rank = index). The
// gateway wires it to its links:
//   - when an operation may prefetch or needs round R: Offer(job, R, its rates); if it returns a
//     message, send it to every peer;
//   - on a message on kRatesChannel from peer p: OnMessage(p, bytes);
//   - for the operation: Weights(job, R, deadline), offering again to Missing(job, R) every
//     second while it waits (a message lost with a link that died is sent again).
// Thread-safe; Weights blocks, the rest does not. Keeps the last kKeptRounds rounds per job.
class WeightsAgreement {
 public:
  static constexpr size_t kKeptRounds = 16;

  WeightsAgreement(int rank, int world_size);

  // Stores this gateway's rates for (job, round) unless it offered for that round already;
  // returns the message to send to every peer when it did now, nothing otherwise.
  std::optional<std::vector<uint8_t>> Offer(const std::string& job, const WeightsRound& round,
                                            std::vector<uint64_t> rates);
  // This gateway's stored offer for the round (for offering again), if any.
  std::optional<std::vector<uint8_t>> LocalOffer(const std::string& job,
                                                 const WeightsRound& round) const;
  // A kRates message from rank `peer`: stored unless that peer's rates for the round are in
  // already (the first wins). kDataLoss for a malformed message.
  Status OnMessage(int peer, std::span<const uint8_t> message);
  // The ranks whose rates for the round have not arrived.
  std::vector<int> Missing(const std::string& job, const WeightsRound& round) const;
  // The round's weights once every rank's rates are in (the hysteresis rule above, chained over
  // the rounds of the same (world, epoch) this gateway computed), waiting for them until
  // `deadline` or `stop()` (checked every 50 ms): kDeadlineExceeded naming the missing ranks.
  // All-equal weights come back as an empty vector (equal shards).
  StatusOr<std::vector<uint64_t>> Weights(const std::string& job, const WeightsRound& round,
                                          Deadline deadline,
                                          const std::function<bool()>& stop = nullptr);

 private:
  struct Job {
    std::map<WeightsRound, std::map<int, std::vector<uint64_t>>> rates;  // round -> rank -> row
    std::map<WeightsRound, uint64_t> added;  // when each round was first heard of (a counter)
    uint64_t next_added = 0;
    // The chain of the latest (world, epoch) computed: the matrix the current weights came
    // from, and each computed round's weights.
    uint64_t world = 0, epoch = 0;
    std::vector<uint64_t> base;
    std::vector<uint64_t> base_weights;
    std::map<uint64_t, std::vector<uint64_t>> computed;  // round -> weights
  };
  void PruneLocked(Job& j);

  const int rank_;
  const int size_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Job> jobs_;
};

// ---- Per tensor and per link ------------------------------------------------------------------

// The codecs of one tensor's all-reduce. `codec` is the same on every region (it fixes the
// plan's chunk alignment and is the codec of every frame under a fixed policy); under auto the
// per-rank vectors (indexed by rank, this rank's own entry included) say what each frame uses.
struct TensorCodec {
  CodecOptions codec;
  bool error_feedback = false;
  // Auto only (empty otherwise): codec of this rank's input frames to each rank; of its owner
  // results to each rank (one lossy codec for all, or lossless per rank); and the codecs a
  // received frame may use.
  std::vector<CodecId> send_codecs;
  std::vector<CodecId> result_codecs;
  std::vector<CodecId> accept_codecs;
  // One line for logs and replies, e.g. "int8" or "auto: send none/zstd/zstd, result zstd".
  std::string ToString() const;
};

// The fixed part: the codec for one tensor under `policy` (lossy only where eligible).
TensorCodec ChooseTensorCodec(const JobPolicy& policy, DataType dtype, ReduceOp op, size_t count);

// ChooseTensorCodec plus, when `policy` is auto, the per-link choice (see the file comment) for
// rank `self` of a world of links.size() ranks, from each peer link's estimates (`links[self]`
// is ignored; an unmeasured link counts as `fallback_bytes_per_s`) and codec `profiles`
// (measured on float32; adapted to `dtype`). A codec the policy does not allow is never chosen
// (where raw is not allowed, zstd stands in for it). Pure.
TensorCodec ChooseLinkCodecs(const JobPolicy& policy, DataType dtype, ReduceOp op, size_t count,
                             int self, std::span<const net::LinkEstimates> links,
                             std::span<const net::CodecProfile> profiles,
                             double fallback_bytes_per_s = 125e6);

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_POLICY_H_
