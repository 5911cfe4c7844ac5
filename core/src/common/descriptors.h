// The process's limit on open file descriptors (RLIMIT_NOFILE).
//
// A rank holds one or more descriptors per peer (its TCP links, and for a peer on its host the
// segment's bell and the process watch), and hvdrun about three per rank it starts. The usual
// soft limit of 1,024 would end a large job where it forms, with a rank that cannot accept or
// dial a connection. hvdrun and every engine take the hard limit as their soft one, as Go's and
// Java's runtimes do; where the hard limit itself is too low, messages about a failed accept,
// dial or descriptor passing name the limit (DescriptorLimitNote).
//
// Thread-safety: any thread.
#pragma once

#include <cstddef>
#include <string>

namespace hvd {

// Raises the soft limit to the hard one (at most 2^20, the kernel's usual nr_open, even under an
// unlimited hard limit). Returns the soft limit in force after it (0: unknown).
unsigned long RaiseDescriptorLimit();

// What to append to a message about an error `err` (an errno value): for EMFILE, the limit
// and how to raise it; for ENFILE, that the system's table is full; otherwise "".
std::string DescriptorLimitNote(int err);

// How many connections a listener of this process lets authenticate at once: `most`, or a
// quarter of the soft limit where that is fewer (at least 16). Strangers that hold silent
// connections then leave the process the descriptors its own work needs: hvdrun's pipes to the
// ranks it starts beside its store, a rank's links beside its listener.
size_t AuthenticatingCap(size_t most);

}  // namespace hvd
