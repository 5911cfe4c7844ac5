// The rendezvous store: a small key-value service that ranks use to find each other.
// hvdrun hosts the server for the job; every rank connects as a client.
//
// Every connection starts with the authentication handshake of bootstrap/auth.h (context
// "store"); then the wire protocol (TCP, all integers little-endian):
//   frame    = u32 payload_length, payload            (payload_length <= 16 MiB)
//   request  = u8 op, u32 key_length, key, value       op 'S' set (value = rest of payload)
//                                                      op 'G' get (value empty): the server
//                                                      answers once the key exists
//                                                      op 'T' try-get (value empty): answered
//                                                      at once, code 1 when the key is absent
//   response = u8 code, value                          code 0 ok (value for 'G' and 'T', empty
//                                                      for 'S'); code 1 absent ('T' only)
// A frame that is too long, an unknown op or a key longer than 4 KiB is answered by closing
// the connection; the server logs it and goes on serving the others.
//
// Thread-safety: StoreClient is used by one thread at a time; StoreServer runs on its own
// thread and its methods may be called from any thread.
#pragma once

#include <memory>
#include <string>

#include "common/time.h"
#include "hvd/status.h"

namespace hvd {

// Where a rank whose job another rank's failure ended says so, for hvdrun to name the rank
// that failed first rather than the one that exited first: the value is that rank's status.
inline std::string FailureNoteKey(int rank) { return "hvd/failed/" + std::to_string(rank); }
// Where a rank publishes the address its peers connect to, as its hvd joins the job (hvdrun
// reads it too: a rank whose address is there had started hvd).
inline std::string RankAddressKey(int rank) { return "hvd/addr/" + std::to_string(rank); }

class StoreClient {
 public:
  virtual ~StoreClient() = default;
  // Retries the connection until the deadline (the server may still be starting, or may have
  // dropped a slow handshake). Every connection proves knowledge of `secret` to the server and
  // checks the server's proof (bootstrap/auth.h); a wrong secret fails at once with PeerLost.
  static StatusOr<std::unique_ptr<StoreClient>> Connect(const std::string& host, int port,
                                                        Deadline deadline,
                                                        const std::string& secret = "");
  virtual Status Set(const std::string& key, const std::string& value, Deadline deadline) = 0;
  // Whether Set is a collective call that every rank makes together (the MPI bootstrap's
  // allgather), rather than one rank's own write.
  virtual bool collective() const { return false; }
  // Blocks until the key exists or the deadline passes (Timeout naming the key).
  virtual StatusOr<std::string> Get(const std::string& key, Deadline deadline) = 0;
  // Answers at once: true with *value when the key exists, false when it does not. A store
  // that cannot (the MPI bootstrap's) fails with FailedPrecondition.
  virtual StatusOr<bool> TryGet(const std::string& key, std::string* value, Deadline deadline);
};

class StoreServer {
 public:
  virtual ~StoreServer() = default;  // stops the server
  // port 0 picks a free port. A client that does not prove knowledge of `secret` within
  // `handshake_timeout_seconds` is dropped and logged (bootstrap/auth.h): pass the job's start
  // timeout, so that a rank slowed by a loaded machine is never taken for a stranger.
  static StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& bind_addr, int port,
                                                      const std::string& secret = "",
                                                      double handshake_timeout_seconds = 30);
  virtual int port() const = 0;
  virtual void Stop() = 0;
  // Any thread: the key's value as it is now, without a connection (the process that hosts the
  // store reads it directly, however busy the store is). False when the key is not set.
  virtual bool Lookup(const std::string& key, std::string* value) const = 0;
};

}  // namespace hvd
