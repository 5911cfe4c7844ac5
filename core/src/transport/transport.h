// The point-to-point interface that every collective algorithm is written against.
//
// Semantics (like MPI's Isend/Irecv on one communicator):
//   - Bytes sent to one peer arrive in the order their sends were posted; receives posted for
//     one peer are filled in the order they were posted. A receive of len bytes matches exactly
//     the next len bytes of the stream from that peer (callers post matching lengths).
//   - A posted buffer must stay valid and untouched until its request has completed.
//   - A request for a peer outside [0, size) or for this rank itself fails with
//     InvalidArgument when it is waited for.
//   - Wait/WaitAll drive progress for every posted request, not only the awaited ones.
//   - A broken connection fails every pending and later request to or from that peer with
//     PeerLost naming the peer's rank; a passed deadline fails with Timeout naming the peers
//     still awaited. After either, the transport is unusable (the communicator is gone).
//
// Thread-safety: not thread-safe; used by one thread at a time, the one running the engine's
// work (the background thread or a waiting caller; engine/engine_impl.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "common/time.h"
#include "hvd/status.h"

namespace hvd {

class CollectiveOffload;  // transport/collective_offload.h

struct TransportRequest {
  uint64_t id = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual TransportRequest Isend(int peer, const void* buf, size_t len) = 0;
  virtual TransportRequest Irecv(int peer, void* buf, size_t len) = 0;

  // Waits until request `r` has completed (OK) or failed, or the deadline passed.
  virtual Status Wait(TransportRequest r, Deadline deadline) = 0;

  // Fails every pending and later request with `why` (the first reason given is kept) and
  // releases the connections: the communicator is gone. Idempotent; may be called from inside
  // a handler that runs during a Wait.
  virtual void Abort(const Status& why) = 0;

  // Waits for all of `rs`; returns the first failure.
  Status WaitAll(const std::vector<TransportRequest>& rs, Deadline deadline) {
    for (const auto& r : rs) HVD_RETURN_IF_ERROR(Wait(r, deadline));
    return Status::OK();
  }

  // Blocking conveniences.
  Status Send(int peer, const void* buf, size_t len, Deadline d) { return Wait(Isend(peer, buf, len), d); }
  Status Recv(int peer, void* buf, size_t len, Deadline d) { return Wait(Irecv(peer, buf, len), d); }
  // Sends to `send_peer` and receives from `recv_peer` at once (no deadlock on rings).
  Status SendRecv(int send_peer, const void* sbuf, size_t slen, int recv_peer, void* rbuf,
                  size_t rlen, Deadline d) {
    TransportRequest s = Isend(send_peer, sbuf, slen);
    TransportRequest r = Irecv(recv_peer, rbuf, rlen);
    Status st = Wait(r, d);
    Status st2 = Wait(s, d);
    return st.ok() ? st2 : st;
  }

  // The backend that runs whole collectives over this transport's ranks instead of hvd's
  // algorithms (HVD_CPU_OPERATIONS=mpi), or null. Not owned: the engine owns it and keeps it
  // alive as long as this transport.
  CollectiveOffload* offload() const { return offload_; }
  void set_offload(CollectiveOffload* offload) { offload_ = offload; }

 private:
  CollectiveOffload* offload_ = nullptr;
};

// For transports with a progress window (a deadline bounds how long a peer may stall, not how
// long a large transfer may take): the wait's deadline stretched to a window after the last
// time bytes moved to or from its peer.
inline Deadline Stretched(Deadline deadline, Clock::time_point moved, Clock::duration window) {
  return window.count() > 0 ? std::max(deadline, moved + window) : deadline;
}

// The Timeout message of a wait that ran past its (stretched) deadline. `via` names the path
// ("" for TCP).
inline std::string StallMessage(bool is_send, size_t len, int peer, const std::string& via,
                                Clock::duration window) {
  std::ostringstream os;
  os << "timed out " << (is_send ? "sending " : "receiving ") << len << " bytes "
     << (is_send ? "to" : "from") << " rank " << peer << via;
  if (window.count() > 0) {
    os << ": no bytes moved either way for " << std::chrono::duration<double>(window).count()
       << " s";
  }
  os << " (the peer stopped making progress; see HVD_TIMEOUT_SECONDS)";
  return os.str();
}

}  // namespace hvd
