#include "transport/mpi/mpi_bootstrap.h"

#include <climits>
#include <random>
#include <vector>

namespace hvd {

Status MpiAddressStore::Set(const std::string& key, const std::string& value, Deadline deadline) {
  const std::string mine = key + '\0' + value;
  if (mine.size() > INT_MAX / static_cast<size_t>(mpi_.size())) {
    return Status::InvalidArgument("MPI bootstrap: value of '" + key + "' is too long");
  }
  const int n = mpi_.size();
  int my_len = static_cast<int>(mine.size());
  std::vector<int> lens(n), displs(n);
  MPI_Request req;
  HVD_RETURN_IF_ERROR(mpi_.Check(
      MPI_Iallgather(&my_len, 1, MPI_INT, lens.data(), 1, MPI_INT, mpi_.comm(), &req),
      "MPI_Iallgather (bootstrap lengths)"));
  HVD_RETURN_IF_ERROR(mpi_.Wait(&req, deadline, "MPI_Iallgather (bootstrap lengths)"));
  int total = 0;
  for (int i = 0; i < n; ++i) {
    displs[i] = total;
    total += lens[i];
  }
  std::vector<char> all(static_cast<size_t>(total));
  HVD_RETURN_IF_ERROR(mpi_.Check(
      MPI_Iallgatherv(mine.data(), my_len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                      MPI_CHAR, mpi_.comm(), &req),
      "MPI_Iallgatherv (bootstrap addresses)"));
  HVD_RETURN_IF_ERROR(mpi_.Wait(&req, deadline, "MPI_Iallgatherv (bootstrap addresses)"));
  for (int i = 0; i < n; ++i) {
    std::string entry(all.data() + displs[i], static_cast<size_t>(lens[i]));
    size_t zero = entry.find('\0');
    if (zero == std::string::npos) {
      return Status::Internal("MPI bootstrap: malformed entry from rank " + std::to_string(i));
    }
    values_[entry.substr(0, zero)] = entry.substr(zero + 1);
  }
  return Status::OK();
}

StatusOr<std::string> MpiAddressStore::Get(const std::string& key, Deadline deadline) {
  auto it = values_.find(key);
  if (it == values_.end()) {
    return Status::InvalidArgument("MPI bootstrap: no rank published '" + key + "'");
  }
  return it->second;
}

StatusOr<std::string> MpiShareNewSecret(MpiContext& mpi, Deadline deadline) {
  constexpr int kHexDigits = 64;
  char secret[kHexDigits + 1] = {0};
  if (mpi.rank() == 0) {
    std::random_device rd;  // /dev/urandom on Linux
    static const char* hex = "0123456789abcdef";
    for (int i = 0; i < kHexDigits; i += 8) {
      uint32_t x = rd();
      for (int k = 0; k < 8; ++k) secret[i + k] = hex[(x >> (4 * k)) & 15];
    }
  }
  MPI_Request req;
  HVD_RETURN_IF_ERROR(mpi.Check(MPI_Ibcast(secret, kHexDigits, MPI_CHAR, 0, mpi.comm(), &req),
                                "MPI_Ibcast (job secret)"));
  HVD_RETURN_IF_ERROR(mpi.Wait(&req, deadline, "MPI_Ibcast (job secret)"));
  return std::string(secret, kHexDigits);
}

}  // namespace hvd
