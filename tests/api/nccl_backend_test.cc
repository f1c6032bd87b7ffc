// Library mode's GPU backend (strait_comm_init_nccl, lib/api/nccl_backend.h) end to end on one
// GPU: two regions ("us", "eu") x two ranks, each rank a process (this binary, re-run with
// "rank ...") with its own NCCL_HOSTID so that NCCL accepts four processes on GPU 0 (it then
// talks between them over its Socket transport on loopback); a region-local NCCL communicator per
// region (the unique id passed through a file); one straitd per rank on 127.0.0.1 (plain TCP,
// configs as in tests/plugins/collnet_test.cc), shard_index = the NCCL rank. Every rank
// all-reduces fp32 sums through libstrait.so on a stream, under "int8,ef" (the GPU quantizer,
// error feedback on the device, frames through the gateway; a tensor too small to go lossy takes
// the refused-frame fallback) and "none" (the raw path): results bit-identical on the four ranks,
// exact for "none" (the inputs are multiples of 1/256, so every fp32 sum is exact) and within the
// int8 error bound otherwise; counts not divisible by the region size (padding) included. Also:
// argument errors with a live NCCL comm. Label `gpu`: skips itself without a CUDA device.
#include <arpa/inet.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "strait/strait.h"
#include "tests/common/free_ports.h"

extern char** environ;

namespace {

constexpr int kRegions = 2;
constexpr int kRanks = 2;  // per region
constexpr int kNodes = kRegions * kRanks;
const char* const kRegionNames[kRegions] = {"us", "eu"};
// Odd (padded shards), divisible by the region size, and too small for the lossy path (8 bytes
// per shard, below min_lossy_bytes: the gateway refuses the frame and the fallback runs).
const size_t kCounts[] = {100003, 8192, 3};
constexpr int kSteps = 3;

// Node n's input: multiples of 1/256 in [-3.9, 3.9], so that sums of four are exact in fp32.
float Input(int node, size_t i) {
  const auto v = static_cast<int64_t>((uint64_t(node) * 7919 + i * 104729) % 2001) - 1000;
  return static_cast<float>(v) / 256.0f;
}

std::string NodeName(int node) {
  return std::string(kRegionNames[node / kRanks]) + std::to_string(node % kRanks);
}

// ---- the rank process -----------------------------------------------------------------------

int Die(const std::string& what) {
  std::fprintf(stderr, "RANK FAILED: %s\n", what.c_str());
  return 1;
}

// argv: rank <node> <dir> <job> <compression> <gateway socket>
int RunRank(int node, const std::string& dir, const std::string& job,
            const std::string& compression, const std::string& socket) {
  const int region = node / kRanks;
  const int rank = node % kRanks;
  if (cudaSetDevice(0) != cudaSuccess) return Die("cudaSetDevice(0)");
  // The region's unique id: rank 0 creates it, the others read it (written whole by a rename).
  ncclUniqueId id{};
  const std::string id_file = dir + "/id-" + job + "-" + kRegionNames[region];
  if (rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) return Die("ncclGetUniqueId");
    std::ofstream(id_file + ".tmp", std::ios::binary).write(id.internal, sizeof(id.internal));
    if (std::rename((id_file + ".tmp").c_str(), id_file.c_str()) != 0) return Die("rename");
  } else {
    std::ifstream in;
    for (int i = 0; i < 600; ++i) {
      in.open(id_file, std::ios::binary);
      if (in) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polls for a file, no WAN
    }
    if (!in.read(id.internal, sizeof(id.internal))) return Die("no unique id in " + id_file);
  }
  ncclComm_t nccl = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&nccl, kRanks, id, rank); r != ncclSuccess) {
    return Die(std::string("ncclCommInitRank: ") + ncclGetErrorString(r));
  }
  strait_comm_t comm = nullptr;
  if (strait_comm_init_nccl(&comm, nccl, kRegionNames[region], socket.c_str(), job.c_str(),
                            compression.c_str()) != STRAIT_SUCCESS) {
    return Die(std::string("strait_comm_init_nccl: ") + strait_last_error());
  }
  int r = -1, m = -1;
  if (strait_comm_rank(comm, &r, &m) != STRAIT_SUCCESS || r != rank || m != kRanks) {
    return Die("strait_comm_rank gives " + std::to_string(r) + "/" + std::to_string(m));
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) return Die("cudaStreamCreate");
  float* dev = nullptr;
  if (cudaMalloc(&dev, kCounts[0] * sizeof(float)) != cudaSuccess) return Die("cudaMalloc");
  // Bad arguments with a live NCCL comm: rejected before anything is enqueued.
  if (strait_allreduce(dev, dev, 4, static_cast<strait_datatype_t>(99), STRAIT_SUM, comm, stream) !=
          STRAIT_ERROR_INVALID_ARGUMENT ||
      std::strstr(strait_last_error(), "dtype 99") == nullptr) {
    return Die(std::string("bad dtype not rejected: ") + strait_last_error());
  }
  if (strait_allreduce(dev, dev + 1, 4, STRAIT_FLOAT32, STRAIT_SUM, comm, stream) !=
      STRAIT_ERROR_INVALID_ARGUMENT) {
    return Die("overlapping buffers not rejected");
  }
  std::ofstream out(dir + "/out-" + job + "-" + std::to_string(node) + ".bin", std::ios::binary);
  std::vector<float> host;
  for (size_t count : kCounts) {
    host.resize(count);
    const std::string key = "grad" + std::to_string(count);
    for (int step = 0; step < kSteps; ++step) {
      for (size_t i = 0; i < count; ++i) host[i] = Input(node, i);
      if (cudaMemcpyAsync(dev, host.data(), count * sizeof(float), cudaMemcpyHostToDevice,
                          stream) != cudaSuccess) {
        return Die("cudaMemcpyAsync in");
      }
      if (strait_allreduce_keyed(dev, dev, count, STRAIT_FLOAT32, STRAIT_SUM, key.c_str(), comm,
                                 stream) != STRAIT_SUCCESS) {
        return Die("strait_allreduce_keyed " + key + ": " + strait_last_error());
      }
      if (cudaMemcpyAsync(host.data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost,
                          stream) != cudaSuccess ||
          cudaStreamSynchronize(stream) != cudaSuccess) {
        return Die("cudaMemcpyAsync out");
      }
    }
    out.write(reinterpret_cast<const char*>(host.data()),
              static_cast<std::streamsize>(count * sizeof(float)));
  }
  out.close();
  // A failure of the worker shows at the next call: an empty all-reduce asks for it.
  if (strait_allreduce(dev, dev, 0, STRAIT_FLOAT32, STRAIT_SUM, comm, stream) != STRAIT_SUCCESS) {
    return Die(std::string("after the steps: ") + strait_last_error());
  }
  if (strait_comm_destroy(comm) != STRAIT_SUCCESS) {
    return Die(std::string("strait_comm_destroy: ") + strait_last_error());
  }
  (void)cudaFree(dev);
  (void)cudaStreamDestroy(stream);
  (void)ncclCommDestroy(nccl);
  std::printf("RANK OK\n");
  return 0;
}

// ---- the test -------------------------------------------------------------------------------

std::string g_self;  // this binary

bool HaveDevice(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    *why = std::string("no CUDA device (") +
           (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") +
           "): the GPU backend's end-to-end test needs one";
    return false;
  }
  return true;
}

using strait::test::FreePorts;

pid_t Spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
            const std::string& log) {
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "STRAIT_", 7) != 0 && std::strncmp(*e, "NCCL_", 5) != 0) {
      envs.emplace_back(*e);
    }
  }
  envs.insert(envs.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> a = args;
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, a[0].c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class NcclBackend : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!HaveDevice(&why_)) return;
    char tmpl[] = "/tmp/strait-nccl-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const std::vector<uint16_t> ports = FreePorts(kNodes);
    std::string peers;
    for (int r = 0; r < kRegions; ++r) {
      peers += "[peers." + std::string(kRegionNames[r]) + "]\n";
      for (int i = 0; i < kRanks; ++i) {
        peers += "shard_" + std::to_string(i) +
                 " = \"127.0.0.1:" + std::to_string(ports[size_t(r * kRanks + i)]) + "\"\n";
      }
    }
    for (int node = 0; node < kNodes; ++node) {
      std::string c = "region = \"" + std::string(kRegionNames[node / kRanks]) +
                      "\"\nshard_index = " + std::to_string(node % kRanks) + "\n";
      c += "[local]\nsocket = \"" + Socket(node) + "\"\nallowed_uids = [" +
           std::to_string(::getuid()) + "]\n";
      c += "[wan]\nlisten = \"127.0.0.1:" + std::to_string(ports[size_t(node)]) +
           "\"\ntransport = \"plain\"\n";
      c += peers;
      c += "[link]\nstreams = 2\nadapt_streams = false\nunreachable_after = \"10s\"\n";
      c += "[policy]\nmin_lossy_bytes = \"4KiB\"\n";
      c += "[allreduce]\ndeadline = \"20s\"\nshutdown_grace = \"2s\"\n";
      const std::string file = dir_ + "/" + NodeName(node) + ".toml";
      std::ofstream(file) << c;
      const pid_t pid =
          Spawn({STRAITD_PATH, "--config", file}, {}, dir_ + "/straitd-" + NodeName(node) + ".log");
      ASSERT_GT(pid, 0) << "cannot start " << STRAITD_PATH;
      daemons_.push_back(pid);
    }
    for (int node = 0; node < kNodes; ++node) {
      struct stat st {};
      for (int i = 0; i < 200 && ::stat(Socket(node).c_str(), &st) != 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // waits for startup
      }
      ASSERT_EQ(::stat(Socket(node).c_str(), &st), 0)
          << "straitd " << NodeName(node) << " did not create its socket: "
          << ReadFile(dir_ + "/straitd-" + NodeName(node) + ".log");
    }
  }

  static void TearDownTestSuite() {
    for (pid_t pid : daemons_) ::kill(pid, SIGKILL);
    for (pid_t pid : daemons_) ::waitpid(pid, nullptr, 0);
    daemons_.clear();
    if (!dir_.empty()) {
      const std::string cmd = "rm -rf '" + dir_ + "'";
      EXPECT_EQ(std::system(cmd.c_str()), 0);
    }
  }

  void SetUp() override {
    if (!why_.empty()) GTEST_SKIP() << why_;
  }

  static std::string Socket(int node) { return dir_ + "/" + NodeName(node) + ".sock"; }

  // Runs the four ranks under `compression`; returns each rank's results (empty on failure).
  static std::vector<std::vector<float>> RunRanks(const std::string& job,
                                                  const std::string& compression) {
    std::vector<pid_t> pids;
    for (int node = 0; node < kNodes; ++node) {
      const std::vector<std::string> env = {
          "NCCL_HOSTID=strait-nccl-test-" + job + "-" + NodeName(node),
          "NCCL_SOCKET_IFNAME=lo",
          "NCCL_NET=Socket",
          "NCCL_NET_PLUGIN=none",
          "NCCL_IB_DISABLE=1",
          "NCCL_DEBUG=WARN"};
      const pid_t pid =
          Spawn({g_self, "rank", std::to_string(node), dir_, job, compression, Socket(node)}, env,
                Log(job, node));
      EXPECT_GT(pid, 0);
      pids.push_back(pid);
    }
    std::vector<int> codes(kNodes, -1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    for (int node = 0; node < kNodes; ++node) {
      int status = 0;
      while (::waitpid(pids[size_t(node)], &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > until) {
          ::kill(pids[size_t(node)], SIGKILL);
          ::waitpid(pids[size_t(node)], &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polls a child
      }
      codes[size_t(node)] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::vector<std::vector<float>> results;
    for (int node = 0; node < kNodes; ++node) {
      EXPECT_EQ(codes[size_t(node)], 0) << NodeName(node) << " (" << compression << "):\n"
                                        << ReadFile(Log(job, node));
      const std::string bytes =
          ReadFile(dir_ + "/out-" + job + "-" + std::to_string(node) + ".bin");
      std::vector<float> v(bytes.size() / sizeof(float));
      std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
      results.push_back(std::move(v));
    }
    return results;
  }

  static std::string Log(const std::string& job, int node) {
    return dir_ + "/rank-" + job + "-" + std::to_string(node) + ".log";
  }

  // Checks bit-identity across ranks and the error against the exact sum, per tensor.
  static void Check(const std::vector<std::vector<float>>& results, double rel_bound,
                    const std::string& what) {
    size_t total = 0;
    for (size_t count : kCounts) total += count;
    ASSERT_EQ(results.size(), size_t(kNodes));
    for (int node = 0; node < kNodes; ++node) {
      ASSERT_EQ(results[size_t(node)].size(), total) << NodeName(node) << " " << what;
      EXPECT_EQ(std::memcmp(results[0].data(), results[size_t(node)].data(), total * sizeof(float)),
                0)
          << NodeName(node) << " differs from " << NodeName(0) << " (" << what << ")";
    }
    size_t at = 0;
    for (size_t count : kCounts) {
      double max_ref = 0, max_err = 0;
      for (size_t i = 0; i < count; ++i) {
        double ref = 0;
        for (int node = 0; node < kNodes; ++node) ref += Input(node, i);
        max_ref = std::max(max_ref, std::fabs(ref));
        max_err = std::max(max_err, std::fabs(double(results[0][at + i]) - ref));
      }
      EXPECT_LE(max_err, rel_bound * max_ref) << what << ", " << count << " elements: max error "
                                              << max_err << " for max |ref| " << max_ref;
      at += count;
    }
  }

  static inline std::string why_;
  static inline std::string dir_;
  static inline std::vector<pid_t> daemons_;
};

TEST_F(NcclBackend, LosslessIsExactAndBitIdentical) {
  Check(RunRanks("job-none", "none"), 0.0, "none");
}

TEST_F(NcclBackend, Int8WithErrorFeedbackIsBitIdenticalAndWithinTheBound) {
  // Three int8 roundings at most (each rank's shard, then the owner's sum): each within half a
  // step of its block's maximum / 127, and a block's maximum is at most the tensor's.
  Check(RunRanks("job-int8", "int8,ef"), 3.0 / 127.0, "int8,ef");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 7 && std::strcmp(argv[1], "rank") == 0) {
    return RunRank(std::atoi(argv[2]), argv[3], argv[4], argv[5], argv[6]);
  }
  g_self = "/proc/self/exe";
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n > 0) g_self.assign(path, size_t(n));
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
