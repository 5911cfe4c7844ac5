// Forked worlds for fault tests: a child process hosts the rendezvous store, the test process
// forks one child per rank, and collects what each child reported (key=value lines over a pipe)
// and how it ended. Every wait has a deadline; children carry an alarm() watchdog and the
// destructor SIGKILLs and reaps whatever is left, so a test can fail but never hang.
//
// Why the store lives in a process of its own: fork() copies only the calling thread. Had the
// test process a store thread, a lock that thread held at the moment of a fork (OpenSSL's
// random generator lock, taken for every handshake) would stay locked forever in the rank,
// which then hangs in its own handshake. The ranks are forked from a single-threaded process,
// and Start() checks that it is.
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

// A rendezvous store served by a child process (see above). The child dies with the test
// process (PR_SET_PDEATHSIG) and is SIGKILLed and reaped by the destructor.
class StoreProcess {
 public:
  explicit StoreProcess(const std::string& secret = "");
  ~StoreProcess();
  StoreProcess(const StoreProcess&) = delete;
  StoreProcess& operator=(const StoreProcess&) = delete;
  bool ok() const { return port_ > 0; }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

// Threads of the calling process (from /proc/self/status); -1 if unknown.
int ThreadCount();

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

  // Starts the store; `timeout_seconds` and `secret` go to every rank's Options.
  ForkedWorld(int size, double timeout_seconds, const std::string& secret = "");
  ~ForkedWorld();

  bool store_ok() const { return store_ok_; }
  // Forks the ranks. Returns false if a fork failed or the process has other threads.
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

  int size_;
  double timeout_seconds_;
  std::string secret_;
  bool store_ok_ = false;
  StoreProcess store_;
  std::vector<ChildResult> children_;
  std::vector<int> fds_;
  Clock::time_point started_;
};

// The last value a child reported for `key`, or "" if it reported none.
std::string Value(const ChildResult& r, const std::string& key);

// Describes how a child ended, with its report, for assertion messages.
std::string Describe(const ChildResult& r);

}  // namespace mp
