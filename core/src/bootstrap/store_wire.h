// Framing helpers for the rendezvous store protocol (see store.h for the wire format).
// Shared by the client and the server; no I/O here, only bytes.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hvd {
namespace store_wire {

constexpr uint32_t kMaxPayload = 16u << 20;  // 16 MiB
constexpr uint32_t kMaxKey = 4u << 10;       // 4 KiB
constexpr size_t kHeaderBytes = 4;
constexpr char kOpSet = 'S';
constexpr char kOpGet = 'G';
constexpr char kOpTryGet = 'T';
constexpr uint8_t kCodeOk = 0;
constexpr uint8_t kCodeAbsent = 1;  // answer to a TryGet of a key that does not exist

inline void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

inline uint32_t GetU32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// frame = u32 length, payload.
inline std::string Frame(const std::string& payload) {
  std::string out;
  out.reserve(kHeaderBytes + payload.size());
  PutU32(&out, static_cast<uint32_t>(payload.size()));
  out += payload;
  return out;
}

// request payload = u8 op, u32 key_length, key, value.
inline std::string RequestPayload(char op, const std::string& key, const std::string& value) {
  std::string out;
  out.reserve(1 + 4 + key.size() + value.size());
  out.push_back(op);
  PutU32(&out, static_cast<uint32_t>(key.size()));
  out += key;
  out += value;
  return out;
}

struct Request {
  char op = 0;
  std::string key;
  std::string value;
};

// Parses a request payload; returns false (with a reason) on an unknown op, a short payload
// or a key longer than kMaxKey.
inline bool ParseRequest(const std::string& payload, Request* req, std::string* why) {
  if (payload.size() < 5) {
    *why = "request shorter than 5 bytes";
    return false;
  }
  req->op = payload[0];
  if (req->op != kOpSet && req->op != kOpGet && req->op != kOpTryGet) {
    *why = "unknown op byte " + std::to_string(static_cast<unsigned char>(req->op));
    return false;
  }
  uint32_t key_len = GetU32(reinterpret_cast<const unsigned char*>(payload.data()) + 1);
  if (key_len > kMaxKey) {
    *why = "key of " + std::to_string(key_len) + " bytes exceeds 4 KiB";
    return false;
  }
  if (payload.size() - 5 < key_len) {
    *why = "key length past the end of the frame";
    return false;
  }
  req->key.assign(payload, 5, key_len);
  req->value.assign(payload, 5 + key_len, std::string::npos);
  if (req->op != kOpSet && !req->value.empty()) {
    *why = "get request carries a value";
    return false;
  }
  return true;
}

}  // namespace store_wire
}  // namespace hvd
