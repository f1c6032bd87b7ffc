// The codec library: turns tensors into compact, checked frames and back.
//
// A frame is a 48-byte versioned header followed by a payload (see "Frame format" below). Codecs:
//   none   - the raw bytes.
//   zstd   - lossless zstd (levels -5..19), optionally after a byte-plane shuffle, which groups the
//            exponent bytes of floating-point data together so that zstd finds them.
//   int8, int4, fp8 (e4m3)
//          - lossy, for float32/bfloat16/float16 input: block-wise absmax scaling (one fp32 scale
//            per block of `block_size` elements), round-to-nearest-even or stochastic rounding
//            from a counter-based generator keyed by (seed, element index), so the same input and
//            seed give the same bytes on every machine, vector width and thread count. A lossy
//            payload may be chained with zstd.
//
// Error feedback (EncodeWithFeedback) keeps what quantization lost in a residual and adds it to
// the next step's input, so that over many steps nothing is lost on average.
//
// Thread safety: Encoder and Decoder hold reusable zstd contexts and scratch memory; use one per
// thread. Free functions are thread-safe. Nothing here blocks on I/O.
#ifndef STRAIT_CODEC_H_
#define STRAIT_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strait/status.h"
#include "strait/types.h"

namespace strait {

// CodecId, its names and kMinZstdLevel/kMaxZstdLevel are in strait/types.h (the one numbering of
// codecs, shared with the local protocol and the NCCL plugin).

enum class Rounding : uint8_t {
  kNearest = 0,     // round half to even
  kStochastic = 1,  // floor(x + u), u uniform in [0, 1) from (seed, element index)
};

inline constexpr uint32_t kDefaultBlockSize = 256;
inline constexpr uint32_t kMinBlockSize = 32;
inline constexpr uint32_t kMaxBlockSize = 65536;
// The largest element count one frame may describe (2^40); larger tensors are sent in chunks.
inline constexpr uint64_t kMaxFrameElements = uint64_t{1} << 40;

struct CodecOptions {
  CodecId codec = CodecId::kNone;
  // zstd level for CodecId::kZstd and for chain_zstd; -5 (fastest) .. 19.
  int zstd_level = 1;
  // CodecId::kZstd only: byte-plane shuffle before zstd for 2-, 4- and 8-byte elements.
  bool byte_shuffle = true;
  // Lossy codecs only: compress the quantized payload with zstd at zstd_level.
  bool chain_zstd = false;
  // Lossy codecs only: elements per scale; a power of two in [kMinBlockSize, kMaxBlockSize].
  uint32_t block_size = kDefaultBlockSize;
  Rounding rounding = Rounding::kNearest;
  // Stochastic rounding: identifies the random stream, e.g. a hash of (job, tensor, step).
  uint64_t seed = 0;
  // Stochastic rounding: the global index of element 0, so that a tensor encoded in chunks
  // draws the same numbers as one encoded whole.
  uint64_t index_offset = 0;
};

// Checks `options` for encoding `dtype`; the error names the bad field and the allowed values.
Status ValidateCodecOptions(const CodecOptions& options, DataType dtype);

// ---------------------------------------------------------------------------------------------
// Frame format, version 1 (all integers little-endian):
//   off size field
//     0    4 magic "STRF" (0x46525453)
//     4    2 version (1)
//     6    2 header size (48)
//     8    1 codec (CodecId)
//     9    1 dtype (DataType of the encoded tensor)
//    10    2 flags (FrameFlag bits)
//    12    4 block size (lossy codecs; 0 otherwise)
//    16    8 element count
//    24    8 payload size: bytes after the header
//    32    8 stage size: payload bytes before zstd (== payload size when zstd is not used)
//    40    4 crc32c of the payload
//    44    4 crc32c of bytes 0..43
// Lossy stage layout: ceil(count / block) fp32 scales, then the codes (int8 and fp8: one byte
// per element; int4: two per byte, element 2i in the low nibble).
inline constexpr uint32_t kFrameMagic = 0x46525453;
inline constexpr uint16_t kFrameVersion = 1;
inline constexpr size_t kFrameHeaderSize = 48;

enum FrameFlag : uint16_t {
  kFrameFlagShuffled = 1u << 0,    // the stage is byte-plane shuffled
  kFrameFlagZstd = 1u << 1,        // the payload is the stage compressed with zstd
  kFrameFlagStochastic = 1u << 2,  // informational: stochastic rounding was used
};
inline constexpr uint16_t kKnownFrameFlags = 0x7;

struct FrameInfo {
  uint16_t version = 0;
  CodecId codec = CodecId::kNone;
  DataType dtype = DataType::kFloat32;
  uint16_t flags = 0;
  uint32_t block_size = 0;
  uint64_t element_count = 0;
  uint64_t payload_size = 0;
  uint64_t stage_size = 0;
  size_t frame_size() const { return kFrameHeaderSize + payload_size; }
};

// What a decoder may insist on. A frame that differs gives kInvalidArgument naming both values.
struct DecodeExpectations {
  std::optional<CodecId> codec;
  std::optional<DataType> dtype;
  std::optional<uint64_t> element_count;
};

// Validates the header of `frame` (magic, version, header checksum, field ranges, sizes agreeing
// with each other and with frame.size()) and the payload checksum. Errors, each distinct:
//   kDataLoss           "truncated frame: ..."       fewer bytes than the header or payload needs
//   kResourceExhausted  "oversized frame: ..."       more bytes than the header describes, or a
//                                                     count above kMaxFrameElements
//   kUnimplemented      "unsupported frame version"  a version this build cannot read
//   kDataLoss           "not a Strait frame"          wrong magic
//   kDataLoss           "corrupted frame header"     header crc32c mismatch
//   kDataLoss           "corrupted frame payload"    payload crc32c mismatch
//   kInvalidArgument    "invalid frame: ..."         a field out of range (unknown codec, ...)
//   kInvalidArgument    "codec mismatch: ..."        differs from `expect`
// Never reads outside `frame`.
StatusOr<FrameInfo> InspectFrame(std::span<const uint8_t> frame,
                                 const DecodeExpectations& expect = {});

// An upper bound on the frame size for encoding `count` elements with `options`.
size_t MaxFrameSize(size_t count, DataType dtype, const CodecOptions& options) noexcept;

// Capacity the vector forms of Encoder leave beyond the frame: room for a transport to append
// its own framing (the collective's 24-byte trailer) without moving the frame to a new buffer.
inline constexpr size_t kFrameSpareCapacity = 32;

class Encoder {
 public:
  Encoder();
  ~Encoder();
  Encoder(Encoder&&) noexcept;
  Encoder& operator=(Encoder&&) noexcept;

  // Encodes `count` elements of `dtype` at `data` into `out`, which is resized to the frame
  // with at least kFrameSpareCapacity bytes of capacity left behind it. Does not block; not
  // thread-safe (one Encoder per thread).
  Status Encode(const void* data, size_t count, DataType dtype, const CodecOptions& options,
                std::vector<uint8_t>* out);

  // As Encode, into a caller buffer of at least MaxFrameSize(...) bytes; returns the frame size.
  StatusOr<size_t> EncodeInto(const void* data, size_t count, DataType dtype,
                              const CodecOptions& options, std::span<uint8_t> out);

  // Error feedback for lossy codecs: encodes compensated = data + residual and sets
  // residual = compensated - decode(frame). `residual` holds `count` fp32 values (zero the first
  // time). For lossless codecs the residual stays zero and this is Encode.
  Status EncodeWithFeedback(const void* data, size_t count, DataType dtype,
                            const CodecOptions& options, float* residual,
                            std::vector<uint8_t>* out);
  StatusOr<size_t> EncodeWithFeedbackInto(const void* data, size_t count, DataType dtype,
                                          const CodecOptions& options, float* residual,
                                          std::span<uint8_t> out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class Decoder {
 public:
  Decoder();
  ~Decoder();
  Decoder(Decoder&&) noexcept;
  Decoder& operator=(Decoder&&) noexcept;

  // Decodes `frame` into `out`, which holds `count` elements of `out_dtype`. `count` must equal
  // the frame's element count. A lossless frame decodes only to its own dtype; a lossy frame to
  // float32, bfloat16 or float16 (rounded to nearest even). Validates as InspectFrame does.
  Status Decode(std::span<const uint8_t> frame, void* out, size_t count, DataType out_dtype,
                const DecodeExpectations& expect = {});

  // acc[i] += decoded[i] in fp32 for a frame of float32, bfloat16 or float16 data (any codec).
  // `acc` is untouched when the frame is invalid.
  Status DecodeAccumulate(std::span<const uint8_t> frame, float* acc, size_t count,
                          const DecodeExpectations& expect = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Residuals for error feedback, keyed by (job, tensor key). Thread-safe map; the buffer of one
// key must be used by one thread at a time. A key whose count changes is reset to zeros.
class ErrorFeedbackStore {
 public:
  ErrorFeedbackStore();
  ~ErrorFeedbackStore();

  // The residual for (job, tensor), `count` floats, zeroed when first created or resized.
  // The span stays valid until DropJob(job), Clear() or a resize of that key.
  std::span<float> Residual(std::string_view job, std::string_view tensor, size_t count);
  // Forgets every residual of `job`; returns how many were dropped.
  size_t DropJob(std::string_view job);
  void Clear();
  size_t BytesHeld() const;
  size_t KeyCount() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Element conversions used around the fp32 accumulators. `src` and `dst` may be unaligned.
// ConvertToFloat accepts float32, bfloat16, float16; ConvertFromFloat rounds to nearest even.
Status ConvertToFloat(const void* src, DataType src_type, float* dst, size_t count);
Status ConvertFromFloat(const float* src, void* dst, DataType dst_type, size_t count);

// Which vector instructions the codec uses: "avx512", "avx2" or "scalar". Chosen at first use
// from the CPU, or forced with STRAIT_CODEC_ISA=scalar|avx2|avx512 (capped at what the CPU has).
const char* CodecIsaName() noexcept;

}  // namespace strait

#endif  // STRAIT_CODEC_H_
