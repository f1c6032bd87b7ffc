// Deterministic, gradient-like test data for the codec benchmarks.
//
// Real gradients are what the codecs are tuned for, and their statistics decide the figures a
// benchmark reports (zstd's ratio depends on the exponent spread, int8's error on the spread
// inside a block), so uniform random bytes would mislead. FillGradient produces fp32 values that
// look like a model's gradients:
//   - roughly normal, zero mean, magnitude around 1e-3;
//   - "layers": consecutive segments of 128K..768K elements, each with its own scale
//     (1e-3 x 2^-3 .. 1.9e-3 x 2^+2, geometric mean about 1e-3), as a model's layers have;
//   - about 1 in 8192 elements is a heavy-tailed outlier (10..100 x the layer's scale);
//   - about 1 in 128 elements is exactly zero (dead units, unused embedding rows).
// The same (seed, count) gives the same bits on every machine: the generator uses only integer
// arithmetic, exact power-of-two scaling and single IEEE operations (no libm).
// Fast enough for the benchmarks: 64 MiB takes a few tens of milliseconds on one core.
#ifndef STRAIT_BENCH_GRADIENT_H_
#define STRAIT_BENCH_GRADIENT_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "strait/status.h"
#include "strait/types.h"

namespace strait::bench {

// Fills `out` with gradient-like values drawn from `seed`. Thread-safe (no shared state).
void FillGradient(uint64_t seed, std::span<float> out);

// `count` gradient-like values from `seed`.
std::vector<float> MakeGradient(size_t count, uint64_t seed);

// Converts `src` to `dtype` (float32, bfloat16 or float16; rounded to nearest even) into `dst`,
// which must hold src.size() * DataTypeSize(dtype) bytes. Other types give kInvalidArgument.
Status ConvertGradient(std::span<const float> src, DataType dtype, void* dst);

// As ConvertGradient, into a new byte vector.
StatusOr<std::vector<uint8_t>> GradientAs(std::span<const float> src, DataType dtype);

}  // namespace strait::bench

#endif  // STRAIT_BENCH_GRADIENT_H_
