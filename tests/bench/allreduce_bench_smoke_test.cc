// Smoke test of `strait-bench allreduce --loopback`: three regions of two ranks on 127.0.0.1,
// each rank a process with its own straitd, 1 MiB for two iterations, with and without the ring
// baseline; int8 with error feedback for ten iterations (16 MiB); several codecs with weighted
// and even shards in one run (gateways restarted with allreduce.shard_weights, which must change
// how many bytes each region sends); gateways over TLS. Checks the exit status and the --json
// fields (correctness verdicts included: no wrong element, bit-identical ranks); never a speed.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/straitd_process.h"

namespace {

// Runs strait-bench with `args`, stdout captured (stderr goes to the test's log).
strait::test::CapturedRun RunBench(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {STRAIT_BENCH_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  return strait::test::RunCaptured(argv, /*capture_stderr=*/false);
}

std::vector<std::string> Common(const std::string& codec, const std::string& size = "1MiB",
                                const std::string& iters = "2", const std::string& timeout = "30") {
  return {"allreduce", "--loopback", "--size",       size,        "--iters", iters,   "--codec",
          codec,       "--straitd",  STRAITD_BINARY, "--timeout", timeout,   "--json"};
}

TEST(AllReduceBench, LoopbackInt8MeshAndRingBaselineReportEveryField) {
  std::vector<std::string> args = Common("int8");
  args.insert(args.end(), {"--baseline", "ring"});
  const auto r = RunBench(args);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["command"], "allreduce");
  EXPECT_EQ(j["tool"], "strait-bench");
  EXPECT_TRUE(j["version"].is_string());
  EXPECT_TRUE(j["timestamp"].is_string());
  EXPECT_EQ(j["regions"], 3);
  EXPECT_EQ(j["ranks_per_region"], 2);
  EXPECT_EQ(j["size_bytes"], 1 << 20);
  EXPECT_EQ(j["count"], 1 << 18);
  EXPECT_EQ(j["emulated"], false);
  EXPECT_TRUE(j["link"].is_null());
  EXPECT_TRUE(j["loopback_reason"].is_string());
  // int8 on the wire: about 4x smaller than fp32 (scales included), measured from the gateways.
  EXPECT_GT(j["codec_ratio"].get<double>(), 3.0);
  ASSERT_EQ(j["runs"].size(), 2u);
  for (const auto& run : j["runs"]) {
    EXPECT_GT(run["time_s"].get<double>(), 0.0) << run;
    // One time per measured iteration; the mean of them is time_s, and it lies within the spread.
    ASSERT_EQ(run["iteration_s"].size(), 2u) << run;
    const double a = run["iteration_s"][0].get<double>(), b = run["iteration_s"][1].get<double>();
    EXPECT_NEAR((a + b) / 2, run["time_s"].get<double>(), 1e-9) << run;
    EXPECT_DOUBLE_EQ(run["time_min_s"].get<double>(), std::min(a, b)) << run;
    EXPECT_DOUBLE_EQ(run["time_max_s"].get<double>(), std::max(a, b)) << run;
    EXPECT_NEAR(run["time_median_s"].get<double>(), (a + b) / 2, 1e-9) << run;
    EXPECT_GT(run["algbw_gbs"].get<double>(), 0.0) << run;
    EXPECT_GT(run["busbw_gbs"].get<double>(), run["algbw_gbs"].get<double>()) << run;
    EXPECT_EQ(run["wrong"], 0) << run;
    EXPECT_EQ(run["identical"], true) << run;
    EXPECT_TRUE(run["bound_s"].is_null()) << "no bound on loopback: " << run;
    EXPECT_TRUE(run.contains("max_error"));
  }
  EXPECT_EQ(j["runs"][0]["policy"].get<std::string>().rfind("int8", 0), 0u) << j["runs"][0];
  // int8 is lossy, the uncompressed ring is not.
  EXPECT_GT(j["runs"][0]["max_error"].get<double>(), 0.0);
  EXPECT_LT(j["runs"][1]["max_error"].get<double>(), 1e-5);
  EXPECT_GT(j["baseline_over_mesh"].get<double>(), 0.0);
}

// int8 with error feedback carries each rounding into the next iteration, at the owner as at
// the senders, so after several iterations the result may be off by a whole step of its block.
// A check that allowed the result half a step called this run (16 MiB, ten iterations) wrong:
// 6 of 4.2M elements, exit 1. Ten iterations, so that the carried residuals are what is checked.
TEST(AllReduceBench, Int8WithErrorFeedbackPassesItsCheckAfterManyIterations) {
  const auto r = RunBench(Common("int8,ef", "16MiB", "10", "60"));
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["runs"].size(), 1u);
  const auto& run = j["runs"][0];
  EXPECT_EQ(run["iteration_s"].size(), 10u) << run;
  EXPECT_EQ(run["wrong"], 0) << run;
  EXPECT_EQ(run["identical"], true) << run;
  // Lossy for real: the check had something to allow.
  EXPECT_GT(run["max_error"].get<double>(), 1e-3) << run;
}

TEST(AllReduceBench, LoopbackZstdMeshIsExactToFp32Rounding) {
  const auto r = RunBench(Common("zstd"));
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["runs"].size(), 1u);
  EXPECT_EQ(j["runs"][0]["policy"].get<std::string>().rfind("zstd", 0), 0u) << j["runs"][0];
  EXPECT_EQ(j["runs"][0]["wrong"], 0);
  EXPECT_LT(j["runs"][0]["max_error"].get<double>(), 1e-5);
  EXPECT_TRUE(j["baseline_over_mesh"].is_null());
}

// --zero-copy: the ranks all-reduce the slice kept in their straitd's shared region, checked
// against the reference like the copying path, in fp32 and bf16, over several iterations (the
// input is rewritten before each); every gateway's row carries the rank's own call time.
TEST(AllReduceBench, ZeroCopyRanksAreCheckedLikeCopyingOnes) {
  for (const char* dtype : {"float32", "bfloat16"}) {
    std::vector<std::string> args = Common("zstd", "2MiB", "3");
    args.insert(args.end(), {"--zero-copy", "--dtype", dtype});
    const auto r = RunBench(args);
    ASSERT_EQ(r.code, 0) << dtype << ": " << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    ASSERT_EQ(j["runs"].size(), 1u);
    EXPECT_EQ(j["zero_copy"], true);
    const nlohmann::json& run = j["runs"][0];
    EXPECT_EQ(run["wrong"], 0) << dtype;
    ASSERT_EQ(run["gateway_phases_ms"].size(), 6u) << run;
    for (const auto& g : run["gateway_phases_ms"]) {
      EXPECT_GE(g["rank_call_ms"].get<double>(), g["request_ms"].get<double>()) << g;
    }
  }
}

// Unequal links (given with --pair even though loopback does not emulate them) make the
// weighted rows run with shard weights from each region's slowest link: region 0 (200 and 100
// Mbit/s) gets twice the share of regions 1 and 2 (50 Mbit/s each). An owner sends its share
// to n-1 regions and its part of the other shards once, so with weights 2:1:1 region 0 sends
// (2 x 1/2 + 1/2) = 1.5 units and regions 1 and 2 (2 x 1/4 + 3/4) = 1.25 units; even shards give
// 4/3 each. That is checked on the gateways' byte counters, so ignored weights fail the test.
// The balanced split of these links (the linear program's optimum) is (2/3, 1/3, 0): region 2
// owns one 256-element unit and sends only its inputs (1 unit of bytes against region 0's
// 2 x 2/3 + 1/3 = 5/3), checked on int8 only.
TEST(AllReduceBench, LoopbackWeightedBalancedAndEvenShardsForSeveralCodecs) {
  std::vector<std::string> args = Common("int8,ef/zstd");
  args.insert(args.end(), {"--pair", "0:1=rate=200mbit", "--pair", "0:2=rate=100mbit", "--pair",
                           "1:2=rate=50mbit", "--shards", "weighted,even,balanced"});
  const auto r = RunBench(args);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["links_equal"], false);
  ASSERT_EQ(j["runs"].size(), 6u);
  const char* codecs[] = {"int8,ef", "zstd", "int8,ef", "zstd", "int8,ef", "zstd"};
  const char* shards[] = {"weighted", "weighted", "even", "even", "balanced", "balanced"};
  for (size_t i = 0; i < 6; ++i) {
    const auto& run = j["runs"][i];
    EXPECT_EQ(run["codec"], codecs[i]) << run;
    EXPECT_EQ(run["shards"], shards[i]) << run;
    EXPECT_EQ(run["wrong"], 0) << run;
    EXPECT_EQ(run["identical"], true) << run;
    const auto bytes = run["region_wan_bytes_per_iter"].get<std::vector<double>>();
    ASSERT_EQ(bytes.size(), 3u) << run;
    if (i < 2) {
      EXPECT_EQ(run["shard_weights"], (std::vector<uint64_t>{100000, 50000, 50000})) << run;
      // 1.5 / 1.25 = 1.2 uncompressed; int8 frames carry per-block scales, zstd's ratio
      // depends on the data, so allow some slack but not the even split's 1.0.
      EXPECT_GT(bytes[0] / bytes[1], 1.1) << run;
      EXPECT_GT(bytes[0] / bytes[2], 1.1) << run;
    } else if (i < 4) {
      // Given explicitly: without shard_weights straitd would split by its measured rates.
      EXPECT_EQ(run["shard_weights"], (std::vector<uint64_t>{1, 1, 1})) << run;
      EXPECT_LT(std::abs(bytes[0] / bytes[1] - 1.0), 0.06) << run;
      EXPECT_LT(std::abs(bytes[0] / bytes[2] - 1.0), 0.06) << run;
    } else {
      // collective::BalancedShardWeights of the rates in bit/s: 2x the optimum, at least 1.
      EXPECT_EQ(run["shard_weights"], (std::vector<uint64_t>{200'000'000, 100'000'000, 1}))
          << run;
      if (i == 4) {
        EXPECT_NEAR(bytes[0] / bytes[2], 5.0 / 3.0, 0.1) << run;
      }
    }
  }
  EXPECT_EQ(j["runs"][0]["policy"].get<std::string>().rfind("int8+ef", 0), 0u) << j["runs"][0];
  EXPECT_EQ(j["runs"][1]["policy"].get<std::string>().rfind("zstd", 0), 0u) << j["runs"][1];
  // The gateways' own time split comes back for every mesh row.
  EXPECT_GT(j["runs"][0]["gateway_ms_per_iter"]["allreduce"].get<double>(), 0.0) << j["runs"][0];
  EXPECT_GT(j["runs"][0]["gateway_ms_per_iter"]["encode"].get<double>(), 0.0) << j["runs"][0];
}

TEST(AllReduceBench, LoopbackOverTls) {
  std::vector<std::string> args = Common("int8");
  args.insert(args.end(), {"--transport", "tls"});
  const auto r = RunBench(args);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["transport"], "tls");
  ASSERT_EQ(j["runs"].size(), 1u);
  EXPECT_EQ(j["runs"][0]["wrong"], 0);
  EXPECT_EQ(j["runs"][0]["identical"], true);
}

// nccl-tests' sweep on one set of gateways: -b 4KiB -e 64KiB -f 4 is 4, 16 and 64 KiB, one
// object per size in --json, each verified (no wrong element, every region the same bits), in
// bfloat16 through the gateways' int8 codec (lossy from 4 KiB in the bench's policy).
TEST(AllReduceBench, SweepGivesOneVerifiedObjectPerSizeInBfloat16) {
  const auto r = RunBench({"allreduce", "--loopback", "--regions", "2", "--ranks-per-region",
                             "1", "-b", "4KiB", "-e", "64KiB", "-f", "4", "--iters", "2",
                             "--dtype", "bfloat16", "--codec", "int8", "--straitd",
                             STRAITD_BINARY, "--timeout", "30", "--json"});
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["dtype"], "bfloat16");
  EXPECT_EQ(j["type"], "bfloat16");
  ASSERT_EQ(j["sizes"].size(), 3u) << j;
  const uint64_t sizes[] = {4096, 16384, 65536};
  for (size_t k = 0; k < 3; ++k) {
    const auto& s = j["sizes"][k];
    EXPECT_EQ(s["size_bytes"], sizes[k]) << s;
    EXPECT_EQ(s["count"], sizes[k] / 2) << s;
    ASSERT_EQ(s["runs"].size(), 1u) << s;
    const auto& run = s["runs"][0];
    EXPECT_EQ(run["size_bytes"], sizes[k]) << run;
    EXPECT_EQ(run["wrong"], 0) << run;
    EXPECT_EQ(run["identical"], true) << run;
    EXPECT_GT(run["time_s"].get<double>(), 0.0) << run;
    // 2 regions: busbw = algbw x 2(n-1)/n = algbw.
    EXPECT_DOUBLE_EQ(run["busbw_gbs"].get<double>(), run["algbw_gbs"].get<double>()) << run;
    EXPECT_EQ(run["policy"].get<std::string>().rfind("int8", 0), 0u) << run;
    // Every size is a small message; on loopback there is no RTT to hold it to.
    EXPECT_TRUE(run["small_message"]["rtt_s"].is_null()) << run;
    ASSERT_EQ(run["gateway_phases_ms"].size(), 2u) << run;
    EXPECT_GT(run["gateway_phases_ms"][0]["allreduce_ms"].get<double>(), 0.0) << run;
  }
  // The single-size fields are the first size's.
  EXPECT_EQ(j["size_bytes"], 4096);
  EXPECT_EQ(j["runs"][0]["size_bytes"], 4096);
}

// The human table of a float32 sweep: one row per size (size and element count in their
// columns, result verified), the small-message lines and, with --phases, a phase table per size
// with a line per gateway.
TEST(AllReduceBench, SweepTablePrintsOneRowPerSizeAndThePhases) {
  const auto r = RunBench({"allreduce", "--loopback", "--regions", "2", "--ranks-per-region",
                             "1", "--minbytes", "4KiB", "--maxbytes", "64KiB", "--stepfactor",
                             "4", "--iters", "1", "--codec", "zstd", "--phases", "--straitd",
                             STRAITD_BINARY, "--timeout", "30"});
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> rows;
  size_t phase_lines = 0, small_lines = 0;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("mesh zstd", 0) == 0) rows.push_back(line);
    if (line.rfind("#  r", 0) == 0) ++phase_lines;  // "#  r0.0  1.2 ..."
    if (line.rfind("#   mesh zstd, ", 0) == 0) ++small_lines;
  }
  ASSERT_EQ(rows.size(), 3u) << r.out;
  const char* sizes[] = {" 4096 ", " 16384 ", " 65536 "};
  const char* counts[] = {" 1024 ", " 4096 ", " 16384 "};
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_NE(rows[k].find(sizes[k]), std::string::npos) << rows[k];
    EXPECT_NE(rows[k].find(counts[k]), std::string::npos) << rows[k];
    EXPECT_NE(rows[k].find(" float "), std::string::npos) << rows[k];
    // #wrong 0, then n/a bound and meas/bnd (loopback), identical.
    EXPECT_NE(rows[k].find(" 0       n/a       n/a yes"), std::string::npos) << rows[k];
  }
  EXPECT_EQ(small_lines, 3u) << r.out;
  EXPECT_EQ(phase_lines, 3u * 2u) << r.out;  // 3 sizes x 2 gateways
  EXPECT_NE(r.out.find("hand-over"), std::string::npos) << r.out;
}

TEST(AllReduceBench, Float16IsCheckedInItsOwnRounding) {
  const auto r = RunBench({"allreduce", "--loopback", "--regions", "2", "--ranks-per-region",
                             "2", "--size", "256KiB", "--iters", "1", "--dtype", "float16",
                             "--codec", "zstd", "--straitd", STRAITD_BINARY, "--timeout", "30",
                             "--json"});
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["type"], "half");
  EXPECT_EQ(j["count"], 128 * 1024);
  ASSERT_EQ(j["runs"].size(), 1u);
  EXPECT_EQ(j["runs"][0]["wrong"], 0) << j["runs"][0];
  EXPECT_EQ(j["runs"][0]["identical"], true) << j["runs"][0];
}

TEST(AllReduceBench, BadSweepAndDtypeFlagsAreUsageErrors) {
  EXPECT_EQ(RunBench({"allreduce", "-b", "64KiB", "-e", "4KiB"}).code, 2);  // b > e
  EXPECT_EQ(RunBench({"allreduce", "-b", "4KiB", "-e", "64KiB", "-f", "1"}).code, 2);
  EXPECT_EQ(RunBench({"allreduce", "-b", "4KiB", "-e", "64KiB", "-f", "0"}).code, 2);
  EXPECT_EQ(RunBench({"allreduce", "-b", "lots", "-e", "64KiB"}).code, 2);
  EXPECT_EQ(RunBench({"allreduce", "-b", "4KiB", "-e", "64KiB", "-f", "two"}).code, 2);
  EXPECT_EQ(RunBench({"allreduce", "--maxbytes", "12"}).code, 2);  // below 1 KiB
  EXPECT_EQ(RunBench({"allreduce", "--size", "4KiB", "-b", "4KiB", "-e", "8KiB"}).code, 2);
  EXPECT_EQ(RunBench({"allreduce", "-b", "1026", "-e", "4KiB"}).code, 2);  // not fp32
  EXPECT_EQ(RunBench({"allreduce", "--dtype", "int8"}).code, 2);
  EXPECT_EQ(RunBench({"allreduce", "--dtype", "bfloat16", "--baseline", "ring"}).code, 2);
  EXPECT_EQ(RunBench({"allreduce", "--dtype", "float16", "--size", "1027"}).code, 2);
}

// Gateway layouts: 4 ranks per region through 4 straitds, then 2, then 1 per region (each
// serving 1, 2 or 4 shards behind one socket): one verified row each, the rows named by layout.
TEST(AllReduceBench, StraitdsPerRegionRunOneVerifiedRowPerLayout) {
  const auto r = RunBench({"allreduce", "--loopback", "--regions", "2", "--ranks-per-region",
                           "4", "--straitds-per-region", "4/2/1", "--size", "1MiB", "--iters",
                           "2", "--codec", "int8", "--straitd", STRAITD_BINARY, "--timeout", "30",
                           "--json"});
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["runs"].size(), 3u) << j;
  const int layouts[] = {4, 2, 1};
  for (size_t k = 0; k < 3; ++k) {
    const auto& run = j["runs"][k];
    EXPECT_EQ(run["straitds_per_region"], layouts[k]) << run;
    EXPECT_NE(run["name"].get<std::string>().find(std::to_string(layouts[k]) + " straitd"),
              std::string::npos)
        << run;
    EXPECT_EQ(run["wrong"], 0) << run;
    EXPECT_EQ(run["identical"], true) << run;
    ASSERT_EQ(run["gateway_phases_ms"].size(), 8u) << run;  // one per (region, shard)
  }
  EXPECT_EQ(RunBench({"allreduce", "--loopback", "--ranks-per-region", "4",
                      "--straitds-per-region", "3"})
                .code,
            2);
}

TEST(AllReduceBench, BadFlagsAreUsageErrors) {
  EXPECT_EQ(RunBench({"allreduce", "--baseline", "tree"}).code, 2);
  EXPECT_EQ(RunBench({"allreduce", "--regions", "1"}).code, 2);
  EXPECT_EQ(RunBench({"allreduce", "--size", "1026"}).code, 2);
  EXPECT_EQ(RunBench({"allreduce", "--loopback", "--shards", "uneven"}).code, 2);
  EXPECT_EQ(RunBench({"allreduce", "--loopback", "--pair", "0:5=rate=1mbit"}).code, 2);
  EXPECT_EQ(RunBench({"allreduce", "--transport", "ssl"}).code, 2);
}

// Out-of-range numbers are named with what is accepted, not CLI11's "Value 5 not in range
// [4096 - 16777216]" (which, joined with the check for 0, printed two clauses).
TEST(AllReduceBench, OutOfRangeNumbersSayWhatIsAccepted) {
  const auto run = [](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {STRAIT_BENCH_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    return strait::test::RunCaptured(argv);
  };
  auto r = run({"allreduce", "--chunk-elements", "5"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--chunk-elements: found 5; give 4096..16777216 elements, or 0 "
                       "(straitd's default)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("OR"), std::string::npos) << r.err;
  r = run({"allreduce", "--timeout", "0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--timeout: found 0; give 1..86400 seconds"), std::string::npos) << r.err;
  r = run({"allreduce", "--timeout", "soon"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("found 'soon'; give 1..86400 seconds"), std::string::npos) << r.err;
}

#ifdef STRAIT_PLUGIN_BINARY
// --collnet: beside the library-mode row, a row whose ranks are node heads driving the NCCL
// plugin's CollNet table (dlopen, listen, handles exchanged, connect, chunked iallreduce/test)
// through their straitds' region all-reduce; its result is checked against the same reference
// (no wrong element, the same bits on every head) and compared with library mode's time; the
// same with the region's links on plain TCP ([region_links], --region-links plain).
TEST(AllReduceBench, CollNetRowDrivesThePluginAndIsCheckedLikeLibraryMode) {
  const std::pair<std::string, std::string> cases[] = {
      {"float32", "tls"}, {"bfloat16", "tls"}, {"float32", "plain"}};
  for (const auto& [dtype, region_links] : cases) {
    std::vector<std::string> args = Common("int8");
    args[3] = "2MiB";  // --size: with --collnet-chunk 512KiB, four iallreduces per head
    args.insert(args.end(), {"--dtype", dtype, "--collnet", STRAIT_PLUGIN_BINARY, "--collnet-chunk",
                             "512KiB", "--region-links", region_links});
    // Plain region links beside TLS ones between regions (on loopback the default is plain).
    if (region_links == "plain") args.insert(args.end(), {"--transport", "tls"});
    const auto r = RunBench(args);
    ASSERT_EQ(r.code, 0) << dtype << " " << region_links << ": " << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_EQ(j["region_links"], region_links) << j;
    ASSERT_EQ(j["runs"].size(), 2u) << j;
    EXPECT_EQ(j["runs"][0]["algorithm"], "mesh");
    const auto& collnet = j["runs"][1];
    EXPECT_EQ(collnet["algorithm"], "collnet") << collnet;
    EXPECT_EQ(collnet["wrong"], 0) << collnet;
    EXPECT_EQ(collnet["identical"], true) << collnet;
    // Lossy, within the codec's bound (checked by the heads), and compressed on the WAN links.
    EXPECT_GT(collnet["max_error"].get<double>(), 0.0) << collnet;
    // int8 is a quarter of float32's bytes and half of bfloat16's (block scales aside).
    EXPECT_GT(collnet["codec_ratio"].get<double>(), dtype == "float32" ? 3.0 : 1.5) << collnet;
    EXPECT_GT(collnet["gateway_ms_per_iter"]["allreduce"].get<double>(), 0.0) << collnet;
    // The region's own phases are timed on every gateway of the CollNet row, and only there.
    for (const auto& g : collnet["gateway_phases_ms"]) {
      EXPECT_GT(g["region_scatter_ms"].get<double>(), 0.0) << g;
      EXPECT_GT(g["region_gather_ms"].get<double>(), 0.0) << g;
    }
    for (const auto& g : j["runs"][0]["gateway_phases_ms"]) {
      EXPECT_EQ(g["region_scatter_ms"].get<double>(), 0.0) << g;
    }
    ASSERT_TRUE(j["collnet_over_mesh"].is_object()) << j;
    EXPECT_GT(j["collnet_over_mesh"]["int8"].get<double>(), 0.0) << j;
  }
}

TEST(AllReduceBench, CollNetFlagsAreCheckedBeforeAnythingStarts) {
  std::vector<std::string> missing = Common("int8");
  missing.insert(missing.end(), {"--collnet", "/nonexistent/libnccl-net-strait.so"});
  const auto a = RunBench(missing);
  EXPECT_EQ(a.code, 2) << a.out;
  std::vector<std::string> automatic = Common("auto");
  automatic.insert(automatic.end(), {"--collnet", STRAIT_PLUGIN_BINARY});
  EXPECT_EQ(RunBench(automatic).code, 2);
  std::vector<std::string> chunk = Common("int8");
  chunk.insert(chunk.end(), {"--collnet", STRAIT_PLUGIN_BINARY, "--collnet-chunk", "64MiB"});
  EXPECT_EQ(RunBench(chunk).code, 2);
  std::vector<std::string> links = {STRAIT_BENCH_BINARY};
  const std::vector<std::string> common = Common("int8");
  links.insert(links.end(), common.begin(), common.end());
  links.insert(links.end(), {"--collnet", STRAIT_PLUGIN_BINARY, "--region-links", "udp"});
  const auto l = strait::test::RunCaptured(links);
  EXPECT_EQ(l.code, 2);
  EXPECT_NE(l.err.find("--region-links"), std::string::npos) << l.err;
  // Plain region links beside plain links between regions: refused before anything starts.
  links.back() = "plain";
  const auto p = strait::test::RunCaptured(links);
  EXPECT_EQ(p.code, 2);
  EXPECT_NE(p.err.find("--region-links: plain needs TLS gateway links"), std::string::npos)
      << p.err;
}
#endif

}  // namespace

// --link-trace records the emulated links, so it is refused where nothing is emulated, with a
// message that says so.
TEST(AllReduceBench, LinkTraceNeedsEmulatedLinks) {
  std::vector<std::string> argv = {STRAIT_BENCH_BINARY, "allreduce", "--loopback",
                                   "--link-trace", "/tmp/strait-link-trace-unused.csv"};
  const auto loopback = strait::test::RunCaptured(argv);
  EXPECT_EQ(loopback.code, 2) << loopback.out << loopback.err;
  EXPECT_NE(loopback.err.find("--link-trace"), std::string::npos) << loopback.err;
  EXPECT_NE(loopback.err.find("emulated"), std::string::npos) << loopback.err;
}

// On emulated links (strait-wanem: root), --json gives every directed pair's delivered bytes,
// drops by cause and backlog, and --link-trace a CSV of the same counters through the run; a
// trace path it cannot write is refused before anything starts.
TEST(AllReduceBench, EmulatedRunReportsEveryDirectedPairAndTracesIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "strait-wanem needs root";
  const auto unwritable = strait::test::RunCaptured(
      {STRAIT_BENCH_BINARY, "allreduce", "--link-trace", "/nonexistent-dir/trace.csv"});
  EXPECT_EQ(unwritable.code, 2) << unwritable.out << unwritable.err;
  EXPECT_NE(unwritable.err.find("cannot write '/nonexistent-dir/trace.csv'"), std::string::npos)
      << unwritable.err;
  char dir[] = "/tmp/strait-trace-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string trace = std::string(dir) + "/links.csv";
  const auto r = RunBench({"allreduce", "--regions", "2", "--ranks-per-region", "1", "--size",
                           "1MiB", "--iters", "2", "--codec", "int8", "--link",
                           "100mbit,5ms", "--straitd", STRAITD_BINARY, "--timeout", "30",
                           "--link-trace", trace, "--json"});
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["emulated"], true) << j;
  const auto& run = j["runs"][0];
  ASSERT_EQ(run["link_pairs"].size(), 2u) << run;
  uint64_t drops = 0;
  uint64_t json_delivered[2] = {0, 0};
  for (const auto& p : run["link_pairs"]) {
    const int src = p["src"].get<int>();
    EXPECT_EQ(p["dst"].get<int>(), 1 - src) << p;
    // The int8 shard one way and its result the other: far more than acks.
    EXPECT_GT(p["delivered_bytes"].get<uint64_t>(), 100'000u) << p;
    // One bandwidth-delay product (100 Mbit/s x 2 x 5 ms), strait-wanem's default.
    EXPECT_EQ(p["queue_limit_bytes"].get<uint64_t>(), 125'000u) << p;
    EXPECT_LE(p["peak_backlog_bytes"].get<uint64_t>(), 125'000u) << p;
    drops += p["drops_queue_full"].get<uint64_t>() + p["drops_lost"].get<uint64_t>() +
             p["drops_policed"].get<uint64_t>();
    json_delivered[src] = p["delivered_bytes"].get<uint64_t>();
  }
  EXPECT_EQ(drops, run["link_drops"].get<uint64_t>()) << run;

  std::ifstream in(trace);
  std::string line;
  ASSERT_TRUE(std::getline(in, line)) << trace << " is empty";
  EXPECT_EQ(line, "run,t_ms,measured,src,dst,delivered_bytes,queue_full,lost,policed,"
                  "backlog_bytes,queue_limit_bytes");
  uint64_t csv_delivered[2] = {0, 0};
  int rows = 0;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) f.push_back(cell);
    ASSERT_EQ(f.size(), 11u) << line;
    ++rows;
    if (f[2] == "1") csv_delivered[std::stoi(f[3])] += std::stoull(f[5]);
  }
  EXPECT_GT(rows, 2) << "a trace of a few samples at least";
  // The CSV's measured rows are the samples overlapping the window the JSON counts from
  // whole samples inside it: never less.
  for (int src = 0; src < 2; ++src) {
    EXPECT_GE(csv_delivered[src], json_delivered[src]) << "pair " << src << ">" << 1 - src;
  }
  std::remove(trace.c_str());
  ::rmdir(dir);
}
