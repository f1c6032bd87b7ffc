// The plugin's NCCL tuner (ncclTunerPlugin_v5, exported from the same libnccl-net-strait.so as the
// net tables): it feeds the WAN's latency into NCCL's cost model and, for communicators that span
// regions, steers collectives towards what works over a slow WAN.
//
// The v5 declarations below are our own, written from NCCL 2.28.9's public facts (tuner_v5.h,
// nccl_tuner.h, graph/tuning.cc, init.cc); static_asserts pin every size and offset.
//
// How NCCL 2.28.9 uses the tuner (facts the policy relies on):
//  - NCCL looks for the tuner in the net plugin's library when NCCL_TUNER_PLUGIN is unset, probing
//    ncclTunerPlugin_v5 first. init runs once per communicator, after NCCL filled `constants` with
//    its defaults and before it computes the cost model from them; its result is NCCLCHECKed:
//    a failing init fails the communicator, and so does a failing getCollInfo fail the collective.
//  - An inter-node step costs hwLatencies[NET][algo][proto] (with one rank per node, the Tree
//    column for every algorithm) PLUS the net device's reported latency (getProperties, which for
//    this plugin is STRAIT_WAN_LATENCY_US or the WAN default when STRAIT_GATEWAY is set).
//  - getCollInfo receives float[7 algorithms][3 protocols] of predicted times in microseconds;
//    -1 (NCCL_ALGO_PROTO_IGNORE) marks combinations NCCL does not offer for this call; the
//    cheapest entry wins, so 0 selects an entry.
//
// Policy (documented in the README too):
//  - Configuration: the net plugin's environment (config.h): STRAIT_WAN_LATENCY_US,
//    STRAIT_WAN_SPEED_MBPS, STRAIT_GATEWAY, STRAIT_REGION, STRAIT_REGION_MAP. A bad value is WARNed
//    naming the variable, and the tuner then stays out of the way for that communicator (init
//    returns success with a pass-through context): since NCCL fails the whole communicator on a
//    tuner error, an error would turn the net plugin's clean fallback into a failed job.
//  - A communicator "spans regions" when nNodes > 1 and this deployment has more than one region
//    (STRAIT_GATEWAY set, or STRAIT_REGION and STRAIT_REGION_MAP together name two or more). The
//    tuner cannot see which regions a communicator's members are in (NCCL tells it only nRanks and
//    nNodes), so a multi-node communicator inside one region of a multi-region job is treated as
//    spanning. Single-node communicators and single-region deployments are left alone entirely.
//  - Constants (spanning communicators): the NET row gets the part of the WAN latency the cost
//    model does not already see. When this process's Strait net device is initialised, its
//    reported latency is the same WAN figure and is already added per step, so nothing is added
//    (no double counting); when NCCL runs its own Socket/IB transport (NCCL_NET=Socket, or the
//    Strait net failed init) the whole WAN latency is added to every entry NCCL models (entries
//    that are 0, the algorithm/protocol pairs NCCL gives no network latency, stay 0).
//  - getCollInfo (spanning communicators; entries that are -1 are never touched and nothing is
//    ever set to -1, so the tuner never forces what NCCL did not offer nor forbids what it did):
//      AllReduce with CollNet offered (NCCL_COLLNET_ENABLE=1): CollNet SIMPLE is selected
//        (Direct if offered, else Chain): straitd's region all-reduce crosses the WAN twice per
//        step whatever the region count, with the job's codec.
//      Otherwise, messages of at least the WAN's bandwidth-delay product (bandwidth-bound):
//        Ring SIMPLE is selected when offered (every channel pipelines at full payload
//        efficiency; LL and LL128 spend WAN bandwidth on flags).
//      Smaller messages are latency-bound: NCCL's own model, which includes the WAN latency,
//        decides.
//    nChannels is never set.
// Thread-safety: init/getCollInfo/finalize may be called from several communicators' threads at
// once; each context is used by one communicator, and nothing here blocks.
#ifndef STRAIT_PLUGINS_NCCL_TUNER_H_
#define STRAIT_PLUGINS_NCCL_TUNER_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "plugins/nccl/config.h"
#include "plugins/nccl/nccl_net.h"
#include "plugins/nccl/transport.h"
#include "strait/status.h"

extern "C" {

// ncclFunc_t (values are NCCL's and never change).
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7,
} ncclFunc_t;

constexpr int kNcclNumAlgorithmsV5 =
    7;  // Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT
constexpr int kNcclNumProtocolsV5 = 3;  // LL, LL128, Simple
constexpr int kNcclNumHwLinksV5 = 3;    // NVLink, PCI, NET
constexpr int kNcclNumCompCapsV5 = 4;
constexpr int kNcclNumTuningScalesV5 = 3;

constexpr int kNcclAlgoTree = 0;
constexpr int kNcclAlgoRing = 1;
constexpr int kNcclAlgoCollNetDirect = 2;
constexpr int kNcclAlgoCollNetChain = 3;
constexpr int kNcclAlgoNvls = 4;
constexpr int kNcclAlgoNvlsTree = 5;
constexpr int kNcclAlgoPat = 6;
constexpr int kNcclProtoLL = 0;
constexpr int kNcclProtoLL128 = 1;
constexpr int kNcclProtoSimple = 2;
constexpr int kNcclHwNvlink = 0;
constexpr int kNcclHwPci = 1;
constexpr int kNcclHwNet = 2;
constexpr float kNcclAlgoProtoIgnore = -1.0f;
constexpr unsigned long kNcclSubsysTuning = 0x40;

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;

typedef struct {
  double baseLatencies[kNcclNumAlgorithmsV5][kNcclNumProtocolsV5];
  double hwLatencies[kNcclNumHwLinksV5][kNcclNumAlgorithmsV5][kNcclNumProtocolsV5];  // us
  double llMaxBws[kNcclNumCompCapsV5][kNcclNumTuningScalesV5];
  double perChMaxRingLL128Bws[kNcclNumCompCapsV5][kNcclNumTuningScalesV5];
  double perChMaxTreeLL128Bws[kNcclNumCompCapsV5][kNcclNumTuningScalesV5];
  double perChMaxTreeBws[kNcclNumCompCapsV5][kNcclNumTuningScalesV5];
  double perChMaxNVLSTreeBws[kNcclNumCompCapsV5][kNcclNumTuningScalesV5];
} ncclTunerConstants_v5_t;

typedef struct {
  const char* name;
  // Per communicator; may rewrite `constants`. Does not block.
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvlDomainInfo,
                       ncclTunerConstants_v5_t* constants);
  // Per collective (hot path); `collCostTable` is float[numAlgo][numProto]. Does not block.
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* context);
} ncclTuner_v5_t;

}  // extern "C"

static_assert(sizeof(ncclNvlDomainInfo_v5_t) == 12);
static_assert(offsetof(ncclTunerConstants_v5_t, baseLatencies) == 0);
static_assert(offsetof(ncclTunerConstants_v5_t, hwLatencies) == 168);
static_assert(offsetof(ncclTunerConstants_v5_t, llMaxBws) == 672);
static_assert(offsetof(ncclTunerConstants_v5_t, perChMaxRingLL128Bws) == 768);
static_assert(offsetof(ncclTunerConstants_v5_t, perChMaxTreeLL128Bws) == 864);
static_assert(offsetof(ncclTunerConstants_v5_t, perChMaxTreeBws) == 960);
static_assert(offsetof(ncclTunerConstants_v5_t, perChMaxNVLSTreeBws) == 1056);
static_assert(sizeof(ncclTunerConstants_v5_t) == 1152);
static_assert(offsetof(ncclTuner_v5_t, init) == 8);
static_assert(offsetof(ncclTuner_v5_t, getCollInfo) == 16);
static_assert(offsetof(ncclTuner_v5_t, finalize) == 24);
static_assert(sizeof(ncclTuner_v5_t) == 32);

namespace strait::nccl::tuner {

// What the tuner decided for one communicator (exposed for tests).
struct TunerPlan {
  bool spans_regions = false;
  double wan_latency_us = 0;    // the WAN's one-way latency
  double added_latency_us = 0;  // what init added to the NET row (see the policy above)
  double wan_bytes_per_us = 0;  // 0: unknown (no STRAIT_WAN_SPEED_MBPS, no Strait net device)
  // Messages of at least this many bytes are bandwidth-bound over the WAN (its bandwidth-delay
  // product); SIZE_MAX when the bandwidth is unknown.
  size_t bandwidth_bound_bytes = SIZE_MAX;
};

// Builds the plan from the environment. `device`: what this process's Strait net device reports
// to NCCL (nullopt when the Strait net is not initialised here). Errors name the variable (the
// same messages as the net plugin's init).
StatusOr<TunerPlan> MakePlan(const EnvGetter& env, size_t n_nodes,
                             const std::optional<DeviceProperties>& device);

// Applies the plan's constants rewrite (NET row only).
void RewriteConstants(const TunerPlan& plan, ncclTunerConstants_v5_t* constants);

// Applies the plan to one cost table (float[num_algo][num_proto], row-major).
void AdjustCostTable(const TunerPlan& plan, int coll, size_t n_bytes, float* table, int num_algo,
                     int num_proto);

// The C boundary: what ncclTunerPlugin_v5 points to. Never throws.
ncclResult_t Init(void** ctx, uint64_t comm_id, size_t n_ranks, size_t n_nodes,
                  ncclDebugLogger_t logger, ncclNvlDomainInfo_v5_t* nvl,
                  ncclTunerConstants_v5_t* constants);
ncclResult_t GetCollInfo(void* ctx, ncclFunc_t coll, size_t n_bytes, int num_pipe_ops,
                         float** table, int num_algo, int num_proto, int reg_buff, int* n_channels);
ncclResult_t Finalize(void* ctx);

}  // namespace strait::nccl::tuner

#endif  // STRAIT_PLUGINS_NCCL_TUNER_H_
