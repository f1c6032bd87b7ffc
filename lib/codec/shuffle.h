// Internal: byte-plane shuffle, the transform that lets zstd see floating-point structure.
//
// For elements of E bytes (2, 4 or 8), the shuffled buffer holds E planes of n = size / E bytes:
// plane p is byte p of every element, in element order. Bytes that do not form a whole element
// (size % E of them) are copied unchanged after the planes. Other element sizes are a plain copy.
// Every implementation gives the same bytes; src and dst must not overlap and may be unaligned.
// Thread-safe, never blocks, never allocates.
#ifndef STRAIT_LIB_CODEC_SHUFFLE_H_
#define STRAIT_LIB_CODEC_SHUFFLE_H_

#include <cstddef>

namespace strait::codec_internal {

// The fastest implementation this CPU runs.
void ByteShuffle(const void* src, void* dst, size_t size, size_t elem_size) noexcept;
void ByteUnshuffle(const void* src, void* dst, size_t size, size_t elem_size) noexcept;

// For tests: the portable reference, and the vector path (the reference where the CPU has none).
void ByteShuffleScalar(const void* src, void* dst, size_t size, size_t elem_size) noexcept;
void ByteUnshuffleScalar(const void* src, void* dst, size_t size, size_t elem_size) noexcept;
bool ShuffleVectorAvailable() noexcept;
void ByteShuffleVector(const void* src, void* dst, size_t size, size_t elem_size) noexcept;
void ByteUnshuffleVector(const void* src, void* dst, size_t size, size_t elem_size) noexcept;

#if STRAIT_CODEC_X86
// shuffle_avx2.cc: only the first `elements` rounded down to a multiple of 16 are transposed;
// returns how many elements were done. The caller finishes the rest and the remainder bytes.
size_t ByteShuffleAvx2(const unsigned char* src, unsigned char* dst, size_t elements,
                       size_t elem_size) noexcept;
size_t ByteUnshuffleAvx2(const unsigned char* src, unsigned char* dst, size_t elements,
                         size_t elem_size) noexcept;
#endif

}  // namespace strait::codec_internal

#endif  // STRAIT_LIB_CODEC_SHUFFLE_H_
