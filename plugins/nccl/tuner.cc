// The tuner: plan from the environment, the constants rewrite, the cost-table policy and the
// C boundary (see tuner.h for the policy and why).
#include "plugins/nccl/tuner.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <set>
#include <string>

namespace strait::nccl::tuner {
namespace {

constexpr uint32_t kTunerMagic = 0x4e555453;  // "STUN"

// One per communicator: the plan, and where to log.
struct Context {
  uint32_t magic = kTunerMagic;
  TunerPlan plan;
  ncclDebugLogger_t logger = nullptr;
};

void Emit(ncclDebugLogger_t logger, ncclDebugLogLevel level, const std::string& message) {
  if (logger != nullptr) {
    logger(level, kNcclSubsysTuning, __FILE__, __LINE__, "TUNER/Strait : %s", message.c_str());
  } else if (level == NCCL_LOG_WARN) {
    std::fprintf(stderr, "TUNER/Strait WARN %s\n", message.c_str());
  }
}

bool Offered(float cost) {
  return cost >= 0;  // -1 (NCCL_ALGO_PROTO_IGNORE): NCCL does not offer this pair
}

std::string Fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

}  // namespace

StatusOr<TunerPlan> MakePlan(const EnvGetter& env, size_t n_nodes,
                             const std::optional<DeviceProperties>& device) {
  STRAIT_ASSIGN_OR_RETURN(PluginConfig config, ParseConfig(env));
  TunerPlan plan;
  std::set<std::string> regions;
  if (!config.region.empty()) regions.insert(config.region);
  for (const RegionRule& rule : config.region_map) regions.insert(rule.region);
  const bool multi_region = !config.gateway.empty() || regions.size() >= 2;
  plan.spans_regions = n_nodes > 1 && multi_region;

  // The same figures the net device reports (transport.cc, GetProperties).
  if (config.wan_latency_us) {
    plan.wan_latency_us = *config.wan_latency_us;
  } else if (!config.gateway.empty()) {
    plan.wan_latency_us = kDefaultWanLatencyUs;
  }
  const double seen = device ? static_cast<double>(device->latency_us) : 0.0;
  plan.added_latency_us = std::max(0.0, plan.wan_latency_us - seen);

  int mbps = 0;
  if (config.wan_speed_mbps) {
    mbps = *config.wan_speed_mbps;
  } else if (device) {
    mbps = device->speed_mbps;
  }
  plan.wan_bytes_per_us = mbps > 0 ? mbps / 8.0 : 0.0;  // Mbit/s = 1e6/8 bytes per 1e6 us
  if (plan.wan_bytes_per_us > 0 && plan.wan_latency_us > 0) {
    const double bdp = plan.wan_latency_us * plan.wan_bytes_per_us;
    plan.bandwidth_bound_bytes = bdp >= 1e18 ? SIZE_MAX : static_cast<size_t>(bdp);
  }
  if (!plan.spans_regions) plan.added_latency_us = 0;
  return plan;
}

void RewriteConstants(const TunerPlan& plan, ncclTunerConstants_v5_t* constants) {
  if (!plan.spans_regions || plan.added_latency_us <= 0) return;
  for (auto& algo : constants->hwLatencies[kNcclHwNet]) {
    for (double& lat : algo) {
      // 0: NCCL models no network latency for this pair (LL/LL128 of CollNet and NVLS, which
      // it never runs): adding some would not change a choice, only muddle the table.
      if (lat > 0) lat += plan.added_latency_us;
    }
  }
}

void AdjustCostTable(const TunerPlan& plan, int coll, size_t n_bytes, float* table, int num_algo,
                     int num_proto) {
  if (!plan.spans_regions || table == nullptr || num_proto <= kNcclProtoSimple) return;
  auto at = [&](int algo, int proto) -> float* {
    if (algo >= num_algo) return nullptr;
    return &table[algo * num_proto + proto];
  };
  if (coll == ncclFuncAllReduce) {
    for (int algo : {kNcclAlgoCollNetDirect, kNcclAlgoCollNetChain}) {
      float* cost = at(algo, kNcclProtoSimple);
      if (cost != nullptr && Offered(*cost)) {
        *cost = 0;
        return;
      }
    }
  }
  if (n_bytes >= plan.bandwidth_bound_bytes) {
    float* ring = at(kNcclAlgoRing, kNcclProtoSimple);
    if (ring != nullptr && Offered(*ring)) *ring = 0;
  }
}

ncclResult_t Init(void** ctx, uint64_t /*comm_id*/, size_t n_ranks, size_t n_nodes,
                  ncclDebugLogger_t logger, ncclNvlDomainInfo_v5_t* /*nvl*/,
                  ncclTunerConstants_v5_t* constants) {
  try {
    if (ctx == nullptr) {
      Emit(logger, NCCL_LOG_WARN, "init: ctx is NULL");
      return ncclInvalidArgument;
    }
    *ctx = nullptr;
    auto context = std::make_unique<Context>();
    context->logger = logger;
    std::optional<DeviceProperties> device;
    if (StatusOr<DeviceProperties> p = Transport::Get().GetProperties(0); p.ok()) device = *p;
    StatusOr<TunerPlan> plan = MakePlan(ProcessEnv(), n_nodes, device);
    if (!plan.ok()) {
      // NCCL fails the communicator when a tuner's init fails: WARN, then stay out of the way.
      Emit(logger, NCCL_LOG_WARN,
           std::string(plan.status().message()) +
               "; the Strait tuner leaves NCCL's own tuning in place for this communicator");
    } else {
      context->plan = *plan;
      if (constants != nullptr) RewriteConstants(context->plan, constants);
      Emit(logger, NCCL_LOG_INFO,
           context->plan.spans_regions
               ? "communicator of " + std::to_string(n_ranks) + " ranks on " +
                     std::to_string(n_nodes) + " nodes spans regions: WAN latency " +
                     Fmt(context->plan.wan_latency_us) + " us (" +
                     Fmt(context->plan.added_latency_us) +
                     " us added to the NET row), bandwidth-bound from " +
                     (context->plan.bandwidth_bound_bytes == SIZE_MAX
                          ? std::string("never (WAN bandwidth unknown)")
                          : std::to_string(context->plan.bandwidth_bound_bytes) + " bytes")
               : "communicator of " + std::to_string(n_nodes) +
                     " node(s) does not span regions: NCCL's tuning unchanged");
    }
    *ctx = context.release();
    return ncclSuccess;
  } catch (const std::bad_alloc&) {
    Emit(logger, NCCL_LOG_WARN, "init: out of memory");
    return ncclSystemError;
  } catch (const std::exception& e) {
    Emit(logger, NCCL_LOG_WARN, std::string("init: internal error: ") + e.what());
    return ncclInternalError;
  }
}

ncclResult_t GetCollInfo(void* ctx, ncclFunc_t coll, size_t n_bytes, int /*num_pipe_ops*/,
                         float** table, int num_algo, int num_proto, int /*reg_buff*/,
                         int* /*n_channels*/) {
  auto* context = static_cast<Context*>(ctx);
  if (context == nullptr || context->magic != kTunerMagic) {
    Emit(nullptr, NCCL_LOG_WARN, "getCollInfo with a context that init() did not return");
    return ncclInvalidArgument;
  }
  // NCCL passes its float[algorithms][protocols] array cast to float**.
  AdjustCostTable(context->plan, static_cast<int>(coll), n_bytes, reinterpret_cast<float*>(table),
                  num_algo, num_proto);
  return ncclSuccess;
}

ncclResult_t Finalize(void* ctx) {
  auto* context = static_cast<Context*>(ctx);
  if (context == nullptr || context->magic != kTunerMagic) {
    Emit(nullptr, NCCL_LOG_WARN, "finalize with a context that init() did not return");
    return ncclInvalidArgument;
  }
  std::unique_ptr<Context> owned(context);
  owned->magic = 0;
  return ncclSuccess;
}

}  // namespace strait::nccl::tuner
