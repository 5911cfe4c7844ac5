// Busy-wait helpers shared by the engine's and the transports' polling loops.
#pragma once

namespace hvd {

// A short pause between looks at memory another process or thread writes: cheaper than a
// syscall, and it lets the sibling hyperthread run.
inline void CpuRelax() {
  for (int i = 0; i < 16; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
}

}  // namespace hvd
