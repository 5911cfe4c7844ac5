// Collectives over device memory, queued on a Device's stream (NCCL: transport/nccl/). The
// engine's device path (engine/execute_device.cc) runs them when the planner picks them;
// otherwise device tensors are staged through host memory and take the host transport.
//
// Every call only queues work; the engine waits for it with Device::Synchronize, polling Check()
// so that a broken communicator ends the wait, and calls Abort() when a peer is lost.
//
// Thread-safety: used by the engine's background thread only.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "common/time.h"
#include "device/device.h"
#include "hvd/status.h"
#include "hvd/types.h"

namespace hvd {

class Transport;

class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  virtual const char* name() const = 0;
  // Whether Allreduce and ReduceScatter reduce this dtype with this op.
  virtual bool Reduces(DataType dtype, ReduceOp op) const = 0;

  // `count` elements of `in` reduced into `out` (may alias). Average reduces like Sum.
  virtual Status Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) = 0;
  // Rank r's bytes[r] bytes land at the sum of the earlier ranks' bytes in `out`.
  virtual Status Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) = 0;
  virtual Status Broadcast(void* buf, size_t bytes, int root) = 0;
  // send[j] bytes from `in` (in rank order) to rank j; recv[j] bytes from rank j into `out`.
  virtual Status Alltoallv(const void* in, const std::vector<size_t>& send, void* out,
                           const std::vector<size_t>& recv) = 0;
  // counts[r] elements of the reduction go to rank r, parts in rank order in `in`.
  virtual Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                               DataType dtype, ReduceOp op) = 0;
  // The communicator's asynchronous error (a peer's failure seen by the library), if any.
  virtual Status Check() = 0;
  // Ends the communicator and whatever it has in flight; later calls fail.
  virtual void Abort() = 0;
};

// Polled while a communicator is being set up or a call settles: its error ends the wait.
using PollFn = std::function<Status()>;

// Whether this build has a device collectives backend (NCCL), or a test installed one.
bool DeviceCollectivesBuilt();

// Sets up the communicator of `world`'s ranks on `device`: rank 0 draws the unique id and
// broadcasts it over `world` (hvd's own transport), then every rank joins. Every rank of
// `world` must call it at the same point.
StatusOr<std::unique_ptr<DeviceCollectives>> CreateDeviceCollectives(Transport& world,
                                                                     Device& device,
                                                                     Deadline deadline,
                                                                     PollFn poll);

// Tests: communicators come from `factory` instead of the build's backend (an empty one
// restores it), and DeviceCollectivesBuilt() is true while one is installed. Install it before
// an engine starts; the background threads call it.
using DeviceCollectivesFactory = std::function<StatusOr<std::unique_ptr<DeviceCollectives>>(
    Transport& world, Device& device, Deadline deadline, PollFn poll)>;
void SetDeviceCollectivesForTesting(DeviceCollectivesFactory factory);

}  // namespace hvd
