// Deadlines: every wait in hvd has one.
#pragma once

#include <chrono>

namespace hvd {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline DeadlineAfterSeconds(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}
inline Deadline NoDeadline() { return Deadline::max(); }

}  // namespace hvd
