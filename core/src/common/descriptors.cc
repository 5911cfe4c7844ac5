#include "common/descriptors.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>

namespace hvd {

unsigned long RaiseDescriptorLimit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return 0;
  if (files.rlim_cur < files.rlim_max) {
    rlimit raised = files;
    raised.rlim_cur = std::min<rlim_t>(files.rlim_max, rlim_t{1} << 20);
    if (raised.rlim_cur > files.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      files = raised;
    }
  }
  return files.rlim_cur == RLIM_INFINITY ? 0 : static_cast<unsigned long>(files.rlim_cur);
}

size_t AuthenticatingCap(size_t most) {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY) return most;
  const size_t quarter = std::max<size_t>(16, static_cast<size_t>(files.rlim_cur / 4));
  return std::min(most, quarter);
}

std::string DescriptorLimitNote(int err) {
  if (err == ENFILE) return " (the system's table of open files is full)";
  if (err != EMFILE) return "";
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY) {
    return " (this process is out of file descriptors: raise `ulimit -n`)";
  }
  const std::string most = " (this process may hold at most " + std::to_string(files.rlim_cur) +
                           " open descriptors";
  // hvd took the hard limit as the soft one where it could (RaiseDescriptorLimit).
  return most + (files.rlim_cur == files.rlim_max ? ", its hard limit: raise `ulimit -Hn`)"
                                                  : ": raise `ulimit -n`)");
}

}  // namespace hvd
