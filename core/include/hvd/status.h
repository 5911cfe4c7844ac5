// Status and StatusOr: how every fallible call inside hvd reports failure.
//
// Thread-safety: value types; a const Status may be read from any thread.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

#include "hvd/export.h"

namespace hvd {

// Which errors are recoverable:
//   kInvalidArgument, kFailedPrecondition  the call or its tensor was wrong; the engine goes on.
//   kTimeout                               a wait with a deadline ran out; for Handle::WaitFor the
//                                          operation is still pending, inside a collective the
//                                          communicator is gone (a peer stopped answering); also
//                                          the stall shutdown (HVD_STALL_SHUTDOWN_TIME_SECONDS),
//                                          which ends the engine on every rank.
//   kPeerLost                              a rank died or its connection broke: the communicator
//                                          is gone, every pending and later operation fails.
//   kAborted                               the engine was shut down or aborted.
//   kInternal                              a bug or a failed system call.
//   kResourceExhausted                     a rank could not allocate the memory an operation
//                                          needs; that operation fails on every rank (on that
//                                          rank alone for a host output under 1 MiB that its
//                                          OutputAllocator did not give), the engine goes on.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kFailedPrecondition,
  kTimeout,
  kPeerLost,
  kAborted,
  kInternal,
  kResourceExhausted,
};

HVD_EXPORT const char* StatusCodeName(StatusCode code);

class HVD_EXPORT Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
  static Status PeerLost(std::string m) { return {StatusCode::kPeerLost, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "PeerLost: rank 3 ..." or "OK".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class StatusOr {
 public:
  StatusOr(Status s) : status_(std::move(s)) { assert(!status_.ok()); }  // NOLINT
  StatusOr(T value) : value_(std::move(value)) {}                       // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace hvd

#define HVD_RETURN_IF_ERROR(expr)          \
  do {                                     \
    ::hvd::Status _hvd_st = (expr);        \
    if (!_hvd_st.ok()) return _hvd_st;     \
  } while (0)
