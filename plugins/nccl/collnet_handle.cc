// CollNet's handle and group rules (collnet.h): the 128-byte listen handle's encoding, the job
// hash, the policy CollNet registers, the group plan every node head derives from the handles, and
// which (type, op) pairs reduceSupport claims. Pure functions: no I/O, no state.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/endian.h"
#include "common/hash.h"
#include "localproto/policy_grammar.h"
#include "plugins/nccl/collnet.h"
#include "strait/types.h"

namespace strait::nccl {
namespace {

// Handle layout (collnet.h).
constexpr size_t kHandleRegionOffset = 32;
constexpr size_t kHandleRegionMax = kCollNetRegionMax;
constexpr size_t kHandlePolicyOffset = 96;
constexpr size_t kHandlePolicyMax = 27;
constexpr size_t kHandleChecksumOffset = 124;
static_assert(localproto::kMaxCanonicalPolicyBytes <= kHandlePolicyMax);
static_assert(kHandleChecksumOffset + 4 <= size_t{kNcclNetHandleMaxSize});

}  // namespace

void EncodeCollNetHandle(const CollNetHandle& h, void* out) {
  uint8_t* p = static_cast<uint8_t*>(out);
  std::memset(p, 0, kNcclNetHandleMaxSize);
  const size_t region_len = std::min(h.region.size(), kHandleRegionMax);
  const size_t policy_len = std::min(h.policy.size(), kHandlePolicyMax);
  PutLe(p + 0, kCollNetHandleMagic, 4);
  PutLe(p + 4, kCollNetHandleVersion, 2);
  p[6] = static_cast<uint8_t>(region_len);
  p[7] = static_cast<uint8_t>(policy_len);
  PutLe(p + 8, h.nonce, 8);
  PutLe(p + 16, h.shard, 4);
  PutLe(p + 24, h.job_hash, 8);
  std::memcpy(p + kHandleRegionOffset, h.region.data(), region_len);
  std::memcpy(p + kHandlePolicyOffset, h.policy.data(), policy_len);
  PutLe(p + kHandleChecksumOffset, Fnv1a32(p, kHandleChecksumOffset), 4);
}

StatusOr<CollNetHandle> DecodeCollNetHandle(const void* in) {
  const uint8_t* p = static_cast<const uint8_t*>(in);
  if (GetLe(p, 4) != kCollNetHandleMagic) {
    return InvalidArgumentError("not a Strait CollNet handle (bad magic)");
  }
  const uint64_t version = GetLe(p + 4, 2);
  if (version != kCollNetHandleVersion) {
    return InvalidArgumentError("CollNet handle version " + std::to_string(version) +
                                " is not supported (this plugin speaks " +
                                std::to_string(kCollNetHandleVersion) +
                                "); run the same plugin version on every node");
  }
  if (GetLe(p + kHandleChecksumOffset, 4) != Fnv1a32(p, kHandleChecksumOffset)) {
    return InvalidArgumentError("CollNet handle checksum mismatch (corrupted handle)");
  }
  const size_t region_len = p[6];
  const size_t policy_len = p[7];
  if (region_len == 0 || region_len > kHandleRegionMax ||
      p[kHandleRegionOffset + region_len] != 0 || policy_len == 0 ||
      policy_len > kHandlePolicyMax || GetLe(p + 20, 4) != 0) {
    return InvalidArgumentError("CollNet handle has a bad region, policy or reserved field");
  }
  CollNetHandle h;
  h.nonce = GetLe(p + 8, 8);
  h.shard = static_cast<uint32_t>(GetLe(p + 16, 4));
  h.job_hash = GetLe(p + 24, 8);
  h.region.assign(reinterpret_cast<const char*>(p + kHandleRegionOffset), region_len);
  h.policy.assign(reinterpret_cast<const char*>(p + kHandlePolicyOffset), policy_len);
  // Only canonical text compares equal across heads exactly when the policies are the same.
  StatusOr<localproto::PolicyRequest> request = localproto::ParsePolicyRequest(h.policy);
  if (!request.ok() || localproto::FormatPolicyRequest(*request) != h.policy) {
    return InvalidArgumentError("CollNet handle carries a policy that is not canonical text");
  }
  return h;
}

uint64_t CollNetJobHash(std::string_view job) {
  return Fnv1a64(job.data(), job.size());
}

StatusOr<std::string> CollNetPolicy(std::string_view compression) {
  StatusOr<localproto::PolicyRequest> request = localproto::ParsePolicyRequest(compression);
  if (!request.ok()) {
    return InvalidArgumentError("STRAIT_COMPRESSION=\"" + std::string(compression) +
                                "\" is invalid: " + request.status().message());
  }
  if (localproto::MayGoLossy(*request)) request->error_feedback = false;
  return localproto::FormatPolicyRequest(*request);
}

StatusOr<CollNetGroup> PlanCollNetGroup(const std::vector<CollNetHandle>& handles) {
  if (handles.empty()) return InvalidArgumentError("a CollNet group needs at least one node head");
  const CollNetHandle& first = handles[0];
  std::map<std::string, std::vector<std::pair<uint32_t, size_t>>> by_region;  // shard, head
  std::set<uint64_t> nonces;
  for (size_t i = 0; i < handles.size(); ++i) {
    const CollNetHandle& h = handles[i];
    if (h.job_hash != first.job_hash) {
      return InvalidArgumentError("node heads 0 and " + std::to_string(i) +
                                  " have different STRAIT_JOB_ID values; every rank of a job "
                                  "must set the same STRAIT_JOB_ID");
    }
    if (h.policy != first.policy) {
      return InvalidArgumentError("node head 0 has STRAIT_COMPRESSION=" + first.policy +
                                  " but node head " + std::to_string(i) + " has " + h.policy +
                                  "; every rank of a job must set the same STRAIT_COMPRESSION");
    }
    if (!nonces.insert(h.nonce).second) {
      return InvalidArgumentError("node heads share a listen handle (head " + std::to_string(i) +
                                  " repeats an earlier one)");
    }
    by_region[h.region].emplace_back(h.shard, i);
  }
  const size_t m = by_region.begin()->second.size();
  for (auto& [region, heads] : by_region) {
    if (heads.size() != m) {
      return InvalidArgumentError(
          "region \"" + by_region.begin()->first + "\" has " + std::to_string(m) +
          " node heads but region \"" + region + "\" has " + std::to_string(heads.size()) +
          "; CollNet needs the same number of node heads in every region, one per straitd "
          "of that region ([peers.<region>] shard_0..shard_<m-1>)");
    }
    std::sort(heads.begin(), heads.end());
    for (size_t j = 0; j < heads.size(); ++j) {
      if (heads[j].first != j) {
        std::string list;
        for (const auto& [shard, head] : heads) {
          list += (list.empty() ? "" : ", ") + std::string("head ") + std::to_string(head) +
                  " -> shard " + std::to_string(shard);
        }
        return InvalidArgumentError(
            "the node heads of region \"" + region + "\" are on straitd shards {" + list +
            "}; each node head must use its own straitd (STRAIT_GATEWAY), together shard "
            "indices 0.." +
            std::to_string(m - 1));
      }
    }
  }
  CollNetGroup g;
  uint64_t id = 0x5354434e;  // "STCN"
  for (const CollNetHandle& h : handles) id = Mix64(id ^ h.nonce);  // the same on every node head, whatever its build
  g.comm_id = id;
  g.regions = static_cast<int>(by_region.size());
  g.heads_per_region = static_cast<int>(m);
  return g;
}

bool CollNetReduceSupported(int dtype, int op) {
  return dtype >= 0 && dtype < kNumDataTypes && op >= 0 && op <= 3;  // sum, prod, max, min
}

}  // namespace strait::nccl
