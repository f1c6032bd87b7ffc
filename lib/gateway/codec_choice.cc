// The codec of each tensor's all-reduce under a job's policy (see policy.h): the fixed choice
// (lossy only for eligible tensors) and, under `auto`, the choice per link from the link's
// measured goodput and the codecs' measured speed and ratio, with the rule that keeps every
// region's result bit-identical (policy.h's file comment).
//
// Apart from policy.cc because it runs per operation on measurements, while clamping runs once
// per job on configuration; it is what a codec-choice change touches, and nothing else is.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gateway/policy.h"
#include "gateway/policy_internal.h"

namespace strait::gateway {
namespace {

using policy_internal::Allowed;

bool LossyEligible(const JobPolicy& policy, DataType dtype, ReduceOp op, size_t count) {
  const uint64_t bytes = uint64_t{count} * DataTypeSize(dtype);
  return IsLossyCodableType(dtype) && (op == ReduceOp::kSum || op == ReduceOp::kAvg) &&
         bytes >= policy.min_lossy_bytes;
}

}  // namespace

TensorCodec ChooseTensorCodec(const JobPolicy& policy, DataType dtype, ReduceOp op, size_t count) {
  TensorCodec t;
  CodecId codec = policy.codec;
  if (IsLossyCodec(codec) && !LossyEligible(policy, dtype, op, count)) {
    codec = policy.lossless_fallback;
  }
  t.codec.codec = codec;
  t.codec.zstd_level = policy.zstd_level;
  t.error_feedback = IsLossyCodec(codec) && policy.error_feedback;
  return t;
}

TensorCodec ChooseLinkCodecs(const JobPolicy& policy, DataType dtype, ReduceOp op, size_t count,
                             int self, std::span<const net::LinkEstimates> links,
                             std::span<const net::CodecProfile> profiles,
                             double fallback_bytes_per_s) {
  TensorCodec t = ChooseTensorCodec(policy, dtype, op, count);
  if (!policy.automatic) return t;
  const size_t world = links.size();
  // Candidates: the allowed lossless codecs, plus the lossy one where the tensor may go lossy.
  std::vector<CodecId> lossless;
  for (CodecId c : policy.allowed_codecs) {
    if (!IsLossyCodec(c)) lossless.push_back(c);
  }
  if (lossless.empty()) lossless.push_back(policy.lossless_fallback);
  std::vector<CodecId> all = lossless;
  if (IsLossyCodec(t.codec.codec)) all.push_back(t.codec.codec);
  const bool raw_allowed = Allowed(lossless, CodecId::kNone);
  // Raw is what ChooseCodec falls back to; where the operator does not allow it, the allowed
  // lossless codec stands in (zstd: it costs CPU but never goes beyond what the policy permits).
  auto allowed_or = [&](CodecId c) {
    return c == CodecId::kNone && !raw_allowed ? CodecId::kZstd : c;
  };
  std::vector<net::CodecProfile> typed;
  for (const net::CodecProfile& p : profiles) typed.push_back(net::ProfileFor(p, dtype));
  const uint64_t bytes = uint64_t{count} * DataTypeSize(dtype);
  // A rank's frames to itself never touch the network: the cheapest codec.
  const CodecId local = raw_allowed ? CodecId::kNone : CodecId::kZstd;

  t.send_codecs.assign(world, local);
  t.result_codecs.assign(world, local);
  int slowest = -1;
  double slowest_bw = 0;
  for (size_t p = 0; p < world; ++p) {
    if (static_cast<int>(p) == self) continue;
    const net::LinkEstimates& e = links[p];
    const double bw = e.goodput_bytes_per_s > 0 ? e.goodput_bytes_per_s : fallback_bytes_per_s;
    if (slowest < 0 || bw < slowest_bw) {
      slowest = static_cast<int>(p);
      slowest_bw = bw;
    }
    t.send_codecs[p] =
        allowed_or(net::ChooseCodec(e, typed, all, bytes, fallback_bytes_per_s).codec);
    t.result_codecs[p] =
        allowed_or(net::ChooseCodec(e, typed, lossless, bytes, fallback_bytes_per_s).codec);
  }
  if (slowest >= 0 && IsLossyCodec(t.codec.codec)) {
    const CodecId on_slowest = net::ChooseCodec(links[static_cast<size_t>(slowest)], typed, all,
                                                bytes, fallback_bytes_per_s)
                                   .codec;
    // The whole step waits for the slowest link: if the lossy codec pays there, the owner's
    // result goes lossy, as one frame for everyone (itself included).
    if (IsLossyCodec(on_slowest)) t.result_codecs.assign(world, on_slowest);
  }
  t.accept_codecs = all;
  bool any_lossy = false;
  for (size_t p = 0; p < world; ++p) {
    any_lossy = any_lossy || IsLossyCodec(t.send_codecs[p]) || IsLossyCodec(t.result_codecs[p]);
  }
  t.error_feedback = any_lossy && policy.error_feedback;
  return t;
}

std::string TensorCodec::ToString() const {
  if (send_codecs.empty()) return CodecName(codec.codec);
  std::string s = "auto: send";
  const char* sep = " ";
  for (CodecId c : send_codecs) {
    s += sep;
    s += CodecName(c);
    sep = "/";
  }
  s += ", result";
  sep = " ";
  for (CodecId c : result_codecs) {
    s += sep;
    s += CodecName(c);
    sep = "/";
  }
  return s;
}

}  // namespace strait::gateway
