// A framed message channel on one TCP connection, for negotiation traffic.
//
// Frame: u32 length (of type + payload, little-endian, at most kMaxControlFrame), u8 type,
// payload. Reads run continuously from Start() on; every complete frame is handed to the
// message callback, a broken connection or an oversize frame to the error callback (once).
// Sends are queued and written in order; a write that fails ends the sending, and the read
// reports the broken connection (after the messages that came before it).
//
// Thread-safety: not thread-safe; used from the thread that runs the io_context. The channel
// keeps itself alive (shared_from_this) while an operation is in flight; Close() ends it.
#pragma once

#include <asio.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/control.h"

namespace hvd {

constexpr uint32_t kMaxControlFrame = 256u << 20;
constexpr size_t kControlHeaderBytes = 5;

// Reads a frame header: the bytes of the payload that follow it, and the message type. False,
// with the reason, for a length of 0 or over kMaxControlFrame.
bool ParseControlHeader(const uint8_t* header, uint32_t* payload_len, uint8_t* type,
                        std::string* why);

class ControlChannel : public ControlLink, public std::enable_shared_from_this<ControlChannel> {
 public:
  ControlChannel(int peer, std::unique_ptr<asio::ip::tcp::socket> sock, MessageFn on_message,
                 ErrorFn on_error);

  void Start();
  void Send(uint8_t type, std::shared_ptr<const std::vector<uint8_t>> payload) override;
  bool idle() const override { return queue_.empty(); }
  bool open() const override { return open_; }
  void Close() override;
  int peer() const override { return peer_; }

 private:
  struct Outgoing {
    uint8_t header[5];
    std::shared_ptr<const std::vector<uint8_t>> payload;
  };
  void ReadHeader();
  void ReadBody(uint32_t len);
  void WriteNext();
  void Fail(const std::string& what);

  const int peer_;
  std::unique_ptr<asio::ip::tcp::socket> sock_;
  MessageFn on_message_;
  ErrorFn on_error_;
  uint8_t header_[5];
  std::vector<uint8_t> body_;
  std::deque<Outgoing> queue_;
  bool writing_ = false;
  bool write_failed_ = false;  // the connection broke under a write: the read reports it
  bool open_ = true;
};

}  // namespace hvd
