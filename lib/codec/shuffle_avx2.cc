// Byte-plane shuffle with 128-bit byte permutes and integer transposes. Compiled with -mavx2 and
// called only after shuffle.cc has checked the CPU. Sixteen elements per step: a byte permute
// groups each vector's bytes by plane, then a transpose of 2-, 4- or 8-byte pieces across the
// vectors makes each vector one plane's 16 bytes. Both steps are their own inverse (the permute
// for 2- and 8-byte elements is the other's inverse), so unshuffle runs them backwards.
#include <immintrin.h>

#include "codec/shuffle.h"

namespace strait::codec_internal {
namespace {

inline __m128i Load(const unsigned char* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline void Store(unsigned char* p, __m128i v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
}

// Groups bytes by plane within 16 bytes: for 2-byte elements to [p0 x8 | p1 x8], ...
inline __m128i GroupMask2() {
  return _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
}
inline __m128i GroupMask4() {
  return _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
}
inline __m128i GroupMask8() {
  return _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
}

inline void Transpose4x32(__m128i v[4]) {
  const __m128i t0 = _mm_unpacklo_epi32(v[0], v[1]);
  const __m128i t1 = _mm_unpacklo_epi32(v[2], v[3]);
  const __m128i t2 = _mm_unpackhi_epi32(v[0], v[1]);
  const __m128i t3 = _mm_unpackhi_epi32(v[2], v[3]);
  v[0] = _mm_unpacklo_epi64(t0, t1);
  v[1] = _mm_unpackhi_epi64(t0, t1);
  v[2] = _mm_unpacklo_epi64(t2, t3);
  v[3] = _mm_unpackhi_epi64(t2, t3);
}

inline void Transpose8x16(__m128i v[8]) {
  const __m128i s0 = _mm_unpacklo_epi16(v[0], v[1]);
  const __m128i s1 = _mm_unpackhi_epi16(v[0], v[1]);
  const __m128i s2 = _mm_unpacklo_epi16(v[2], v[3]);
  const __m128i s3 = _mm_unpackhi_epi16(v[2], v[3]);
  const __m128i s4 = _mm_unpacklo_epi16(v[4], v[5]);
  const __m128i s5 = _mm_unpackhi_epi16(v[4], v[5]);
  const __m128i s6 = _mm_unpacklo_epi16(v[6], v[7]);
  const __m128i s7 = _mm_unpackhi_epi16(v[6], v[7]);
  const __m128i u0 = _mm_unpacklo_epi32(s0, s2);
  const __m128i u1 = _mm_unpackhi_epi32(s0, s2);
  const __m128i u2 = _mm_unpacklo_epi32(s1, s3);
  const __m128i u3 = _mm_unpackhi_epi32(s1, s3);
  const __m128i u4 = _mm_unpacklo_epi32(s4, s6);
  const __m128i u5 = _mm_unpackhi_epi32(s4, s6);
  const __m128i u6 = _mm_unpacklo_epi32(s5, s7);
  const __m128i u7 = _mm_unpackhi_epi32(s5, s7);
  v[0] = _mm_unpacklo_epi64(u0, u4);
  v[1] = _mm_unpackhi_epi64(u0, u4);
  v[2] = _mm_unpacklo_epi64(u1, u5);
  v[3] = _mm_unpackhi_epi64(u1, u5);
  v[4] = _mm_unpacklo_epi64(u2, u6);
  v[5] = _mm_unpackhi_epi64(u2, u6);
  v[6] = _mm_unpacklo_epi64(u3, u7);
  v[7] = _mm_unpackhi_epi64(u3, u7);
}

}  // namespace

size_t ByteShuffleAvx2(const unsigned char* src, unsigned char* dst, size_t n,
                       size_t elem_size) noexcept {
  const size_t blocks = n / 16;
  if (elem_size == 2) {
    const __m128i m = GroupMask2();
    for (size_t b = 0; b < blocks; ++b) {
      const unsigned char* s = src + b * 32;
      const __m128i a0 = _mm_shuffle_epi8(Load(s), m);
      const __m128i a1 = _mm_shuffle_epi8(Load(s + 16), m);
      Store(dst + b * 16, _mm_unpacklo_epi64(a0, a1));
      Store(dst + n + b * 16, _mm_unpackhi_epi64(a0, a1));
    }
  } else if (elem_size == 4) {
    const __m128i m = GroupMask4();
    for (size_t b = 0; b < blocks; ++b) {
      const unsigned char* s = src + b * 64;
      __m128i v[4];
      for (int k = 0; k < 4; ++k) v[k] = _mm_shuffle_epi8(Load(s + 16 * k), m);
      Transpose4x32(v);
      for (int p = 0; p < 4; ++p) Store(dst + p * n + b * 16, v[p]);
    }
  } else if (elem_size == 8) {
    const __m128i m = GroupMask8();
    for (size_t b = 0; b < blocks; ++b) {
      const unsigned char* s = src + b * 128;
      __m128i v[8];
      for (int k = 0; k < 8; ++k) v[k] = _mm_shuffle_epi8(Load(s + 16 * k), m);
      Transpose8x16(v);
      for (int p = 0; p < 8; ++p) Store(dst + p * n + b * 16, v[p]);
    }
  } else {
    return 0;
  }
  return blocks * 16;
}

size_t ByteUnshuffleAvx2(const unsigned char* src, unsigned char* dst, size_t n,
                         size_t elem_size) noexcept {
  const size_t blocks = n / 16;
  if (elem_size == 2) {
    const __m128i m = GroupMask8();  // the inverse of GroupMask2
    for (size_t b = 0; b < blocks; ++b) {
      const __m128i r0 = Load(src + b * 16);
      const __m128i r1 = Load(src + n + b * 16);
      unsigned char* d = dst + b * 32;
      Store(d, _mm_shuffle_epi8(_mm_unpacklo_epi64(r0, r1), m));
      Store(d + 16, _mm_shuffle_epi8(_mm_unpackhi_epi64(r0, r1), m));
    }
  } else if (elem_size == 4) {
    const __m128i m = GroupMask4();  // its own inverse
    for (size_t b = 0; b < blocks; ++b) {
      __m128i v[4];
      for (int p = 0; p < 4; ++p) v[p] = Load(src + p * n + b * 16);
      Transpose4x32(v);
      unsigned char* d = dst + b * 64;
      for (int k = 0; k < 4; ++k) Store(d + 16 * k, _mm_shuffle_epi8(v[k], m));
    }
  } else if (elem_size == 8) {
    const __m128i m = GroupMask2();  // the inverse of GroupMask8
    for (size_t b = 0; b < blocks; ++b) {
      __m128i v[8];
      for (int p = 0; p < 8; ++p) v[p] = Load(src + p * n + b * 16);
      Transpose8x16(v);
      unsigned char* d = dst + b * 128;
      for (int k = 0; k < 8; ++k) Store(d + 16 * k, _mm_shuffle_epi8(v[k], m));
    }
  } else {
    return 0;
  }
  return blocks * 16;
}

}  // namespace strait::codec_internal
