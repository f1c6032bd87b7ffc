// `strait-bench allreduce`'s hidden rank mode through a straitd (`--rank-role mesh`), and what
// both rank modes share: the region data, the per-iteration barrier, the check of a result
// against the fp64 reference and the result line. See allreduce_internal.h.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <span>
#include <thread>

#include "bench/allreduce_internal.h"
#include "bench/gradient.h"
#include "common/hash.h"
#include "common/units.h"
#include "localproto/client.h"
#include "strait/codec.h"

namespace strait::bench::allreduce {

namespace {

// --gateway's verdict: one line a person reads, exit 1 when the result is wrong.
int SmokeReport(const Flags& f, const std::string& policy, const Json& times, const Check& c,
                const std::string& hash) {
  double mean_ms = 0;
  for (const auto& t : times) mean_ms += t.get<double>() / 1e6;
  if (!times.empty()) mean_ms /= static_cast<double>(times.size());
  std::ostringstream o;
  o << "strait-bench allreduce --gateway " << f.gateway << ": region " << f.region_index
    << " shard " << f.shard_index << ", job " << f.job << ", policy " << policy << ": "
    << f.iters << " all-reduces of " << FormatBytes(f.size) << ", mean " << std::fixed
    << std::setprecision(1) << mean_ms << " ms; ";
  if (c.wrong > 0) {
    o << "WRONG: " << c.wrong << " elements differ from the sum of the " << f.regions
      << " regions' inputs (max error " << std::setprecision(6) << c.max_error
      << "); check that every region ran this with the same flags and its own --region-index";
    std::cout << o.str() << std::endl;
    return kExitFailure;
  }
  o << "OK (max error " << std::setprecision(6) << c.max_error << ", result hash " << hash
    << ": the same in every region)";
  std::cout << o.str() << std::endl;
  return kExitOk;
}

// Rounds data[0, n) to `dtype` and back to fp32 in place (what a rank sends, as fp32).
void RoundTo(DataType dtype, float* data, size_t n) {
  std::vector<uint8_t> narrow(n * DataTypeSize(dtype));
  if (!ConvertFromFloat(data, narrow.data(), dtype, n).ok() ||
      !ConvertToFloat(narrow.data(), dtype, data, n).ok()) {
    std::fill(data, data + n, std::nanf(""));  // fails the check loudly rather than passing
  }
}

}  // namespace

// Worst-case error per block step, by what the gateway resolved: a block's step is
// absmax / levels (int8 127, int4 7; fp8 e4m3's widest gap, 32 at the top of 448, is 1/14).
// 0 for lossless codecs.
double LossyLevels(const std::string& resolved_policy) {
  if (resolved_policy.rfind("int8", 0) == 0) return 127;
  if (resolved_policy.rfind("int4", 0) == 0) return 7;
  if (resolved_policy.rfind("fp8", 0) == 0) return 14;
  return 0;
}

// The rest of the line `key ...` of straitd's stats text ("" without one).
std::string StatLine(const std::string& stats, const std::string& key) {
  const std::string needle = key + " ";
  for (size_t at = 0; (at = stats.find(needle, at)) != std::string::npos; at += needle.size()) {
    if (at == 0 || stats[at - 1] == '\n') {
      const size_t from = at + needle.size();
      return stats.substr(from, stats.find('\n', from) - from);
    }
  }
  return "";
}

// The value of line "<key> <value>" in straitd's stats text; 0 when absent.
uint64_t StatValue(const std::string& stats, const std::string& key) {
  return std::strtoull(StatLine(stats, key).c_str(), nullptr, 10);
}

uint64_t RegionSeed(int region) {
  return 0x5eed0000u + static_cast<uint64_t>(region);
}

// [begin, end) of slice `index` of `count` elements split `parts` ways.
std::pair<size_t, size_t> Slice(size_t count, int parts, int index) {
  const size_t p = static_cast<size_t>(parts);
  const size_t i = static_cast<size_t>(index);
  return {count * i / p, count * (i + 1) / p};
}


std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Compares result[0, end-begin) with the fp64 sum over regions of elements [begin, end) of each
// region's tensor. Lossless: within fp32 rounding of the n-term sum. Lossy: each input may be
// off by one step of its block (quantization plus the residual error feedback carries), and so
// may the result: the owner re-encodes the sum with its own residual, which carries up to half a
// step of the previous iteration's rounding into this one's half step (a half-step allowance read
// 12 of 16.8M elements 0.4-1.5% over it after ten int8+ef iterations of the 3x2 64 MiB run);
// blocks are taken as any 256-element window within two blocks either side, since the gateway's
// shards need not align with this slice.
// bfloat16 and float16: the inputs are the fp32 data rounded to `dtype` (what the ranks send),
// the sum is fp64 over those, and the rounding allowance is that of `dtype` (each partial sum
// may be rounded to it; float16 also allows its subnormal spacing per term), added to the lossy
// allowance.
Check CheckAgainstReference(const float* result, size_t count_total, size_t begin, size_t end,
                            int regions, double levels, DataType dtype) {
  const size_t n = end - begin;
  constexpr size_t kBlock = 256;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> ref(n, 0.0), sum_abs(n, 0.0), step_sum(blocks, 0.0);
  std::vector<float> full(count_total);
  std::vector<double> block_max(blocks);
  auto widen = [&](std::vector<double>& v) {  // max over +-2 blocks
    std::vector<double> w(v.size(), 0.0);
    for (size_t b = 0; b < v.size(); ++b) {
      for (size_t d = (b >= 2 ? b - 2 : 0); d <= std::min(v.size() - 1, b + 2); ++d) {
        w[b] = std::max(w[b], v[d]);
      }
    }
    return w;
  };
  for (int r = 0; r < regions; ++r) {
    FillGradient(RegionSeed(r), full);
    if (dtype != DataType::kFloat32) RoundTo(dtype, full.data() + begin, n);
    std::fill(block_max.begin(), block_max.end(), 0.0);
    for (size_t i = 0; i < n; ++i) {
      const double x = full[begin + i];
      ref[i] += x;
      sum_abs[i] += std::fabs(x);
      block_max[i / kBlock] = std::max(block_max[i / kBlock], std::fabs(x));
    }
    const std::vector<double> w = widen(block_max);
    for (size_t b = 0; b < blocks; ++b) step_sum[b] += w[b];
  }
  std::fill(block_max.begin(), block_max.end(), 0.0);
  for (size_t i = 0; i < n; ++i) {
    block_max[i / kBlock] = std::max(block_max[i / kBlock], std::fabs(ref[i]));
  }
  const std::vector<double> out_max = widen(block_max);
  // fp32's 1.2e-7 is its machine epsilon (2^-23); bfloat16's is 2^-7, float16's 2^-10, whose
  // smallest subnormal step (2^-24) also bounds the error of tiny terms.
  const double eps = dtype == DataType::kBfloat16  ? 0x1p-7
                     : dtype == DataType::kFloat16 ? 0x1p-10
                                                   : 1.2e-7;
  const double rounding = 4.0 * regions * eps;
  const double floor = dtype == DataType::kFloat16 ? 4.0 * regions * 0x1p-24 : 0.0;
  Check c;
  for (size_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(result[i]) - ref[i]);
    double tol;
    if (levels > 0) {
      // 1.25: error feedback's compensated input can exceed the block's absmax by a step.
      tol = 1.25 * (step_sum[i / kBlock] + out_max[i / kBlock]) / levels;
      if (dtype != DataType::kFloat32) tol += rounding * sum_abs[i] + floor;
    } else {
      tol = rounding * sum_abs[i] + floor;
    }
    tol += 1e-37;
    c.max_error = std::max(c.max_error, err);
    c.wrong += err > tol || std::isnan(result[i]);
  }
  return c;
}

void Emit(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// Every rank of a run waits here before each iteration, so that an iteration's time is that of
// a synchronous collective whose ranks all arrive together (as in training, and as OSU's
// benchmarks put a barrier between iterations). Without it, back-to-back iterations drift apart
// (starts 0.3-0.6 s apart across the two gateway groups of a sidecar run), and a rank that
// starts early counts the late ones' start as its own time. The ranks share the file system
// (strait-wanem puts them in network namespaces only): each marks its arrival with a file
// "<iteration>.<rank>" and polls for the others' (release skew ~0.2 ms).
Status IterationBarrier(const std::string& dir, int rank, int ranks, int iteration,
                        Deadline deadline) {
  const std::string prefix = dir + "/" + std::to_string(iteration) + ".";
  const std::string mine = prefix + std::to_string(rank);
  const int fd = ::open(mine.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) {
    return UnavailableError("barrier: cannot create " + mine + ": " + std::strerror(errno));
  }
  ::close(fd);
  int next = 0;  // ranks below `next` have arrived
  while (next < ranks) {
    if (::access((prefix + std::to_string(next)).c_str(), F_OK) == 0) {
      ++next;
      continue;
    }
    if (deadline.Expired()) {
      return DeadlineExceededError("barrier before iteration " + std::to_string(iteration) +
                                   ": rank " + std::to_string(next) + " never arrived");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return Status::Ok();
}

Json RankResult(const Flags& f, const std::string& policy, const Json& times, const Json& starts,
                const std::string& stats_before, const StatusOr<std::string>& stats,
                const Check& check, const std::vector<uint8_t>& data) {
  Json gateway_ns;  // per measured iteration, this rank's gateway
  for (const char* key : kTimeKeys) {
    const uint64_t after = stats.ok() ? StatValue(*stats, key) : 0;
    const uint64_t before = StatValue(stats_before, key);
    gateway_ns[key] = after >= before ? (after - before) / static_cast<uint64_t>(f.iters) : 0;
  }
  const uint64_t sent_before = StatValue(stats_before, "bytes_sent");
  const uint64_t sent = stats.ok() ? StatValue(*stats, "bytes_sent") - sent_before : 0;
  Json out;
  out["region"] = f.rank_region;
  out["rank"] = f.rank_index;
  out["policy"] = policy;
  out["times_ns"] = times;
  out["starts_ns"] = starts;  // CLOCK_MONOTONIC: one clock for every process on the machine
  out["wan_bytes_sent"] = sent;
  out["gateway_ns"] = gateway_ns;
  out["slow_peers"] = stats.ok() ? StatLine(*stats, "slow_peers") : std::string();
  out["max_error"] = check.max_error;
  out["wrong"] = check.wrong;
  out["hash"] = Hex(Fnv1a64(data.data(), data.size()));
  return out;
}

// --- Rank mode: mesh (through the rank's own straitd) -----------------------------------------

int RunMeshRank(const Flags& f) {
  // The gateway may still be starting (the orchestrator's, or a deployed one restarting), so
  // connecting is retried -- for a minute, or --timeout if shorter; a smoke test says that it
  // waits, so that a mistyped socket is not a silent minute.
  const bool smoke = !f.gateway.empty();
  const std::string who = smoke ? "strait-bench allreduce --gateway " + f.gateway
                                : "rank " + std::to_string(f.rank_region) + "." +
                                      std::to_string(f.rank_index);
  const Deadline connect_deadline = Deadline::AfterSeconds(std::min(60.0, f.timeout_s));
  const Deadline say_waiting = Deadline::AfterSeconds(2);
  bool said = false;
  StatusOr<std::unique_ptr<localproto::Client>> client = UnavailableError("not tried");
  while (!connect_deadline.Expired()) {
    client = localproto::Client::Connect(f.socket, Deadline::AfterSeconds(5),
                                      "bench-r" + std::to_string(f.rank_region),
                                      static_cast<uint32_t>(f.rank_index));
    if (client.ok()) break;
    if (smoke && !said && say_waiting.Expired()) {
      std::cerr << who << ": waiting up to " << std::min(60.0, f.timeout_s)
                << " s for the gateway: " << client.status().message() << '\n';
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!client.ok()) {
    std::cerr << who << ": " << client.status() << '\n';
    return kExitFailure;
  }
  StatusOr<std::string> policy = (*client)->RegisterJob(f.job, f.codec, Deadline::AfterSeconds(10));
  if (!policy.ok()) {
    std::cerr << "rank " << f.rank_region << ": register: " << policy.status() << '\n';
    return kExitFailure;
  }
  // The tensor in --dtype: the fp32 gradient data rounded to it (CheckAgainstReference rounds
  // the reference's inputs the same way).
  const size_t elem = DataTypeSize(f.dtype);
  const size_t count = f.size / elem;
  const auto [begin, end] = Slice(count, f.ranks_per_region, f.rank_index);
  std::vector<uint8_t> input((end - begin) * elem), data(input.size());
  {
    std::vector<float> full(count);
    FillGradient(RegionSeed(f.rank_region), full);
    const std::span<const float> mine(full.data() + begin, end - begin);
    if (Status s = ConvertGradient(mine, f.dtype, input.data()); !s.ok()) {
      std::cerr << "rank " << f.rank_region << "." << f.rank_index << ": " << s << '\n';
      return kExitFailure;
    }
  }
  // --zero-copy: the tensor lives in the straitd's shared region for the whole run.
  std::span<uint8_t> shared;
  if (f.zero_copy) {
    auto buffer = (*client)->SharedBuffer(input.size(), Deadline::AfterSeconds(10));
    if (!buffer.ok()) {
      std::cerr << "rank " << f.rank_region << "." << f.rank_index << ": --zero-copy: "
                << buffer.status() << '\n';
      return kExitFailure;
    }
    shared = *buffer;
  }
  Json times = Json::array(), starts = Json::array();
  std::string stats_before;
  for (int it = 0; it < f.warmup + f.iters; ++it) {
    if (it == f.warmup) {
      StatusOr<std::string> stats = (*client)->Stats(Deadline::AfterSeconds(10));
      if (stats.ok()) stats_before = *stats;
    }
    if (f.zero_copy) {
      std::memcpy(shared.data(), input.data(), input.size());
    } else {
      data = input;
    }
    if (!f.barrier.empty()) {
      const Status b = IterationBarrier(f.barrier, f.rank_region * f.ranks_per_region + f.rank_index,
                                        f.regions * f.ranks_per_region, it,
                                        Deadline::AfterSeconds(f.timeout_s));
      if (!b.ok()) {
        std::cerr << "rank " << f.rank_region << "." << f.rank_index << ": " << b << '\n';
        return kExitFailure;
      }
    }
    const int64_t t0 = MonotonicNanos();
    Status s = f.zero_copy ? (*client)->AllReduceShared(f.job, "grad", f.dtype, ReduceOp::kSum,
                                                        end - begin,
                                                        Deadline::AfterSeconds(f.timeout_s))
                           : (*client)->AllReduce(f.job, "grad", f.dtype, ReduceOp::kSum,
                                                  data.data(), end - begin,
                                                  Deadline::AfterSeconds(f.timeout_s));
    const int64_t t1 = MonotonicNanos();
    if (!s.ok()) {
      std::cerr << "rank " << f.rank_region << "." << f.rank_index << ": all-reduce " << it << ": "
                << s << '\n';
      return kExitFailure;
    }
    if (it >= f.warmup) {
      times.push_back(t1 - t0);
      starts.push_back(t0);
    }
    if (f.gateway.empty()) Emit("progress " + std::to_string(it + 1));
  }
  if (f.zero_copy) std::memcpy(data.data(), shared.data(), data.size());
  StatusOr<std::string> stats = (*client)->Stats(Deadline::AfterSeconds(10));
  std::vector<float> result(end - begin);
  if (Status s = ConvertToFloat(data.data(), f.dtype, result.data(), result.size()); !s.ok()) {
    std::cerr << "rank " << f.rank_region << "." << f.rank_index << ": " << s << '\n';
    return kExitFailure;
  }
  const Check c = CheckAgainstReference(result.data(), count, begin, end, f.regions,
                                        LossyLevels(*policy), f.dtype);
  const Json out = RankResult(f, *policy, times, starts, stats_before, stats, c, data);
  if (!f.gateway.empty()) return SmokeReport(f, *policy, times, c, out["hash"].get<std::string>());
  Emit("result " + out.dump());
  return kExitOk;
}

}  // namespace strait::bench::allreduce
