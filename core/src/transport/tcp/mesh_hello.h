// The hello of a mesh connection: what a dialing rank claims, sent as the authenticated context
// of the handshake (bootstrap/auth.h), so that only a holder of the job's secret can claim a
// rank. 13 bytes, little-endian: u32 magic "HVD1", i32 rank, u8 kind, i32 target (the rank the
// dialer meant to reach: an address read from the store may be stale, e.g. an earlier engine's).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "hvd/status.h"

namespace hvd {

constexpr uint32_t kHelloMagic = 0x31445648;  // "HVD1"
constexpr uint8_t kKindData = 0, kKindControl = 1;
constexpr size_t kHelloBytes = 13;

struct Hello {
  uint32_t magic;
  int32_t rank;
  uint8_t kind;
  int32_t target;
};

inline std::string PackHello(const Hello& h) {
  std::string out(kHelloBytes, '\0');
  std::memcpy(&out[0], &h.magic, 4);
  std::memcpy(&out[4], &h.rank, 4);
  out[8] = static_cast<char>(h.kind);
  std::memcpy(&out[9], &h.target, 4);
  return out;
}

// `s` must hold kHelloBytes bytes.
inline Hello UnpackHello(const std::string& s) {
  Hello h;
  std::memcpy(&h.magic, s.data(), 4);
  std::memcpy(&h.rank, s.data() + 4, 4);
  h.kind = static_cast<uint8_t>(s[8]);
  std::memcpy(&h.target, s.data() + 9, 4);
  return h;
}

// The claim a connection accepted by rank `rank` of `size` may make: addressed to this rank
// (else InvalidArgument: a stale address), from a higher rank (every rank dials the lower ones),
// a data connection, or a control connection to rank 0 (else FailedPrecondition).
inline Status CheckHello(const Hello& h, int rank, int size) {
  if (h.magic != kHelloMagic || h.target != rank) {
    return Status::InvalidArgument("hello for rank " + std::to_string(h.target) + " reached rank " +
                                   std::to_string(rank) + " (a stale address?)");
  }
  if (h.rank <= rank || h.rank >= size || !(h.kind == kKindData || (h.kind == kKindControl && rank == 0))) {
    return Status::FailedPrecondition("unexpected hello (rank " + std::to_string(h.rank) +
                                      ", kind " + std::to_string(h.kind) + ") at rank " +
                                      std::to_string(rank));
  }
  return Status::OK();
}

}  // namespace hvd
