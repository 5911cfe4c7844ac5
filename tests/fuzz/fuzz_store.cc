// Fuzzes what the rendezvous store server reads from a client after the handshake: a stream of
// frames (u32 length, payload) whose payloads are parsed as requests (bootstrap/store_wire.h).
// A parsed request must re-encode to the same payload; a rejected one must say why.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "bootstrap/store_wire.h"

using namespace hvd::store_wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t pos = 0;
  while (size - pos >= kHeaderBytes) {
    const uint32_t len = GetU32(data + pos);
    pos += kHeaderBytes;
    if (len > kMaxPayload) break;        // the server closes the connection
    if (len > size - pos) break;         // a frame cut short: the server waits, then drops it
    const std::string payload(reinterpret_cast<const char*>(data + pos), len);
    pos += len;
    Request req;
    std::string why;
    if (!ParseRequest(payload, &req, &why)) {
      if (why.empty()) std::abort();
      break;  // the server closes the connection
    }
    if (req.key.size() > kMaxKey) std::abort();
    if (RequestPayload(req.op, req.key, req.value) != payload) std::abort();
    if (Frame(payload).size() != kHeaderBytes + payload.size()) std::abort();
  }
  return 0;
}
