// Fuzzes the authentication handshake as the accepting side reads it (bootstrap/auth.h): the
// client's message for a challenge, with the store's 5-byte context or a mesh hello
// (transport/tcp/mesh_hello.h) as the claim, and the verdict byte as a client reads it.
//
// Input: byte 0 picks the context length (store or hello), byte 1 the verdict, the rest is the
// client's message. Without the secret, no input may be accepted; a correct message built from
// the input's context must be, and its hello must check as the context says.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bootstrap/auth.h"
#include "transport/tcp/mesh_hello.h"

namespace auth = hvd::auth;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t context_len = (data[0] & 1) ? hvd::kHelloBytes : 5;
  (void)auth::VerdictStatus(data[1]);
  if ((data[1] == auth::kVerdictAccepted) != auth::VerdictStatus(data[1]).ok()) std::abort();
  const uint8_t* msg = data + 2;
  const size_t len = size - 2;
  const std::string secret = "fuzz-secret";
  auth::Nonce ns{};
  for (size_t i = 0; i < ns.size(); ++i) ns[i] = static_cast<uint8_t>(i * 7);
  std::string context;
  auth::Nonce nc{};
  // Random bytes never prove the secret (a forged MAC would need 2^256 tries).
  if (auth::CheckClientProof(secret, ns, msg, len, context_len, &context, &nc).ok()) std::abort();
  // The same claim with a correct proof is accepted and yields the claim back.
  if (len >= context_len + auth::kNonceBytes) {
    std::string claim(reinterpret_cast<const char*>(msg), context_len);
    std::memcpy(nc.data(), msg + context_len, auth::kNonceBytes);
    auth::Mac mac = auth::Proof(secret, "hvd client", ns, nc, claim);
    std::string good = claim;
    good.append(reinterpret_cast<const char*>(nc.data()), nc.size());
    good.append(reinterpret_cast<const char*>(mac.data()), mac.size());
    std::string got;
    auth::Nonce got_nc{};
    if (!auth::CheckClientProof(secret, ns, reinterpret_cast<const uint8_t*>(good.data()),
                                good.size(), context_len, &got, &got_nc)
             .ok() ||
        got != claim || got_nc != nc) {
      std::abort();
    }
    if (context_len == hvd::kHelloBytes) {
      hvd::Hello h = hvd::UnpackHello(got);
      if (hvd::PackHello(h) != got) std::abort();
      for (int rank : {0, 1, 5}) {
        for (bool links : {false, true}) {
          hvd::Status s = hvd::CheckHello(h, rank, 8, links);
          // (A hello of another world size passes, for the acceptor to name.)
          bool want = h.magic == hvd::kHelloMagic && h.target == rank &&
                      (h.size != 8 ||
                       (h.rank > rank && h.rank < 8 &&
                        (h.kind == hvd::kKindData || h.kind == hvd::kKindDataWorkerLinks ||
                         (h.kind == hvd::kKindControl && (rank == 0 || links)))));
          if (s.ok() != want) std::abort();
        }
      }
    }
  }
  return 0;
}
