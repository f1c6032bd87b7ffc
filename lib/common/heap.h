// Giving freed heap memory back to the kernel after a burst of allocations. For long-running
// daemons whose memory use comes in bursts (straitd's WAN port under a flood of TLS handshakes):
// call ReleaseFreeHeap() once a burst has settled, not on a hot path.
//
// Why it is needed: glibc's malloc returns memory to the kernel only from the top of each arena.
// A burst of thousands of short-lived connections (~100 KiB of TLS and socket buffers each) grows
// the arena of the thread that served them by hundreds of MiB; a few small long-lived objects
// allocated in between (Asio's recycled descriptor states, OpenSSL's caches) keep the top in use,
// so the freed middle stays resident: straitd's RSS went 12 -> 281 -> 344 -> 371 MB over three
// floods of 3,000 connections with 0.9 MB actually in use. malloc_trim(0) walks every arena and
// returns the free pages in the middle as well (madvise), which the automatic trim never does.
#ifndef STRAIT_LIB_COMMON_HEAP_H_
#define STRAIT_LIB_COMMON_HEAP_H_

namespace strait {

// Returns the free pages of every malloc arena to the kernel (glibc's malloc_trim(0)). True when
// some memory was released. Thread-safe; takes each arena's lock in turn, so it costs
// milliseconds with hundreds of MiB free and briefly delays other threads' allocations. A no-op
// returning false where the C library has no such call (and harmless under sanitizers, whose
// allocator does not use glibc's arenas).
bool ReleaseFreeHeap() noexcept;

// For a process that allocates and frees multi-MiB buffers per operation (straitd's all-reduce
// frames, region parts, received messages): serve them from the heap and keep freed ones there
// for reuse (glibc: M_MMAP_THRESHOLD 64 MiB, M_TRIM_THRESHOLD 512 MiB) instead of mapping each
// afresh and unmapping it on free. By default glibc maps blocks above 128 KiB-32 MiB and trims
// the heap top at twice that, so every operation paid the page faults of its buffers again: on
// a loaded 2-core VM that was 5-10 ms per MiB, and the 64 MiB all-reduce of 3 regions x 2 ranks
// on strait-wanem went from 1.26 to 1.14 s (1.20 x its link floor) with these settings. What
// stays free in the heap goes back to the kernel with ReleaseFreeHeap (straitd calls it once a
// burst settles). Call before any thread starts; a no-op without glibc. Not for libraries that
// live in someone else's process (the NCCL plugin, libstrait): the host owns its allocator.
void KeepLargeBuffersInHeap() noexcept;

}  // namespace strait

#endif  // STRAIT_LIB_COMMON_HEAP_H_
