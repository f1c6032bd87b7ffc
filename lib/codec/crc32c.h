// Internal: CRC-32C (Castagnoli), the checksum of frame headers and payloads.
//
// Crc32c() picks the fastest implementation once (SSE4.2 crc32 instructions with three
// interleaved streams where the CPU has them, else a slicing-by-8 table), and every
// implementation returns the same value. Thread-safe, never blocks, never allocates.
#ifndef STRAIT_LIB_CODEC_CRC32C_H_
#define STRAIT_LIB_CODEC_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace strait {

// The standard CRC-32C of `size` bytes at `data` ("123456789" gives 0xE3069283). `seed` is the
// CRC of the bytes before, so Crc32c(b, nb, Crc32c(a, na)) == Crc32c of a followed by b.
uint32_t Crc32c(const void* data, size_t size, uint32_t seed = 0) noexcept;

namespace codec_internal {

// The portable table implementation; the reference for the others.
uint32_t Crc32cSoftware(const void* data, size_t size, uint32_t seed) noexcept;
// True where the hardware implementation can run on this CPU.
bool Crc32cHardwareAvailable() noexcept;
// The SSE4.2 implementation; call only where Crc32cHardwareAvailable().
uint32_t Crc32cHardware(const void* data, size_t size, uint32_t seed) noexcept;
// The name of what Crc32c() uses: "sse4.2" or "software".
const char* Crc32cImplementationName() noexcept;

#if STRAIT_CODEC_X86
// Defined in crc32c_hw.cc, which is compiled with -msse4.2 -mpclmul. Works on the raw
// (pre-inverted) CRC register.
uint32_t Crc32cSse42Raw(const uint8_t* data, size_t size, uint32_t crc) noexcept;
#endif

}  // namespace codec_internal
}  // namespace strait

#endif  // STRAIT_LIB_CODEC_CRC32C_H_
