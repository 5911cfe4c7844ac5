// The control plane as the engine sees it: one framed, ordered message link per control peer
// (rank 0: one per worker; a worker: one to rank 0). Negotiation messages, heartbeats, shutdown
// and abort travel on it; the data plane (transport.h) carries only tensor bytes. Which wire
// carries a link is the factory's business (transport_factory.h); today it is TCP
// (transport/tcp/control_channel.h).
//
// Incoming messages and a broken link are reported through the callbacks given to the
// factory, on the thread that runs the engine's io_context, once the link has started.
//
// Thread-safety: not thread-safe; used from the thread that runs the io_context.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hvd {

class ControlLink {
 public:
  using MessageFn = std::function<void(int peer, uint8_t type, std::vector<uint8_t>&& payload)>;
  using ErrorFn = std::function<void(int peer, const std::string& what)>;

  virtual ~ControlLink() = default;
  virtual int peer() const = 0;
  virtual bool open() const = 0;
  // Nothing queued to send.
  virtual bool idle() const = 0;
  // Queues one message; messages are delivered in the order sent.
  virtual void Send(uint8_t type, std::shared_ptr<const std::vector<uint8_t>> payload) = 0;
  virtual void Close() = 0;
};

// A control plane whose links the io_context alone does not drive (shared memory): the engine
// polls it while it spins after work, with SetPolling(true) so that peers need not wake it;
// before it sleeps it calls SetPolling(false) and then Poll() once more. Incoming messages go
// to the links' callbacks, on the calling thread.
class ControlPoller {
 public:
  virtual ~ControlPoller() = default;
  // Moves bytes on every link; true if any moved.
  virtual bool Poll() = 0;
  virtual void SetPolling(bool on) = 0;
};

}  // namespace hvd
