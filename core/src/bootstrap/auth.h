// Authentication of every connection of a job (rendezvous store, control, data) by a
// challenge-response proof of the job's secret (HVD_SECRET), with HMAC-SHA256 from OpenSSL.
//
// Handshake (the accepting side is the server; `context` is what the client claims, e.g. its
// rank and the connection's kind, so a proof cannot be reused for another claim):
//   1. server -> client: Ns, 16 fresh random bytes.
//   2. client -> server: context, Nc (16 fresh random bytes),
//                        HMAC(secret, "hvd client" | Ns | Nc | context).
//   3. The server checks the proof (constant-time compare). A wrong proof or a short read is
//      answered with the verdict byte 'R' (refused), then the connection is closed.
//   4. The server checks the claim (optional, e.g. that the client meant this rank). Refused:
//      verdict 'C', then close. Accepted: verdict 'A' and HMAC(secret, "hvd server" | Nc | Ns |
//      context); the client checks the MAC, so it knows it reached the job, and the peer it
//      meant, not an impostor or a stale address.
// A recorded handshake replayed later fails at step 3: the server's Ns is new every time.
//
// Deadlines. The server gives a connection until the caller's handshake deadline to complete
// steps 1-3 and then closes it without a verdict. That deadline is the job's start timeout,
// not a few seconds: a legitimate rank on a loaded machine may be slow, and only a stranger
// stays silent that long. A client that sees its connection closed before any verdict (a
// dropped connection, not a refusal) reports `dropped` so that its caller reconnects; 'R' and
// 'C' are final answers. Until step 1 arrives the client's connection carries TCP keepalive
// probes, 1 s apart: a connection the server's listener closed on without taking it has nothing
// behind it, and the reset the first probe draws counts as dropped, not a wait to the deadline.
//
// Nonces come from getrandom(2), which holds no user-space lock: a process forked from a
// multi-threaded parent can still handshake.
//
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
// How long a server waits for a client's proof when its caller has no start deadline of its own.
constexpr auto kDefaultHandshakeTimeout = std::chrono::seconds(30);
constexpr uint8_t kVerdictAccepted = 'A', kVerdictRefused = 'R', kVerdictClaimRefused = 'C';
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

Nonce RandomNonce();
Mac Proof(const std::string& secret, const char* role, const Nonce& first, const Nonce& second,
          const std::string& context);
bool Equal(const Mac& a, const Mac& b);
// Lower-case hex of n bytes (2n characters).
std::string Hex(const uint8_t* data, size_t n);

// Step 3 on bytes: `msg` should be context (context_len bytes), Nc, the client's MAC for the
// challenge `ns`. OK with the context and Nc when the MAC proves the secret; InvalidArgument
// otherwise (a wrong length included).
Status CheckClientProof(const std::string& secret, const Nonce& ns, const uint8_t* msg, size_t len,
                        size_t context_len, std::string* context, Nonce* nc);

// The client's reading of the server's verdict byte: OK for kVerdictAccepted, else the final
// refusal it stands for.
Status VerdictStatus(uint8_t verdict);

// Server side (steps 1, 3, 4). Calls done(status, context) once: OK with the client's context
// of exactly context_len bytes, or an error saying why the client was refused. `keepalive`
// holds the socket's owner alive until then. A client that has not sent its proof within
// `timeout` is dropped (Timeout).
using AcceptFn = std::function<void(const Status&, const std::string& context)>;
using ContextCheck = std::function<Status(const std::string& context)>;
void AcceptHandshake(asio::ip::tcp::socket& sock, const std::string& secret, size_t context_len,
                     std::shared_ptr<void> keepalive, AcceptFn done, ContextCheck check = nullptr,
                     Clock::duration timeout = kDefaultHandshakeTimeout);

// Client side (step 2 and the check of step 4), blocking until the deadline. When it fails
// because the server closed the connection before giving a verdict, *dropped (if given) is set:
// the caller may reconnect and try again within its deadline.
Status ClientHandshake(asio::io_context& io, asio::ip::tcp::socket& sock,
                       const std::string& secret, const std::string& context, Deadline deadline,
                       bool* dropped = nullptr);

}  // namespace auth
}  // namespace hvd
