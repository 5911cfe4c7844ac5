#include <cstdlib>
#include <cstdint>

#include "collectives/collectives.h"

namespace hvd {

void* ScratchBuffer::Get(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  std::free(data_);
  data_ = nullptr;
  capacity_ = 0;
  if (bytes > SIZE_MAX - 63) return nullptr;
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  data_ = std::aligned_alloc(64, rounded);
  if (data_ == nullptr) return nullptr;
  capacity_ = rounded;
  return data_;
}

ScratchBuffer::~ScratchBuffer() { std::free(data_); }

}  // namespace hvd
