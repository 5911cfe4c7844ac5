// NCCL as the device collectives backend (nccl_collectives.cc), in a build with NCCL. Only
// transport_factory.cc, which knows the backends, calls it; the engine goes through
// CreateDeviceCollectives (transport/device_collectives.h).
#pragma once

#include <memory>

#include "transport/device_collectives.h"

namespace hvd {

StatusOr<std::unique_ptr<DeviceCollectives>> CreateNcclCollectives(Transport& world,
                                                                   Device& device,
                                                                   Deadline deadline,
                                                                   PollFn poll);

}  // namespace hvd
