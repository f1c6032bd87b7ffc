// Chooses the codec's kernel table at run time: detects what the CPU and OS support (cpuid and
// xgetbv, so that an OS that does not save the wide registers is respected), lets
// STRAIT_CODEC_ISA lower the choice for testing and benchmarking, and reports the result.
//
// cpuid is read directly rather than through __builtin_cpu_supports because clang 14 does not
// know every feature name needed here (f16c), and the answer must not depend on the compiler.
#include <cstdlib>
#include <cstring>

#include "codec/kernels.h"
#include "codec/kernels_common.h"
#include "common/log.h"
#include "strait/codec.h"

#if STRAIT_CODEC_X86
#include <cpuid.h>
#endif

namespace strait::codec_internal {
namespace {

#if STRAIT_CODEC_X86
uint64_t ReadXcr0() {
  uint32_t eax = 0;
  uint32_t edx = 0;
  // xgetbv with ecx = 0; written as asm so that this file needs no -mxsave.
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

Isa DetectIsaUncached() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return Isa::kScalar;
  const bool osxsave = (ecx >> 27) & 1;
  const bool avx = (ecx >> 28) & 1;
  const bool f16c = (ecx >> 29) & 1;
  const bool popcnt = (ecx >> 23) & 1;
  if (!osxsave || !avx || !f16c || !popcnt) return Isa::kScalar;
  const uint64_t xcr0 = ReadXcr0();
  if ((xcr0 & 0x6) != 0x6) return Isa::kScalar;  // the OS saves XMM and YMM state

  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return Isa::kScalar;
  const bool bmi1 = (ebx >> 3) & 1;
  const bool avx2 = (ebx >> 5) & 1;
  const bool bmi2 = (ebx >> 8) & 1;
  if (!avx2 || !bmi1 || !bmi2) return Isa::kScalar;

  const bool avx512f = (ebx >> 16) & 1;
  const bool avx512dq = (ebx >> 17) & 1;
  const bool avx512bw = (ebx >> 30) & 1;
  const bool avx512vl = (ebx >> 31) & 1;
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;  // opmask, upper ZMM0-15, ZMM16-31
  if (avx512f && avx512dq && avx512bw && avx512vl && zmm_state) return Isa::kAvx512;
  return Isa::kAvx2;
}
#else
Isa DetectIsaUncached() {
  return Isa::kScalar;
}
#endif

Isa ActiveIsaUncached() {
  return ApplyIsaOverride(DetectIsa(), std::getenv("STRAIT_CODEC_ISA"));
}

}  // namespace

Isa ApplyIsaOverride(Isa detected, const char* value) noexcept {
  if (value == nullptr || *value == '\0') return detected;
  Isa wanted;
  if (std::strcmp(value, "scalar") == 0) {
    wanted = Isa::kScalar;
  } else if (std::strcmp(value, "avx2") == 0) {
    wanted = Isa::kAvx2;
  } else if (std::strcmp(value, "avx512") == 0) {
    wanted = Isa::kAvx512;
  } else {
    STRAIT_LOG(kWarn, "codec") << "ignoring STRAIT_CODEC_ISA=\"" << value
                               << "\": expected scalar, avx2 or avx512; using "
                               << IsaName(detected);
    return detected;
  }
  // Never above what the CPU has: the vector kernels would fault.
  return static_cast<int>(wanted) < static_cast<int>(detected) ? wanted : detected;
}

const char* IsaName(Isa isa) noexcept {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "invalid";
}

Isa DetectIsa() noexcept {
  static const Isa detected = DetectIsaUncached();
  return detected;
}

Isa ActiveIsa() noexcept {
  static const Isa active = ActiveIsaUncached();
  return active;
}

const KernelTable& KernelsFor(Isa isa) noexcept {
#if STRAIT_CODEC_X86
  // Callers may ask for any level; hand out at most what the CPU runs.
  const int level = static_cast<int>(isa) < static_cast<int>(DetectIsa())
                        ? static_cast<int>(isa)
                        : static_cast<int>(DetectIsa());
  if (level >= static_cast<int>(Isa::kAvx512)) return Avx512Kernels();
  if (level >= static_cast<int>(Isa::kAvx2)) return Avx2Kernels();
#else
  (void)isa;
#endif
  return ScalarKernels();
}

const KernelTable& ActiveKernels() noexcept {
  static const KernelTable& table = KernelsFor(ActiveIsa());
  return table;
}

}  // namespace strait::codec_internal

namespace strait {

const char* CodecIsaName() noexcept {
  return codec_internal::IsaName(codec_internal::ActiveIsa());
}

}  // namespace strait
