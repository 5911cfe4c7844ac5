#include <cstdlib>
#include <new>

#include "collectives/collectives.h"

namespace hvd {

void* ScratchBuffer::Get(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  std::free(data_);
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  data_ = std::aligned_alloc(64, rounded);
  if (data_ == nullptr) throw std::bad_alloc();
  capacity_ = rounded;
  return data_;
}

ScratchBuffer::~ScratchBuffer() { std::free(data_); }

}  // namespace hvd
