// Authentication of every connection of a job (rendezvous store, control, data) by a
// challenge-response proof of the job's secret (HVD_SECRET), with HMAC-SHA256 from OpenSSL.
//
// Handshake (the accepting side is the server; `context` is what the client claims, e.g. its
// rank and the connection's kind, so a proof cannot be reused for another claim):
//   1. server -> client: Ns, 16 fresh random bytes.
//   2. client -> server: context, Nc (16 fresh random bytes),
//                        HMAC(secret, "hvd client" | Ns | Nc | context).
//   3. The server checks the proof (constant-time compare). A wrong proof, a short read or no
//      proof within the timeout closes the connection; the server logs it and goes on.
//   4. If the server accepts the claim (an optional check of the context, e.g. that the client
//      meant this rank), server -> client: HMAC(secret, "hvd server" | Nc | Ns | context); the
//      client checks it, so it knows it reached the job, and the peer it meant, not an impostor
//      or a stale address. Otherwise the server closes the connection.
// A recorded handshake replayed later fails at step 3: the server's Ns is new every time.
//
// Thread-safety: AcceptHandshake runs on the socket's io_context thread; ClientHandshake runs
// the given io_context on the calling thread until done or the deadline.
#pragma once

#include <array>
#include <asio.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/time.h"
#include "hvd/status.h"

namespace hvd {
namespace auth {

constexpr size_t kNonceBytes = 16;
constexpr size_t kMacBytes = 32;
constexpr auto kHandshakeTimeout = std::chrono::seconds(5);
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

Nonce RandomNonce();
Mac Proof(const std::string& secret, const char* role, const Nonce& first, const Nonce& second,
          const std::string& context);
bool Equal(const Mac& a, const Mac& b);

// Server side (steps 1, 3, 4). Calls done(status, context) once: OK with the client's context
// of exactly context_len bytes, or an error saying why the client was refused. `keepalive`
// holds the socket's owner alive until then.
using AcceptFn = std::function<void(const Status&, const std::string& context)>;
using ContextCheck = std::function<Status(const std::string& context)>;
void AcceptHandshake(asio::ip::tcp::socket& sock, const std::string& secret, size_t context_len,
                     std::shared_ptr<void> keepalive, AcceptFn done,
                     ContextCheck check = nullptr);

// Client side (step 2 and the check of step 4), blocking until the deadline.
Status ClientHandshake(asio::io_context& io, asio::ip::tcp::socket& sock,
                       const std::string& secret, const std::string& context, Deadline deadline);

}  // namespace auth
}  // namespace hvd
