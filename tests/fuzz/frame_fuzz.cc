// libFuzzer target for the frame decoder: InspectFrame, Decode (to float32 and to the frame's own
// dtype) and DecodeAccumulate on arbitrary bytes. Besides "no crash, no out-of-bounds read" it
// checks two properties: a rejected frame leaves the accumulator untouched, and an accepted one
// accumulates exactly what Decode produced.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <span>
#include <vector>

#include "strait/codec.h"

namespace {

// Larger element counts are legal but would only make each run slow; they are still inspected.
constexpr uint64_t kMaxDecodeCount = uint64_t{1} << 20;
constexpr float kAccInit = -0.0f;  // -0 + x == x bit for bit, for every x but signaling NaNs

bool SameOrBothNan(float a, float b) {
  uint32_t x;
  uint32_t y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (a != a && b != b);
}

void Check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One decoder for the whole run, as a server would keep one: its scratch buffers carry over
  // from input to input.
  static strait::Decoder* decoder = new strait::Decoder();
  const std::span<const uint8_t> frame(data, size);
  const strait::StatusOr<strait::FrameInfo> info = strait::InspectFrame(frame);

  if (!info.ok()) {
    // Every decode entry point must reject it too, without writing to acc.
    float acc[16];
    std::fill(std::begin(acc), std::end(acc), 1.0f);
    Check(!decoder->DecodeAccumulate(frame, acc, 16).ok());
    for (float v : acc) Check(v == 1.0f);
    Check(!decoder->Decode(frame, acc, 16, strait::DataType::kFloat32).ok());
    return 0;
  }

  const uint64_t count = info->element_count;
  Check(info->frame_size() == size);
  if (count > kMaxDecodeCount) return 0;
  const size_t n = static_cast<size_t>(count);

  // A wrong count is refused before anything is written (a one-float buffer: if the decoder
  // wrote anyway, the sanitizer would see it).
  float probe = 1.0f;
  Check(!decoder->DecodeAccumulate(frame, &probe, n == 1 ? 2 : 1).ok());
  Check(probe == 1.0f);

  std::vector<uint8_t> native(n * strait::DataTypeSize(info->dtype) + 1);
  const strait::Status native_status = decoder->Decode(frame, native.data(), n, info->dtype);

  std::vector<float> decoded(n + 1);
  const strait::Status fp32_status =
      decoder->Decode(frame, decoded.data(), n, strait::DataType::kFloat32);

  std::vector<float> acc(n + 1, kAccInit);
  const strait::Status acc_status = decoder->DecodeAccumulate(frame, acc.data(), n);
  if (!acc_status.ok()) {
    for (float v : acc) Check(std::memcmp(&v, &kAccInit, 4) == 0);
  }
  // Decode to float32 and DecodeAccumulate see the same data, so they agree.
  if (fp32_status.ok() && acc_status.ok()) {
    for (size_t i = 0; i < n; ++i) Check(SameOrBothNan(acc[i], decoded[i]));
  }
  if (info->dtype == strait::DataType::kFloat32) {
    Check(native_status.ok() == fp32_status.ok());
  }
  return 0;
}
