// A short pause between looks at memory another thread or process writes, while spinning: a few
// dozen cycles on the core, with no syscall and no hand-over of the core.
//
// Thread-safety: stateless.
#pragma once

namespace hvd {

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
