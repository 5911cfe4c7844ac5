// What a failed read or write on a connection to a peer says, for the messages that name the
// peer (the data plane's TcpTransport and the control plane's ControlChannel).
#pragma once

#include <asio.hpp>
#include <string>

namespace hvd {

// "connection closed by the peer" for an orderly close. A reset (or a write after one: a broken
// pipe) also comes from the network between the hosts, a firewall or a host that restarted,
// with the peer's process alive: said so, since the message then names that peer as lost.
inline std::string ConnectionErrorText(const asio::error_code& ec) {
  if (ec == asio::error::eof) return "connection closed by the peer";
  if (ec == asio::error::connection_reset || ec == asio::error::broken_pipe) {
    return "connection reset (" + ec.message() +
           "; by the peer's process ending, or by something on the network between, such as a "
           "firewall)";
  }
  return "connection error: " + ec.message();
}

}  // namespace hvd
