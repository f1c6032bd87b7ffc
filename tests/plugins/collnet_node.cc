// One node head of the CollNet tests: loads libnccl-net-strait.so with dlopen and drives one of
// its CollNet tables (v11, v10 or v8) the way NCCL's proxy thread does, against the straitd named
// by STRAIT_GATEWAY (the parent sets the STRAIT_* environment).
//
//   collnet_node PLUGIN.so VERSION MODE RESULT_FILE
// Protocol with the parent on stdin/stdout: the node prints "HANDLE <hex>" (its listen handle),
// or "LISTEN-FAILED <ncclResult_t>" and exits 0; then reads "GROUP <rank> <nranks> <hex>..." (every
// head's handle in rank order), connects, prints "CONNECTED" or "CONNECT-FAILED <ncclResult_t>"
// (and exits 0), runs MODE, writes every result's bytes to RESULT_FILE and prints "OK". Every WARN
// the plugin logs is echoed as "WARN <text>". MODE:
//   all     reduceSupport for every pair; every type x op (sum, prod, max, min) with odd counts,
//           all posted before the first test(), checked element by element against a reference
//           computed from every head's inputs; the request cap (NULL request, then retry); a
//           close with requests in flight
//   small   a few types and ops (for the older table versions)
//   pieces  (one head, against a gateway that echoes) a float32 sum of 16 MiB + 3 elements, more
//           than one region all-reduce carries: the result is the input (a group of one)
//   fail    (one head, against a gateway that drops the connection at the first operation after
//           the barrier) the operation's request fails with ncclRemoteError, the next iallreduce
//           fails at once, and closeColl still succeeds
//   lossy   float32/bfloat16/float16 sums under a lossy policy (within the codec's error bound)
//           and an int32 sum that must stay exact
//   threads (one head, against a gateway that echoes) opens 3 more comms (a group of one each),
//           posts 16 requests on each of the 4 and counts the process's threads while they are
//           in flight: "THREADS <after init> <with 4 comms busy>"; the counts must be equal
//   killed  posts one request, prints "POSTED" and polls test() until it fails: "TEST-FAILED
//           <ncclResult_t> <ms since POSTED>" (the parent kills the head's straitd meanwhile)
//   stall   prints "STALLING", posts nothing and waits for stdin to close (its region's part of
//           the other heads' operations never comes)
// Exit status 0 means every check passed; failures are explained on stderr.
#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "plugins/nccl/nccl_net.h"

namespace {

int g_rank = -1;
int g_version = 11;
void* g_ctx = nullptr;
int g_threads_after_init = 0;
const ncclCollNet_v11_t* g_v11 = nullptr;
const ncclCollNet_v10_t* g_v10 = nullptr;
const ncclCollNet_v8_t* g_v8 = nullptr;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "collnet node %d: FAIL %s\n", g_rank, why.c_str());
  std::exit(1);
}

void Logger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  if (level != NCCL_LOG_WARN) return;
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::printf("WARN %s\n", buf);
  std::fflush(stdout);
}

std::string Hex(const unsigned char* data, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += kDigits[data[i] >> 4];
    s += kDigits[data[i] & 0xf];
  }
  return s;
}

std::vector<unsigned char> Unhex(const std::string& s) {
  if (s.size() != 2 * kNcclNetHandleMaxSize) Die("bad handle from the parent: " + s);
  std::vector<unsigned char> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<unsigned char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

// ---- the table, whatever its version ----
ncclResult_t Init(void** ctx) {
  if (g_version == 11) return g_v11->init(ctx, 42, Logger);
  if (g_version == 10) return g_v10->init(Logger);
  return g_v8->init(Logger);
}
// v11 only (v8 and v10 have no finalize); init's context is given back.
void Finalize(void* ctx) {
  if (g_version == 11 && g_v11->finalize(ctx) != ncclSuccess) Die("finalize failed");
}
ncclResult_t Devices(int* n) {
  return g_version == 11   ? g_v11->devices(n)
         : g_version == 10 ? g_v10->devices(n)
                           : g_v8->devices(n);
}
ncclResult_t Listen(void* ctx, void* handle, void** lc) {
  if (g_version == 11) return g_v11->listen(ctx, 0, handle, lc);
  if (g_version == 10) return g_v10->listen(0, handle, lc);
  return g_v8->listen(0, handle, lc);
}
ncclResult_t Connect(void** handles, int n, int rank, void* lc, void** comm) {
  if (g_version == 11) return g_v11->connect(handles, n, rank, lc, comm);
  if (g_version == 10) return g_v10->connect(handles, n, rank, lc, comm);
  return g_v8->connect(handles, n, rank, lc, comm);
}
ncclResult_t ReduceSupport(int dtype, int op, int* supported) {
  const auto t = static_cast<ncclDataType_t>(dtype);
  const auto o = static_cast<ncclRedOp_t>(op);
  if (g_version == 11) return g_v11->reduceSupport(t, o, supported);
  if (g_version == 10) return g_v10->reduceSupport(t, o, supported);
  return g_v8->reduceSupport(t, o, supported);
}
ncclResult_t Iallreduce(void* comm, const void* send, void* recv, size_t count, int dtype, int op,
                        void** request) {
  const auto t = static_cast<ncclDataType_t>(dtype);
  const auto o = static_cast<ncclRedOp_t>(op);
  void* s = const_cast<void*>(send);
  if (g_version == 11)
    return g_v11->iallreduce(comm, s, recv, count, t, o, nullptr, nullptr, request);
  if (g_version == 10)
    return g_v10->iallreduce(comm, s, recv, count, t, o, nullptr, nullptr, request);
  return g_v8->iallreduce(comm, s, recv, static_cast<int>(count), t, o, nullptr, nullptr, request);
}
ncclResult_t Test(void* request, int* done, int* size) {
  return g_version == 11   ? g_v11->test(request, done, size)
         : g_version == 10 ? g_v10->test(request, done, size)
                           : g_v8->test(request, done, size);
}
ncclResult_t CloseColl(void* comm) {
  return g_version == 11   ? g_v11->closeColl(comm)
         : g_version == 10 ? g_v10->closeColl(comm)
                           : g_v8->closeColl(comm);
}
ncclResult_t CloseListen(void* lc) {
  return g_version == 11   ? g_v11->closeListen(lc)
         : g_version == 10 ? g_v10->closeListen(lc)
                           : g_v8->closeListen(lc);
}
ncclResult_t RegMr(void* comm, void* data, size_t size, void** mh) {
  return g_version == 11   ? g_v11->regMr(comm, data, size, kNcclPtrHost, mh)
         : g_version == 10 ? g_v10->regMr(comm, data, size, kNcclPtrHost, mh)
                           : g_v8->regMr(comm, data, size, kNcclPtrHost, mh);
}
ncclResult_t DeregMr(void* comm, void* mh) {
  return g_version == 11   ? g_v11->deregMr(comm, mh)
         : g_version == 10 ? g_v10->deregMr(comm, mh)
                           : g_v8->deregMr(comm, mh);
}
ncclResult_t Iflush(void* comm, void* data, void** request) {
  return g_version == 11   ? g_v11->iflush(comm, data, 0, nullptr, request)
         : g_version == 10 ? g_v10->iflush(comm, data, 0, nullptr, request)
                           : g_v8->iflush(comm, data, 0, nullptr, request);
}

// ---- element types: encoding exact values, and the reference ----
size_t ElemSize(int dtype) {
  static const size_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return kSizes[dtype];
}
bool IsInt(int dtype) {
  return dtype <= ncclUint64;
}
bool IsSigned(int dtype) {
  return dtype == ncclInt8 || dtype == ncclInt32 || dtype == ncclInt64;
}

// Bits of a small float format (sign, `ebits` exponent bits, `mbits` mantissa bits, IEEE-style
// bias) for a value it represents exactly (the tests only use such values). 0 -> +0.
uint64_t EncodeMini(double v, int ebits, int mbits) {
  if (v == 0) return 0;
  const uint64_t sign = v < 0 ? 1 : 0;
  double a = std::fabs(v);
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int bias = (1 << (ebits - 1)) - 1;
  const int exp_field = e - 1 + bias;
  const double frac = m * 2 - 1;  // in [0, 1)
  const double scaled = frac * static_cast<double>(1 << mbits);
  if (exp_field <= 0 || scaled != std::floor(scaled)) Die("value not exact in a mini float");
  return (sign << (ebits + mbits)) | (uint64_t(exp_field) << mbits) | uint64_t(scaled);
}
double DecodeMini(uint64_t bits, int ebits, int mbits) {
  const uint64_t sign = (bits >> (ebits + mbits)) & 1;
  const int exp_field = static_cast<int>((bits >> mbits) & ((1u << ebits) - 1));
  const uint64_t mant = bits & ((uint64_t{1} << mbits) - 1);
  const int bias = (1 << (ebits - 1)) - 1;
  double v = 0;
  if (exp_field == 0) {
    v = std::ldexp(static_cast<double>(mant), 1 - bias - mbits);
  } else {
    v = std::ldexp(1.0 + static_cast<double>(mant) / static_cast<double>(uint64_t{1} << mbits),
                   exp_field - bias);
  }
  return sign ? -v : v;
}

void StoreFloat(int dtype, double v, unsigned char* out) {
  switch (dtype) {
    case ncclFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(out, &f, 4);
      return;
    }
    case ncclFloat64: std::memcpy(out, &v, 8); return;
    case ncclFloat16: {
      const uint16_t b = static_cast<uint16_t>(EncodeMini(v, 5, 10));
      std::memcpy(out, &b, 2);
      return;
    }
    case ncclBfloat16: {
      const uint16_t b = static_cast<uint16_t>(EncodeMini(v, 8, 7));
      std::memcpy(out, &b, 2);
      return;
    }
    case ncclFloat8e4m3: out[0] = static_cast<unsigned char>(EncodeMini(v, 4, 3)); return;
    case ncclFloat8e5m2: out[0] = static_cast<unsigned char>(EncodeMini(v, 5, 2)); return;
  }
  Die("not a float type");
}
double LoadFloat(int dtype, const unsigned char* in) {
  switch (dtype) {
    case ncclFloat32: {
      float f;
      std::memcpy(&f, in, 4);
      return f;
    }
    case ncclFloat64: {
      double d;
      std::memcpy(&d, in, 8);
      return d;
    }
    case ncclFloat16: return DecodeMini(uint64_t(in[0]) | uint64_t(in[1]) << 8, 5, 10);
    case ncclBfloat16: return DecodeMini(uint64_t(in[0]) | uint64_t(in[1]) << 8, 8, 7);
    case ncclFloat8e4m3: return DecodeMini(in[0], 4, 3);
    case ncclFloat8e5m2: return DecodeMini(in[0], 5, 2);
  }
  Die("not a float type");
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Head `rank`'s input for operation `seed`: integers anywhere in their range (sums and products
// wrap identically in any order); floats small integers whose every partial sum and product is
// exact in the type (sums of [-2, 2] stay within 8; products of +-1, +-2 are powers of two), so
// the reference does not depend on the order straitd reduces in.
std::vector<unsigned char> Input(int rank, uint64_t seed, int dtype, int op, size_t count) {
  const size_t es = ElemSize(dtype);
  std::vector<unsigned char> v(count * es);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t r = Mix(Mix(seed * 1000003 + uint64_t(rank)) ^ i);
    if (IsInt(dtype)) {
      std::memcpy(&v[i * es], &r, es);
    } else {
      static const double kProd[] = {-2, -1, 1, 2};
      const double x = op == ncclProd ? kProd[r % 4] : static_cast<double>(int(r % 5) - 2);
      StoreFloat(dtype, x, &v[i * es]);
    }
  }
  return v;
}

std::vector<unsigned char> Reference(int nranks, uint64_t seed, int dtype, int op, size_t count) {
  const size_t es = ElemSize(dtype);
  std::vector<std::vector<unsigned char>> in;
  for (int r = 0; r < nranks; ++r) in.push_back(Input(r, seed, dtype, op, count));
  std::vector<unsigned char> out(count * es);
  const int shift = int(64 - 8 * es);
  for (size_t i = 0; i < count; ++i) {
    if (IsInt(dtype)) {
      uint64_t acc = 0;
      for (int r = 0; r < nranks; ++r) {
        uint64_t x = 0;
        std::memcpy(&x, &in[size_t(r)][i * es], es);
        if (r == 0) {
          acc = x;
          continue;
        }
        // Compare in the element's own signedness: sign-extend signed types.
        const int64_t sa = static_cast<int64_t>(acc << shift) >> shift;
        const int64_t sx = static_cast<int64_t>(x << shift) >> shift;
        const bool x_less = IsSigned(dtype) ? sx < sa : (x << shift) < (acc << shift);
        switch (op) {
          case ncclSum: acc = acc + x; break;
          case ncclProd: acc = acc * x; break;
          case ncclMax: acc = x_less ? acc : x; break;
          case ncclMin: acc = x_less ? x : acc; break;
        }
      }
      std::memcpy(&out[i * es], &acc, es);  // little-endian: the low bytes
    } else {
      double acc = 0;
      for (int r = 0; r < nranks; ++r) {
        const double x = LoadFloat(dtype, &in[size_t(r)][i * es]);
        if (r == 0) {
          acc = x;
          continue;
        }
        switch (op) {
          case ncclSum: acc += x; break;
          case ncclProd: acc *= x; break;
          case ncclMax: acc = std::max(acc, x); break;
          case ncclMin: acc = std::min(acc, x); break;
        }
      }
      StoreFloat(dtype, acc, &out[i * es]);
    }
  }
  return out;
}

void* Post(void* comm, const void* send, void* recv, size_t count, int dtype, int op) {
  void* req = nullptr;
  for (long i = 0; req == nullptr; ++i) {
    const ncclResult_t r = Iallreduce(comm, send, recv, count, dtype, op, &req);
    if (r != ncclSuccess) Die("iallreduce returned " + std::to_string(r));
    if (i > 100000000) Die("iallreduce never accepted the request");
  }
  return req;
}

void Wait(void* req, int expect_size, const std::string& what) {
  int done = 0;
  int size = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (true) {
    const ncclResult_t r = Test(req, &done, &size);
    if (r != ncclSuccess) Die(what + ": test returned " + std::to_string(r));
    if (done) break;
    if (std::chrono::steady_clock::now() > deadline) Die(what + ": not done after 60 s");
    ::usleep(200);  // NCCL's proxy spins; here the gateways need the two CPUs more
  }
  if (size != expect_size) {
    Die(what + ": test reported " + std::to_string(size) + " bytes, expected " +
        std::to_string(expect_size));
  }
}

const char* kTypeNames[] = {"int8",    "uint8",   "int32",   "uint32",   "int64",   "uint64",
                            "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
const char* kOpNames[] = {"sum", "prod", "max", "min", "avg"};

struct Op {
  int dtype;
  int op;
  size_t count;
  uint64_t seed;
  bool in_place;
  std::vector<unsigned char> send, recv;
  void* req = nullptr;
};

// Posts every op before testing any (several in flight), then checks each against the reference.
void RunOps(void* comm, int nranks, std::vector<Op>& ops, std::ofstream& results) {
  for (Op& o : ops) {
    o.send = Input(g_rank, o.seed, o.dtype, o.op, o.count);
    if (o.in_place) {
      o.req = Post(comm, o.send.data(), o.send.data(), o.count, o.dtype, o.op);
    } else {
      o.recv.assign(o.send.size(), 0xAB);
      o.req = Post(comm, o.send.data(), o.recv.data(), o.count, o.dtype, o.op);
    }
  }
  for (Op& o : ops) {
    const std::string what =
        std::string(kTypeNames[o.dtype]) + " " + kOpNames[o.op] + " x" + std::to_string(o.count);
    Wait(o.req, static_cast<int>(o.send.size()), what);
    const std::vector<unsigned char>& got = o.in_place ? o.send : o.recv;
    const std::vector<unsigned char> want = Reference(nranks, o.seed, o.dtype, o.op, o.count);
    if (got != want) {
      const size_t es = ElemSize(o.dtype);
      size_t i = 0;
      while (std::memcmp(&got[i * es], &want[i * es], es) == 0) ++i;
      Die(what + ": element " + std::to_string(i) + " differs from the reference (got " +
          Hex(&got[i * es], es) + ", want " + Hex(&want[i * es], es) + ")");
    }
    results.write(reinterpret_cast<const char*>(got.data()), std::streamsize(got.size()));
  }
}

// Ends with the comm closed (*comm = nullptr): the close happens with requests in flight, whose
// buffers must stay alive until closeColl returns.
void ModeAll(void** comm_ptr, int nranks, std::ofstream& results) {
  void* comm = *comm_ptr;
  for (int t = 0; t < ncclNumTypes; ++t) {
    for (int op = 0; op <= ncclAvg; ++op) {
      int supported = -1;
      if (ReduceSupport(t, op, &supported) != ncclSuccess) Die("reduceSupport failed");
      if (supported != (op == ncclAvg ? 0 : 1)) {
        Die(std::string("reduceSupport(") + kTypeNames[t] + ", " + kOpNames[op] +
            ") = " + std::to_string(supported));
      }
    }
  }
  int supported = -1;
  if (ReduceSupport(ncclNumTypes, ncclSum, &supported) != ncclSuccess || supported != 0) {
    Die("reduceSupport claims an unknown data type");
  }
  std::vector<Op> ops;
  uint64_t seed = 1;
  for (int t = 0; t < ncclNumTypes; ++t) {
    for (int op = 0; op < ncclAvg; ++op) {
      ops.push_back({t, op, 1001 + 2 * size_t(seed), seed, seed % 3 == 0, {}, {}});
      ++seed;
    }
  }
  RunOps(comm, nranks, ops, results);  // 48 operations in flight at once

  // An unsupported op fails at once (no request) and does not break the comm.
  void* req = nullptr;
  float x = 1;
  if (Iallreduce(comm, &x, &x, 1, ncclFloat32, ncclAvg, &req) == ncclSuccess || req != nullptr) {
    Die("iallreduce accepted avg");
  }

  // The request cap: 64 outstanding, the 65th gets NULL (retry); then they all complete.
  std::vector<int32_t> one(65, 1);
  std::vector<void*> reqs;
  for (int i = 0; i < 65; ++i) {
    req = nullptr;
    if (Iallreduce(comm, &one[size_t(i)], &one[size_t(i)], 1, ncclInt32, ncclSum, &req) !=
        ncclSuccess) {
      Die("iallreduce of the cap test failed");
    }
    if (i < 64 && req == nullptr) Die("request " + std::to_string(i) + " refused below the cap");
    if (i == 64 && req != nullptr) Die("a 65th outstanding request was accepted");
    if (req != nullptr) reqs.push_back(req);
  }
  for (void* r : reqs) Wait(r, 4, "cap test");
  for (int i = 0; i < 64; ++i) {
    if (one[size_t(i)] != nranks) Die("cap test sum " + std::to_string(one[size_t(i)]));
  }

  // Memory registration and flush: host memory, accepted; iflush completes at once.
  void* mh = nullptr;
  if (RegMr(comm, one.data(), 64, &mh) != ncclSuccess || mh == nullptr) Die("regMr failed");
  void* flush = nullptr;
  if (Iflush(comm, one.data(), &flush) != ncclSuccess || flush == nullptr) Die("iflush failed");
  int done = 0;
  if (Test(flush, &done, nullptr) != ncclSuccess || !done) Die("iflush not done at once");
  if (DeregMr(comm, mh) != ncclSuccess) Die("deregMr failed");

  // Close with requests in flight: closeColl stops the workers and frees the requests.
  std::vector<std::vector<float>> pending(4, std::vector<float>(4099, 1.0f));
  for (auto& p : pending) Post(comm, p.data(), p.data(), p.size(), ncclFloat32, ncclSum);
  if (CloseColl(comm) != ncclSuccess) Die("closeColl with requests in flight failed");
  *comm_ptr = nullptr;
}

void ModeSmall(void* comm, int nranks, std::ofstream& results) {
  std::vector<Op> ops = {
      {ncclFloat32, ncclSum, 3001, 101, false, {}, {}},
      {ncclInt64, ncclProd, 777, 102, true, {}, {}},
      {ncclBfloat16, ncclMax, 1025, 103, false, {}, {}},
      {ncclUint8, ncclMin, 33, 104, true, {}, {}},
  };
  RunOps(comm, nranks, ops, results);
}

// Lossy policy: float sums within the codec's bound of the exact sum, and exactly the same bytes
// on every head (the parent compares the files); an int32 sum stays exact.
void ModeLossy(void* comm, int nranks, std::ofstream& results) {
  const size_t n = 8191;  // over the test gateways' min_lossy_bytes for every float type
  for (int dtype : {ncclFloat32, ncclBfloat16, ncclFloat16}) {
    const size_t es = ElemSize(dtype);
    std::vector<std::vector<unsigned char>> in;
    for (int r = 0; r < nranks; ++r) {
      std::vector<unsigned char> v(n * es);
      for (size_t i = 0; i < n; ++i) {
        const double x = std::sin(0.01 * double(i) * double(r + 1)) * 4.0;
        // Round to an exactly representable value of the type first: bfloat16 keeps 8 bits.
        const double q = std::ldexp(std::round(std::ldexp(x, 5)), -5);
        StoreFloat(dtype, q, &v[i * es]);
      }
      in.push_back(v);
    }
    std::vector<unsigned char> data = in[size_t(g_rank)];
    void* req = Post(comm, data.data(), data.data(), n, dtype, ncclSum);
    Wait(req, static_cast<int>(data.size()), std::string("lossy ") + kTypeNames[dtype]);
    for (size_t i = 0; i < n; ++i) {
      double exact = 0;
      for (int r = 0; r < nranks; ++r) exact += LoadFloat(dtype, &in[size_t(r)][i * es]);
      const double got = LoadFloat(dtype, &data[i * es]);
      // Inputs are within +-4, sums within +-16: int8 quantization errs by at most absmax/254
      // per encode (a few encodes), bfloat16 rounding by 1/16 per level; 1.0 is far above both
      // and far below a wrong sum.
      if (std::fabs(got - exact) > 0.25 * double(nranks)) {
        Die(std::string("lossy ") + kTypeNames[dtype] + " element " + std::to_string(i) + ": got " +
            std::to_string(got) + ", exact " + std::to_string(exact));
      }
    }
    results.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
  }
  std::vector<Op> ops = {{ncclInt32, ncclSum, 5001, 201, true, {}, {}}};
  RunOps(comm, nranks, ops, results);
}

void ModePieces(void* comm, std::ofstream& results) {
  const size_t n = (size_t{16} << 20) / 4 + 3;
  std::vector<float> send(n), recv(n, -1.0f);
  for (size_t i = 0; i < n; ++i) send[i] = static_cast<float>(i % 1000);
  void* req = Post(comm, send.data(), recv.data(), n, ncclFloat32, ncclSum);
  Wait(req, static_cast<int>(n * 4), "16 MiB + 3 elements");
  if (recv != send) Die("16 MiB + 3 elements: the result is not the input");
  results.write(reinterpret_cast<const char*>(recv.data()), std::streamsize(n * 4));
}

void ModeFail(void* comm) {
  std::vector<float> data(1000, 1.0f);
  void* req = Post(comm, data.data(), data.data(), data.size(), ncclFloat32, ncclSum);
  int done = 0;
  ncclResult_t r = ncclSuccess;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (r == ncclSuccess && !done) {
    r = Test(req, &done, nullptr);
    if (std::chrono::steady_clock::now() > deadline) Die("the failed operation never ended");
    ::usleep(200);
  }
  if (r != ncclRemoteError) Die("a lost gateway gave test() " + std::to_string(r));
  void* next = nullptr;
  if (Iallreduce(comm, data.data(), data.data(), data.size(), ncclFloat32, ncclSum, &next) ==
      ncclSuccess) {
    Die("iallreduce after a failed operation succeeded");
  }
}

// Threads of this process now (/proc/self/task).
int CountThreads() {
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) Die("cannot open /proc/self/task");
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

void ModeThreads(void* comm) {
  std::vector<void*> comms = {comm};
  for (int i = 0; i < 3; ++i) {
    unsigned char handle[kNcclNetHandleMaxSize] = {};
    void* lc = nullptr;
    if (Listen(g_ctx, handle, &lc) != ncclSuccess) Die("listen of an extra comm failed");
    void* handles[1] = {handle};
    void* c = nullptr;
    if (Connect(handles, 1, 0, lc, &c) != ncclSuccess || c == nullptr) {
      Die("connect of an extra comm failed");
    }
    if (CloseListen(lc) != ncclSuccess) Die("closeListen failed");
    comms.push_back(c);
  }
  constexpr int kPerComm = 16;  // two per slot
  std::vector<std::vector<float>> data(comms.size() * kPerComm, std::vector<float>(4096, 1.5f));
  std::vector<void*> reqs;
  for (size_t i = 0; i < data.size(); ++i) {
    reqs.push_back(Post(comms[i / kPerComm], data[i].data(), data[i].data(), data[i].size(),
                        ncclFloat32, ncclSum));
  }
  const int busy = CountThreads();
  std::printf("THREADS %d %d\n", g_threads_after_init, busy);
  std::fflush(stdout);
  for (size_t i = 0; i < reqs.size(); ++i) {
    Wait(reqs[i], static_cast<int>(data[i].size() * 4), "threads test");
    if (data[i][7] != 1.5f) Die("threads test: the echo changed the data");
  }
  for (size_t i = 1; i < comms.size(); ++i) {
    if (CloseColl(comms[i]) != ncclSuccess) Die("closeColl of an extra comm failed");
  }
}

void ModeKilled(void* comm) {
  std::vector<float> data(100000, 1.0f);
  void* req = Post(comm, data.data(), data.data(), data.size(), ncclFloat32, ncclSum);
  int done = 0;
  if (Test(req, &done, nullptr) != ncclSuccess || done) Die("the request ended before the kill");
  std::printf("POSTED\n");
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  ncclResult_t r = ncclSuccess;
  while (r == ncclSuccess && !done) {
    r = Test(req, &done, nullptr);
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) {
      Die("test() still pending 60 s after POSTED");
    }
    ::usleep(1000);
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  std::printf("TEST-FAILED %d %lld\n", static_cast<int>(r), static_cast<long long>(ms));
  std::fflush(stdout);
}

void ModeStall() {
  std::printf("STALLING\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s PLUGIN.so VERSION MODE RESULT_FILE\n", argv[0]);
    return 2;
  }
  g_version = std::atoi(argv[2]);
  const std::string mode = argv[3];
  void* dl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (dl == nullptr) Die(std::string("dlopen: ") + dlerror());
  g_v11 = static_cast<const ncclCollNet_v11_t*>(dlsym(dl, "ncclCollNetPlugin_v11"));
  g_v10 = static_cast<const ncclCollNet_v10_t*>(dlsym(dl, "ncclCollNetPlugin_v10"));
  g_v8 = static_cast<const ncclCollNet_v8_t*>(dlsym(dl, "ncclCollNetPlugin_v8"));
  if (g_v11 == nullptr || g_v10 == nullptr || g_v8 == nullptr) Die("a CollNet table is missing");
  if (g_v11->iallgather != nullptr || g_v11->ireducescatter != nullptr) {
    Die("iallgather/ireducescatter must be NULL");
  }

  void* ctx = nullptr;
  if (Init(&ctx) != ncclSuccess) Die("init failed");
  g_ctx = ctx;
  g_threads_after_init = CountThreads();
  int ndev = 0;
  if (Devices(&ndev) != ncclSuccess || ndev != 1) Die("devices() != 1");
  unsigned char handle[kNcclNetHandleMaxSize] = {};
  void* listen_comm = nullptr;
  const ncclResult_t lr = Listen(ctx, handle, &listen_comm);
  if (lr != ncclSuccess) {
    std::printf("LISTEN-FAILED %d\n", static_cast<int>(lr));
    Finalize(ctx);
    return 0;
  }
  std::printf("HANDLE %s\n", Hex(handle, sizeof(handle)).c_str());
  std::fflush(stdout);

  std::string word;
  int nranks = 0;
  if (!(std::cin >> word >> g_rank >> nranks) || word != "GROUP" || nranks < 1) {
    Die("bad GROUP line from the parent");
  }
  std::vector<std::vector<unsigned char>> handles;
  std::vector<void*> ptrs;
  for (int i = 0; i < nranks; ++i) {
    std::string hex;
    if (!(std::cin >> hex)) Die("missing handle");
    handles.push_back(Unhex(hex));
  }
  for (auto& h : handles) ptrs.push_back(h.data());
  void* comm = nullptr;
  const ncclResult_t cr = Connect(ptrs.data(), nranks, g_rank, listen_comm, &comm);
  if (CloseListen(listen_comm) != ncclSuccess) Die("closeListen failed");
  if (cr != ncclSuccess || comm == nullptr) {
    std::printf("CONNECT-FAILED %d\n", static_cast<int>(cr));
    Finalize(ctx);
    return 0;
  }
  std::printf("CONNECTED\n");
  std::fflush(stdout);

  std::ofstream results(argv[4], std::ios::binary | std::ios::trunc);
  if (mode == "all") {
    ModeAll(&comm, nranks, results);
  } else if (mode == "small") {
    ModeSmall(comm, nranks, results);
  } else if (mode == "lossy") {
    ModeLossy(comm, nranks, results);
  } else if (mode == "pieces") {
    ModePieces(comm, results);
  } else if (mode == "fail") {
    ModeFail(comm);
  } else if (mode == "threads") {
    ModeThreads(comm);
  } else if (mode == "killed") {
    ModeKilled(comm);
  } else if (mode == "stall") {
    ModeStall();
  } else {
    Die("unknown mode " + mode);
  }
  results.close();
  if (comm != nullptr && CloseColl(comm) != ncclSuccess) Die("closeColl failed");
  Finalize(ctx);
  std::printf("OK\n");
  std::fflush(stdout);
  return 0;
}
