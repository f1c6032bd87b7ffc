// Byte-plane shuffle: the portable implementation, and the one-time choice of the vector one.
#include "codec/shuffle.h"

#include <cstdint>
#include <cstring>

#include "codec/kernels.h"

namespace strait::codec_internal {
namespace {

// Elements [first, n) of the transform; the vector path does [0, first).
template <size_t kSize>
void ShuffleTail(const unsigned char* src, unsigned char* dst, size_t first, size_t n) {
  for (size_t i = first; i < n; ++i) {
    const unsigned char* e = src + i * kSize;
    for (size_t p = 0; p < kSize; ++p) dst[p * n + i] = e[p];
  }
}

template <size_t kSize>
void UnshuffleTail(const unsigned char* src, unsigned char* dst, size_t first, size_t n) {
  for (size_t i = first; i < n; ++i) {
    unsigned char* e = dst + i * kSize;
    for (size_t p = 0; p < kSize; ++p) e[p] = src[p * n + i];
  }
}

bool IsShuffledSize(size_t elem_size) {
  return elem_size == 2 || elem_size == 4 || elem_size == 8;
}

void Tail(bool unshuffle, const unsigned char* s, unsigned char* d, size_t first, size_t n,
          size_t elem_size) {
  switch (elem_size) {
    case 2: unshuffle ? UnshuffleTail<2>(s, d, first, n) : ShuffleTail<2>(s, d, first, n); break;
    case 4: unshuffle ? UnshuffleTail<4>(s, d, first, n) : ShuffleTail<4>(s, d, first, n); break;
    default: unshuffle ? UnshuffleTail<8>(s, d, first, n) : ShuffleTail<8>(s, d, first, n); break;
  }
}

// Shared driver: `vector` says whether the AVX2 body may run.
void Transform(bool unshuffle, bool vector, const void* src, void* dst, size_t size,
               size_t elem_size) {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  if (size == 0) return;
  if (!IsShuffledSize(elem_size)) {
    std::memcpy(d, s, size);
    return;
  }
  const size_t n = size / elem_size;
  size_t done = 0;
#if STRAIT_CODEC_X86
  if (vector) {
    done = unshuffle ? ByteUnshuffleAvx2(s, d, n, elem_size) : ByteShuffleAvx2(s, d, n, elem_size);
  }
#else
  (void)vector;
#endif
  Tail(unshuffle, s, d, done, n, elem_size);
  const size_t whole = n * elem_size;
  if (whole < size) std::memcpy(d + whole, s + whole, size - whole);
}

// Follows the kernel table's choice, so that STRAIT_CODEC_ISA=scalar also selects this file's
// portable path.
bool DetectVector() {
#if STRAIT_CODEC_X86
  return ActiveIsa() >= Isa::kAvx2;
#else
  return false;
#endif
}

}  // namespace

bool ShuffleVectorAvailable() noexcept {
  static const bool available = DetectVector();
  return available;
}

void ByteShuffleScalar(const void* src, void* dst, size_t size, size_t elem_size) noexcept {
  Transform(false, false, src, dst, size, elem_size);
}
void ByteUnshuffleScalar(const void* src, void* dst, size_t size, size_t elem_size) noexcept {
  Transform(true, false, src, dst, size, elem_size);
}
void ByteShuffleVector(const void* src, void* dst, size_t size, size_t elem_size) noexcept {
  Transform(false, ShuffleVectorAvailable(), src, dst, size, elem_size);
}
void ByteUnshuffleVector(const void* src, void* dst, size_t size, size_t elem_size) noexcept {
  Transform(true, ShuffleVectorAvailable(), src, dst, size, elem_size);
}
void ByteShuffle(const void* src, void* dst, size_t size, size_t elem_size) noexcept {
  ByteShuffleVector(src, dst, size, elem_size);
}
void ByteUnshuffle(const void* src, void* dst, size_t size, size_t elem_size) noexcept {
  ByteUnshuffleVector(src, dst, size, elem_size);
}

}  // namespace strait::codec_internal
