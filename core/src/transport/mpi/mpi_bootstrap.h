// Bootstrapping the TCP mesh through MPI (mpirun without an hvdrun store).
//
// TcpMesh::Create publishes each rank's listening address with StoreClient::Set and reads the
// lower ranks' with Get. MpiAddressStore is a StoreClient that needs no server:
//   1. Set is collective: every rank calls it exactly once (TcpMesh does, after it has started
//      listening), and it returns once every rank's key and value are known here, exchanged by
//      MPI_Iallgather (lengths) and MPI_Iallgatherv (bytes).
//   2. Get answers from what Set gathered, without talking to anyone.
// Under hvdrun the job's secret comes in HVD_SECRET; under mpirun there is none, so rank 0 draws
// one and MPI_Ibcast gives it to the others: the mesh's connections are authenticated all the
// same, against a secret that never left MPI.
//
// Thread-safety: one thread at a time, like MpiContext.
#pragma once

#include <map>
#include <string>

#include "bootstrap/store.h"
#include "transport/mpi/mpi_context.h"

namespace hvd {

class MpiAddressStore : public StoreClient {
 public:
  explicit MpiAddressStore(MpiContext& mpi) : mpi_(mpi) {}  // `mpi` must outlive this store

  Status Set(const std::string& key, const std::string& value, Deadline deadline) override;
  bool collective() const override { return true; }
  StatusOr<std::string> Get(const std::string& key, Deadline deadline) override;

 private:
  MpiContext& mpi_;
  std::map<std::string, std::string> values_;
};

// Rank 0 draws a random secret (64 hex digits) and every rank receives it.
StatusOr<std::string> MpiShareNewSecret(MpiContext& mpi, Deadline deadline);

}  // namespace hvd
