// The hello of a mesh connection: what a dialing rank claims, sent as the authenticated context
// of the handshake (bootstrap/auth.h), so that only a holder of the job's secret can claim a
// rank. 17 bytes, little-endian: u32 magic "HVD1", i32 rank, u8 kind, i32 target (the rank the
// dialer meant to reach: an address read from the store may be stale, e.g. an earlier engine's),
// i32 size (the world the dialer was started in: a rank given another HVD_SIZE is named).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "hvd/status.h"

namespace hvd {

constexpr uint32_t kHelloMagic = 0x31445648;  // "HVD1"
// A data connection from a rank that also makes control connections to the workers
// (WorkerLinks) says so: a rank that decides otherwise fails set-up at once, naming the knob.
constexpr uint8_t kKindData = 0, kKindControl = 1, kKindDataWorkerLinks = 2;
inline bool IsData(uint8_t kind) { return kind == kKindData || kind == kKindDataWorkerLinks; }
constexpr size_t kHelloBytes = 17;

struct Hello {
  uint32_t magic;
  int32_t rank;
  uint8_t kind;
  int32_t target;
  int32_t size;
};

inline std::string PackHello(const Hello& h) {
  std::string out(kHelloBytes, '\0');
  std::memcpy(&out[0], &h.magic, 4);
  std::memcpy(&out[4], &h.rank, 4);
  out[8] = static_cast<char>(h.kind);
  std::memcpy(&out[9], &h.target, 4);
  std::memcpy(&out[13], &h.size, 4);
  return out;
}

// `s` must hold kHelloBytes bytes.
inline Hello UnpackHello(const std::string& s) {
  Hello h;
  std::memcpy(&h.magic, s.data(), 4);
  std::memcpy(&h.rank, s.data() + 4, 4);
  h.kind = static_cast<uint8_t>(s[8]);
  std::memcpy(&h.target, s.data() + 9, 4);
  std::memcpy(&h.size, s.data() + 13, 4);
  return h;
}

// With HVD_SYMMETRIC_NEGOTIATION=on (`wanted`) and up to this many ranks, every pair of ranks
// has a control connection, not only each worker and rank 0: the links between workers carry
// the symmetric fast path's rounds (engine/rounds.cc) across hosts. Above it a rank would hold
// twice the sockets (a data and a control connection per peer), and a round's N x (N-1)
// messages cost more than the coordinator's 2 x (N-1). Every rank must decide alike (the same
// knob): a rank that expects a link another does not make says so when set-up times out.
constexpr int kWorkerLinksUpTo = 32;
inline bool WorkerLinks(int size, bool wanted) {
  return wanted && size > 2 && size <= kWorkerLinksUpTo;
}

// The claim a connection accepted by rank `rank` of `size` may make: addressed to this rank
// (else InvalidArgument: a stale address), from a higher rank (every rank dials the lower ones),
// a data connection (either kind), or a control connection to rank 0 (to any rank with
// `worker_links`) (else FailedPrecondition). A dialer of another world size passes, so that the
// acceptor can name it (its other claims are of that world).
inline Status CheckHello(const Hello& h, int rank, int size, bool worker_links = false) {
  if (h.magic != kHelloMagic || h.target != rank) {
    return Status::InvalidArgument("hello for rank " + std::to_string(h.target) + " reached rank " +
                                   std::to_string(rank) + " (a stale address?)");
  }
  if (h.size != size) return Status::OK();
  const bool control_ok = rank == 0 || worker_links;
  if (h.rank <= rank || h.rank >= size ||
      !(IsData(h.kind) || (h.kind == kKindControl && control_ok))) {
    return Status::FailedPrecondition("unexpected hello (rank " + std::to_string(h.rank) +
                                      ", kind " + std::to_string(h.kind) + ") at rank " +
                                      std::to_string(rank));
  }
  return Status::OK();
}

}  // namespace hvd
