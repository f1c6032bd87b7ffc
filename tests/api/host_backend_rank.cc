// One rank process of host_backend_test: creates a host-backend comm through the C++ wrapper
// (strait.hpp, over libstrait.so), runs every case of host_backend_cases.h plus a count-0 call,
// and writes each result to <outdir>/<job>_c<case>_r<region>_<rank>.bin. Exit 0 when every call
// succeeded; otherwise the failing call and strait_last_error() on stderr, exit 1.
//
// Usage: host_backend_rank REGION_INDEX RANK NRANKS ROOT_ADDRESS GATEWAY JOB COMPRESSION OUTDIR
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "strait/strait.hpp"
#include "tests/api/host_backend_cases.h"

namespace {

int Die(const std::string& what, const strait::Status& s) {
  std::fprintf(stderr, "host_backend_rank: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr,
                 "usage: %s REGION_INDEX RANK NRANKS ROOT_ADDRESS GATEWAY JOB COMPRESSION OUTDIR\n",
                 argv[0]);
    return 2;
  }
  const int region = std::atoi(argv[1]);
  const std::string region_name = "r" + std::to_string(region);
  const std::string job = argv[6];
  const std::string out = argv[8];

  strait::HostConfig cfg;
  cfg.region = region_name.c_str();
  cfg.rank = std::atoi(argv[2]);
  cfg.nranks = std::atoi(argv[3]);
  cfg.root_address = argv[4];
  cfg.gateway = argv[5];
  cfg.job_id = job.c_str();
  cfg.compression = argv[7];
  cfg.timeout_ms = 30000;
  auto comm = strait::Comm::InitHost(cfg);
  if (!comm.ok()) return Die("strait_comm_init_host", comm.status());
  if (comm->rank() != cfg.rank || comm->nranks() != cfg.nranks) {
    std::fprintf(stderr, "host_backend_rank: comm says rank %d of %d\n", comm->rank(),
                 comm->nranks());
    return 1;
  }

  const auto& cases = strait::api::testing::Cases();
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto& k = cases[c];
    std::vector<uint8_t> in = strait::api::testing::InputBytes(region, cfg.rank, c);
    std::vector<uint8_t> result(in.size(), 0xEE);
    void* recv = k.in_place ? in.data() : result.data();
    strait::Status s =
        comm->AllReduce(in.data(), recv, k.count, k.dtype, k.op, k.key != nullptr ? k.key : "");
    if (!s.ok()) return Die("case " + std::to_string(c), s);
    if (k.in_place) result = in;
    const std::string path = out + "/" + job + "_c" + std::to_string(c) + "_r" +
                             std::to_string(region) + "_" + std::to_string(cfg.rank) + ".bin";
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(result.data()),
            static_cast<std::streamsize>(result.size()));
    if (!f.good()) return Die("writing " + path, strait::Status(strait::StatusCode::kUnknown, ""));
    // A count-0 all-reduce between cases is a no-op on every rank (NULL buffers allowed).
    strait::Status zero = comm->AllReduce(nullptr, nullptr, 0, STRAIT_FLOAT32, STRAIT_SUM);
    if (!zero.ok()) return Die("count-0 all-reduce", zero);
  }
  strait::Status d = comm->Destroy();
  if (!d.ok()) return Die("strait_comm_destroy", d);
  std::printf("host_backend_rank r%d/%d: %zu all-reduces done\n", region, cfg.rank, cases.size());
  return 0;
}
