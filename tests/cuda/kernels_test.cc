// The GPU kernels (lib/cuda/quantize.cu) on a real device against the CPU codec: stage bytes
// byte-identical and error-feedback residuals bit-identical for every codec x dtype x rounding x
// odd size, dequantize and dequantize-accumulate identical to the CPU, the frame built around the
// GPU stage identical to the Encoder's, bad arguments refused before launch, and the caller's
// stream honoured (no implicit synchronisation). ctest label `gpu`; every test skips itself with
// "no CUDA device: ..." where the runtime sees none, or fails when STRAIT_REQUIRE_GPU is set.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "cuda/quantize.h"
#include "cuda_test_util.h"
#include "strait/codec.h"

namespace strait::cuda_test {
namespace {

#define ASSERT_CUDA(expr)                                                      \
  do {                                                                         \
    const cudaError_t err_ = (expr);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

// A device buffer, freed at scope exit (tests only: the library itself never allocates).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = uint8_t>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::HaveCudaDevice(&why)) {
      // bench/gpu-check.sh sets this: on the GPU machine a missing device is a failure.
      if (std::getenv("STRAIT_REQUIRE_GPU") != nullptr) FAIL() << why;
      GTEST_SKIP() << why;
    }
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

template <typename T>
std::vector<T> CopyBack(const DeviceBuffer& d, size_t count, cudaStream_t stream) {
  std::vector<T> host(count);
  if (count > 0) {
    EXPECT_EQ(
        cudaMemcpyAsync(host.data(), d.get(), count * sizeof(T), cudaMemcpyDeviceToHost, stream),
        cudaSuccess);
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return host;
}

long FirstDiff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return static_cast<long>(std::min(a.size(), b.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<long>(i);
  }
  return -1;
}

TEST_F(CudaKernelsTest, MatchesCpuCodecForEveryCodecTypeAndSize) {
  // 32: one element a lane; 256: the default; 1024: a warp in chunks; 4096: a CTA per block.
  constexpr uint32_t kBlocks[] = {32, 256, 1024, 4096};
  // Buffers for the largest case, reused: a stage never exceeds 4 bytes an element plus scales.
  const size_t max_count = *std::max_element(std::begin(kSizes), std::end(kSizes));
  DeviceBuffer d_src(max_count * 4), d_res(max_count * 4), d_stage(max_count * 5 + 64);
  DeviceBuffer d_out(max_count * 4), d_acc(max_count * 4), d_narrow(max_count * 2);
  constexpr size_t kGuard = 16;
  int cases = 0;
  for (const CodecId codec : kLossyCodecs) {
    for (const DataType type : kFloatTypes) {
      for (const uint32_t block : kBlocks) {
        for (const size_t count : kSizes) {
          for (const Rounding rounding : kRoundings) {
            for (const bool feedback : {false, true}) {
              SCOPED_TRACE(CaseName(codec, type, rounding, count, block, feedback));
              const std::vector<float> input = MakeInput(count, block, count + block, cases % 9);
              const std::vector<uint8_t> src = StoreAs(input, type);
              CodecOptions options;
              options.codec = codec;
              options.block_size = block;
              options.rounding = rounding;
              options.seed = 0xabc000u + static_cast<uint64_t>(cases);
              options.index_offset = (uint64_t{3} << 32) + static_cast<uint64_t>(cases);
              ci::QuantParams params;
              params.block_size = block;
              params.rounding = rounding;
              params.seed = options.seed;
              params.index_offset = options.index_offset;
              std::vector<float> cpu_res = MakeResidual(input, block, count);
              const std::vector<float> res0 = cpu_res;
              const std::vector<uint8_t> cpu_stage = ReferenceStage(
                  codec, type, src, feedback ? cpu_res.data() : nullptr, count, params);

              const size_t stage_bytes = cuda::LossyStageBytes(count, options);
              ASSERT_EQ(stage_bytes, cpu_stage.size());
              ASSERT_CUDA(cudaMemcpyAsync(d_src.get(), src.data(), src.size(),
                                          cudaMemcpyHostToDevice, stream_));
              ASSERT_CUDA(cudaMemcpyAsync(d_res.get(), res0.data(), count * 4,
                                          cudaMemcpyHostToDevice, stream_));
              ASSERT_CUDA(cudaMemsetAsync(d_stage.get(), 0xcd, stage_bytes + kGuard, stream_));
              Status st = cuda::QuantizeAsync(d_src.get(), type, count, options,
                                              feedback ? d_res.get<float>() : nullptr,
                                              d_stage.get(), stage_bytes, stream_);
              ASSERT_TRUE(st.ok()) << st.ToString();
              std::vector<uint8_t> gpu_stage =
                  CopyBack<uint8_t>(d_stage, stage_bytes + kGuard, stream_);
              ASSERT_EQ(std::vector<uint8_t>(gpu_stage.end() - kGuard, gpu_stage.end()),
                        std::vector<uint8_t>(kGuard, 0xcd))
                  << "the kernel wrote past the stage";
              gpu_stage.resize(stage_bytes);
              ASSERT_EQ(FirstDiff(cpu_stage, gpu_stage), -1) << "stage bytes differ";
              const std::vector<float> gpu_res = CopyBack<float>(d_res, count, stream_);
              ASSERT_EQ(FirstFloatDiff(feedback ? cpu_res : res0, gpu_res), -1)
                  << "residuals differ";

              // Dequantize (fp32 and a narrow type) and accumulate, from the GPU's stage.
              std::vector<float> cpu_out(count), cpu_acc = input;
              ReferenceDequantize(codec, cpu_stage, count, block, cpu_out.data(), false);
              ReferenceDequantize(codec, cpu_stage, count, block, cpu_acc.data(), true);
              ASSERT_CUDA(cudaMemcpyAsync(d_acc.get(), input.data(), count * 4,
                                          cudaMemcpyHostToDevice, stream_));
              ASSERT_TRUE(cuda::DequantizeAsync(d_stage.get(), codec, block, count, d_out.get(),
                                                DataType::kFloat32, stream_)
                              .ok());
              ASSERT_TRUE(cuda::DequantizeAccumulateAsync(d_stage.get(), codec, block, count,
                                                          d_acc.get<float>(), stream_)
                              .ok());
              const DataType narrow = type == DataType::kFloat32 ? DataType::kBfloat16 : type;
              ASSERT_TRUE(cuda::DequantizeAsync(d_stage.get(), codec, block, count, d_narrow.get(),
                                                narrow, stream_)
                              .ok());
              ASSERT_EQ(FirstFloatDiff(cpu_out, CopyBack<float>(d_out, count, stream_)), -1)
                  << "dequantize differs";
              ASSERT_EQ(FirstFloatDiff(cpu_acc, CopyBack<float>(d_acc, count, stream_)), -1)
                  << "dequantize-accumulate differs";
              ASSERT_EQ(FirstElementDiff(StoreAs(cpu_out, narrow),
                                         CopyBack<uint8_t>(d_narrow, count * 2, stream_), narrow),
                        -1)
                  << "dequantize to " << DataTypeName(narrow) << " differs";
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 3 * 3 * 4 * 10 * 2 * 2);
}

TEST_F(CudaKernelsTest, FrameAroundGpuStageIsTheEncodersFrame) {
  Encoder encoder;
  const size_t count = 10007;
  for (const CodecId codec : kLossyCodecs) {
    for (const bool chain : {false, true}) {
      SCOPED_TRACE(std::string(CodecName(codec)) + (chain ? "/zstd" : ""));
      const std::vector<float> input = MakeInput(count, 256, 5, 3);
      CodecOptions options;
      options.codec = codec;
      options.chain_zstd = chain;
      options.rounding = Rounding::kStochastic;
      options.seed = 9;
      std::vector<float> cpu_res = MakeResidual(input, 256, 1);
      const std::vector<float> res0 = cpu_res;
      std::vector<uint8_t> frame;
      ASSERT_TRUE(encoder
                      .EncodeWithFeedback(input.data(), count, DataType::kFloat32, options,
                                          cpu_res.data(), &frame)
                      .ok());
      const size_t stage_bytes = cuda::LossyStageBytes(count, options);
      DeviceBuffer d_src(count * 4), d_res(count * 4), d_stage(stage_bytes);
      ASSERT_CUDA(
          cudaMemcpyAsync(d_src.get(), input.data(), count * 4, cudaMemcpyHostToDevice, stream_));
      ASSERT_CUDA(
          cudaMemcpyAsync(d_res.get(), res0.data(), count * 4, cudaMemcpyHostToDevice, stream_));
      ASSERT_TRUE(cuda::QuantizeAsync(d_src.get(), DataType::kFloat32, count, options,
                                      d_res.get<float>(), d_stage.get(), stage_bytes, stream_)
                      .ok());
      const std::vector<uint8_t> stage = CopyBack<uint8_t>(d_stage, stage_bytes, stream_);
      std::vector<uint8_t> wrapped(cuda::MaxWrappedFrameSize(count, DataType::kFloat32, options));
      StatusOr<size_t> size = cuda::WrapStage(stage, count, DataType::kFloat32, options, wrapped);
      ASSERT_TRUE(size.ok()) << size.status().ToString();
      wrapped.resize(*size);
      EXPECT_EQ(FirstDiff(frame, wrapped), -1);
      EXPECT_EQ(FirstFloatDiff(cpu_res, CopyBack<float>(d_res, count, stream_)), -1);
    }
  }
}

TEST_F(CudaKernelsTest, RefusesBadArgumentsBeforeLaunch) {
  const size_t count = 1000;
  CodecOptions options;
  options.codec = CodecId::kInt8;
  const size_t need = cuda::LossyStageBytes(count, options);
  DeviceBuffer d_src(count * 4 + 4), d_stage(need + 4), d_res(count * 4);
  auto code = [](const Status& s) { return s.code(); };
  // Too small a stage: an error naming the size needed, nothing launched or allocated.
  Status s = cuda::QuantizeAsync(d_src.get(), DataType::kFloat32, count, options, nullptr,
                                 d_stage.get(), need - 1, stream_);
  ASSERT_EQ(code(s), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(std::to_string(need)), std::string::npos) << s.ToString();
  EXPECT_EQ(code(cuda::QuantizeAsync(nullptr, DataType::kFloat32, count, options, nullptr,
                                     d_stage.get(), need, stream_)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(cuda::QuantizeAsync(d_src.get() + 2, DataType::kFloat32, count, options, nullptr,
                                     d_stage.get(), need, stream_)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(cuda::QuantizeAsync(d_src.get(), DataType::kFloat32, count, options, nullptr,
                                     d_stage.get() + 1, need, stream_)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(cuda::QuantizeAsync(d_src.get(), DataType::kFloat32, count, options,
                                     d_src.get<float>(), d_stage.get(), need, stream_)),
            StatusCode::kInvalidArgument)
      << "residual overlapping src";
  CodecOptions zstd;
  zstd.codec = CodecId::kZstd;
  EXPECT_EQ(code(cuda::QuantizeAsync(d_src.get(), DataType::kFloat32, count, zstd, nullptr,
                                     d_stage.get(), need, stream_)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(cuda::QuantizeAsync(d_src.get(), DataType::kInt32, count, options, nullptr,
                                     d_stage.get(), need, stream_)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(cuda::DequantizeAsync(d_stage.get(), CodecId::kInt8, 48, count, d_res.get(),
                                       DataType::kFloat32, stream_)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(cuda::DequantizeAsync(d_stage.get(), CodecId::kInt8, 256, count, d_res.get(),
                                       DataType::kInt8, stream_)),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      cuda::QuantizeAsync(nullptr, DataType::kFloat32, 0, options, nullptr, nullptr, 0, stream_)
          .ok())
      << "an empty tensor is no error";
  EXPECT_EQ(cudaStreamQuery(stream_), cudaSuccess) << "a refused call launched work";
}

// The kernels only enqueue: with the stream held back by a host function that waits for the test
// to release it, QuantizeAsync and DequantizeAsync must return, and nothing may have run yet.
// A call that synchronised would wait for the held stream; the test then fails after a timeout
// instead of hanging.
TEST_F(CudaKernelsTest, HonoursTheCallersStreamWithoutSynchronising) {
  const size_t count = 1 << 20;
  CodecOptions options;
  options.codec = CodecId::kFp8E4M3;
  const size_t need = cuda::LossyStageBytes(count, options);
  DeviceBuffer d_src(count * 4), d_stage(need), d_res(count * 4), d_out(count * 4);
  const std::vector<float> input = MakeInput(count, 256, 1, 8);
  ASSERT_CUDA(cudaMemcpy(d_src.get(), input.data(), count * 4, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(d_stage.get(), 0xcd, need));
  ASSERT_CUDA(cudaMemset(d_res.get(), 0, count * 4));
  ASSERT_CUDA(cudaDeviceSynchronize());

  static std::atomic<bool> released;
  released = false;
  auto hold = [](void*) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!released.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  ASSERT_CUDA(cudaLaunchHostFunc(stream_, hold, nullptr));
  auto enqueue = std::async(std::launch::async, [&] {
    Status s = cuda::QuantizeAsync(d_src.get(), DataType::kFloat32, count, options,
                                   d_res.get<float>(), d_stage.get(), need, stream_);
    if (s.ok()) {
      s = cuda::DequantizeAsync(d_stage.get(), options.codec, options.block_size, count,
                                d_out.get(), DataType::kFloat32, stream_);
    }
    return s;
  });
  const bool returned = enqueue.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  EXPECT_TRUE(returned) << "QuantizeAsync/DequantizeAsync waited for the held stream";
  EXPECT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady);
  // Nothing ran yet: the stage still holds the fill (read through another non-blocking stream).
  cudaStream_t other = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  std::vector<uint8_t> early(16);
  ASSERT_CUDA(
      cudaMemcpyAsync(early.data(), d_stage.get(), early.size(), cudaMemcpyDeviceToHost, other));
  ASSERT_CUDA(cudaStreamSynchronize(other));
  cudaStreamDestroy(other);
  EXPECT_EQ(early, std::vector<uint8_t>(16, 0xcd));

  released = true;
  const Status s = enqueue.get();
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  const std::vector<uint8_t> stage = CopyBack<uint8_t>(d_stage, need, stream_);
  std::vector<float> cpu_res(count, 0.0f);
  ci::QuantParams params;
  EXPECT_EQ(FirstDiff(stage, ReferenceStage(options.codec, DataType::kFloat32,
                                            StoreAs(input, DataType::kFloat32), cpu_res.data(),
                                            count, params)),
            -1);
}

}  // namespace
}  // namespace strait::cuda_test
