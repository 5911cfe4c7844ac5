// Fuzzes the control channel as a rank reads it (transport/tcp/control_channel.h): a stream of
// frames, each decoded by its type the way the background thread does (engine/background.cc):
// request lists (with cache bits decoded at the sender's epoch), response lists (rebuilt from
// cache bits, then applied to the response cache), parts of rounds of the symmetric fast path
// (their bits read against the cache at their epoch, engine/rounds.cc), shutdown, abort and
// heartbeat messages.
// Whatever decodes must re-encode to bytes that decode to the same thing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "coordinator/messages.h"
#include "coordinator/response_cache.h"
#include "transport/tcp/control_channel.h"

using namespace hvd;

namespace {

// A cache holding a few entries, as after some training steps.
void Warm(ResponseCache* cache) {
  std::vector<Response> list;
  for (int i = 0; i < 6; ++i) {
    Response r;
    r.type = i % 3 == 2 ? OpType::kBroadcast : OpType::kAllreduce;
    r.names = {"grad." + std::to_string(i)};
    r.shapes = {{4, i + 1}};
    r.root = r.type == OpType::kBroadcast ? 0 : -1;
    list.push_back(r);
  }
  cache->Apply(list);
}

template <typename List>
void RoundTrip(const List& decoded) {
  std::vector<uint8_t> once = Encode(decoded);
  List again;
  if (!Decode(once.data(), once.size(), &again).ok()) std::abort();
  if (Encode(again) != once) std::abort();
}

void OnRequests(const uint8_t* p, size_t n, const ResponseCache& cache) {
  RequestList list;
  if (!Decode(p, n, &list).ok()) return;
  RoundTrip(list);
  if (list.cache_epoch > cache.epoch()) return;  // refused, as OnRequests does
  for (size_t w = 0; w < list.cached_bits.size() && w < 1024; ++w) {
    for (uint64_t word = list.cached_bits[w]; word; word &= word - 1) {
      Request r;
      (void)cache.Decode(static_cast<uint32_t>(w * 64 + __builtin_ctzll(word)), list.cache_epoch, &r);
    }
  }
}

void OnResponses(const uint8_t* p, size_t n, ResponseCache* cache) {
  ResponseList list;
  if (!Decode(p, n, &list).ok()) return;
  RoundTrip(list);
  for (auto& r : list.responses) {
    if (r.cache_bits.empty()) continue;
    std::vector<uint32_t> bits = std::move(r.cache_bits);
    if (!cache->Rebuild(bits, &r)) return;  // refused, as OnResponses does
  }
  for (const auto& r : list.responses) {
    hvd::Status s = CheckResponse(r, 4);
    if (!s.ok() && s.message().empty()) std::abort();
    if (!s.ok()) return;  // refused, as OnResponses does
  }
  cache->Apply(list.responses);
}

void OnRound(const uint8_t* p, size_t n, const ResponseCache& cache) {
  RoundContribution part;
  if (!Decode(p, n, &part).ok()) return;
  RoundTrip(part);
  if (part.cache_epoch > cache.epoch() || part.ready.size() > 1024) return;  // refused
  for (size_t w = 0; w < part.ready.size(); ++w) {
    for (uint64_t word = part.ready[w]; word; word &= word - 1) {
      const auto bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(word));
      if (cache.UnchangedSince(bit, part.cache_epoch) && cache.At(bit) == nullptr) std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ResponseCache worker(4, /*keep_history=*/false), coordinator(4, /*keep_history=*/true);
  Warm(&worker);
  Warm(&coordinator);
  size_t pos = 0;
  while (size - pos >= kControlHeaderBytes) {
    uint32_t len;
    uint8_t type;
    std::string why;
    if (!ParseControlHeader(data + pos, &len, &type, &why)) {
      if (why.empty()) std::abort();
      break;  // the channel fails
    }
    pos += kControlHeaderBytes;
    if (len > size - pos) break;  // the rest has not arrived
    const uint8_t* p = data + pos;
    pos += len;
    switch (static_cast<MessageType>(type)) {
      case MessageType::kRequests:
        OnRequests(p, len, coordinator);
        break;
      case MessageType::kResponses:
        OnResponses(p, len, &worker);
        break;
      case MessageType::kRound:
        OnRound(p, len, worker);
        break;
      case MessageType::kShutdown:
        if (len == 4) {
          int32_t by;
          std::memcpy(&by, p, 4);
          (void)by;
        }
        break;
      case MessageType::kAbort:
        (void)std::string(reinterpret_cast<const char*>(p), len);
        break;
      default:  // kHeartbeat carries nothing; other types fail the channel
        break;
    }
  }
  return 0;
}
