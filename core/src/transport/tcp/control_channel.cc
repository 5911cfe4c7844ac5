#include "transport/tcp/control_channel.h"

#include <cstring>

#include "transport/tcp/connection_error.h"

namespace hvd {

ControlChannel::ControlChannel(int peer, std::unique_ptr<asio::ip::tcp::socket> sock,
                               MessageFn on_message, ErrorFn on_error)
    : peer_(peer), sock_(std::move(sock)), on_message_(std::move(on_message)),
      on_error_(std::move(on_error)) {}

bool ParseControlHeader(const uint8_t* header, uint32_t* payload_len, uint8_t* type,
                        std::string* why) {
  uint32_t len;
  std::memcpy(&len, header, 4);
  if (len == 0 || len > kMaxControlFrame) {
    *why = "bad control frame length " + std::to_string(len);
    return false;
  }
  *payload_len = len - 1;
  *type = header[4];
  return true;
}

void ControlChannel::Start() { ReadHeader(); }

void ControlChannel::ReadHeader() {
  auto self = shared_from_this();
  asio::async_read(*sock_, asio::buffer(header_, sizeof(header_)),
                   [this, self](const asio::error_code& ec, size_t) {
                     if (!open_) return;
                     if (ec) {
                       return Fail(ConnectionErrorText(ec));
                     }
                     uint32_t len;
                     uint8_t type;
                     std::string why;
                     if (!ParseControlHeader(header_, &len, &type, &why)) return Fail(why);
                     ReadBody(len);
                   });
}

void ControlChannel::ReadBody(uint32_t len) {
  body_.resize(len);
  auto self = shared_from_this();
  asio::async_read(*sock_, asio::buffer(body_), [this, self](const asio::error_code& ec, size_t) {
    if (!open_) return;
    if (ec) return Fail(ConnectionErrorText(ec));
    std::vector<uint8_t> payload;
    payload.swap(body_);
    on_message_(peer_, header_[4], std::move(payload));
    if (open_) ReadHeader();
  });
}

void ControlChannel::Send(uint8_t type, std::shared_ptr<const std::vector<uint8_t>> payload) {
  if (!open_ || write_failed_) return;
  Outgoing out;
  uint32_t len = static_cast<uint32_t>(payload->size() + 1);
  std::memcpy(out.header, &len, 4);
  out.header[4] = type;
  out.payload = std::move(payload);
  queue_.push_back(std::move(out));
  if (!writing_) WriteNext();
}

void ControlChannel::WriteNext() {
  if (queue_.empty() || !open_) return;
  writing_ = true;
  Outgoing& out = queue_.front();
  std::vector<asio::const_buffer> bufs{asio::buffer(out.header, 5), asio::buffer(*out.payload)};
  auto self = shared_from_this();
  asio::async_write(*sock_, bufs, [this, self](const asio::error_code& ec, size_t) {
    writing_ = false;
    if (!open_) return;
    if (ec) {
      // Left to the read that is always outstanding (ReadHeader), which fails too, after what
      // the peer sent before the connection broke: its last message may be the job's end. A
      // peer that shut down and closed while this rank's heartbeat was on its way resets the
      // connection, and this write failing first was taken for that peer's loss.
      write_failed_ = true;
      queue_.clear();
      return;
    }
    queue_.pop_front();
    WriteNext();
  });
}

void ControlChannel::Fail(const std::string& what) {
  if (!open_) return;
  Close();
  on_error_(peer_, what);
}

void ControlChannel::Close() {
  if (!open_) return;
  open_ = false;
  queue_.clear();
  asio::error_code ec;
  sock_->shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  sock_->close(ec);
}

}  // namespace hvd
