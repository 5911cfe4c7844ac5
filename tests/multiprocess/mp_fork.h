// Forked worlds for fault tests: the test process hosts the rendezvous store, forks one child per
// rank, and collects what each child reported (key=value lines over a pipe) and how it ended.
// Every wait has a deadline; children carry an alarm() watchdog and the destructor SIGKILLs and
// reaps whatever is left, so a test can fail but never hang.
//
// Thread-safety: one thread (the test's).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hvd/options.h"

namespace mp {

// Writes "key=value\n" lines to the parent. Used in the child only.
class Reporter {
 public:
  explicit Reporter(int fd) : fd_(fd) {}
  void Say(const std::string& key, const std::string& value) const;

 private:
  int fd_;
};

struct ChildResult {
  pid_t pid = -1;
  bool reaped = false;
  int exit_code = -1;    // when it exited
  int term_signal = 0;   // when a signal ended it
  double seconds = -1;   // from Start() until it was reaped
  std::string output;    // everything it reported
  std::map<std::string, std::string> values;  // parsed key=value lines (last one wins)
};

class ForkedWorld {
 public:
  using Clock = std::chrono::steady_clock;
  // body(rank, options, reporter) runs in the child; its return value is the exit code.
  using Body = std::function<int(int rank, const hvd::Options& options, const Reporter& out)>;

  // Starts the store; `timeout_seconds` goes to every rank's Options.
  ForkedWorld(int size, double timeout_seconds);
  ~ForkedWorld();

  bool store_ok() const { return store_ok_; }
  // Forks the ranks. Returns false if a fork failed.
  bool Start(const Body& body);
  // Reads output and reaps until every rank in `ranks` has exited or `seconds` have passed.
  // Returns true if they all exited.
  bool Wait(const std::vector<int>& ranks, double seconds);
  bool WaitAll(double seconds);
  void Signal(int rank, int sig);
  // SIGKILLs and reaps every child that is still running.
  void KillAll();
  const ChildResult& result(int rank) const { return children_[rank]; }
  int size() const { return size_; }
  // Seconds since Start().
  double Elapsed() const;

 private:
  void Pump(int timeout_ms);
  void Reap();

  struct Impl;
  int size_;
  double timeout_seconds_;
  bool store_ok_ = false;
  std::unique_ptr<Impl> impl_;
  std::vector<ChildResult> children_;
  std::vector<int> fds_;
  Clock::time_point started_;
};

// Describes how a child ended, with its report, for assertion messages.
std::string Describe(const ChildResult& r);

}  // namespace mp
