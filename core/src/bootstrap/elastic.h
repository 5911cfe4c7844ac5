// Elastic jobs: the worker's side of hvdrun's worlds (launcher/elastic.h is the other side).
//
// hvdrun numbers the worlds it forms (generations 1, 2, ...) and publishes each in its
// rendezvous store. The keys:
//   elastic/latest           the newest generation, in decimal (rewritten as worlds change)
//   elastic/world/<g>        the world of generation g: one line per rank, in rank order,
//                            "<worker id> <host>"
//   elastic/ready/<g>/<id>   written by worker <id> once it has read world g
//   elastic/left/<g>/<id>    written by worker <id> when world g broke under it (a peer lost
//                            or silent) or did not form: hvdrun stops a worker of the current
//                            world that has not written it long after another has (it is hung
//                            or cut off), and forms the next world once every worker has
//   g<g>/...                 the keys of the engine that forms world g (addresses, gave-up
//                            notes): PrefixStore keeps the generations apart
//
// Joining a world (JoinWorld):
//   1. Poll elastic/latest until it names a generation newer than the one this process last
//      ran (Options::elastic_after_generation).
//   2. Read that world and find this worker's line. None: hvdrun has left this worker out
//      (its host was blacklisted or removed, or --max-np is reached): FailedPrecondition.
//   3. Write elastic/ready/<g>/<id> and poll until every worker of the world has. If a newer
//      generation appears meanwhile (a worker died, a host came), go to 2 with it. If one has
//      not within HVD_START_TIMEOUT (its host cut off, its start hung), write
//      elastic/left/<g>/<id> and go to 1.
//   4. The engine forms the world with the store keys under g<g>/. Formation that fails with
//      PeerLost or Timeout (a worker died while forming) writes elastic/left/<g>/<id> and waits
//      for the next world, up to HVD_ELASTIC_TIMEOUT (Engine::Create).
// Ranks are the line numbers; a rank's local rank and size count the lines of its host, and its
// cross rank counts the hosts, in order of first appearance, that have that local rank.
//
// Thread-safety: pure functions, and a PrefixStore is used by one thread at a time.
#pragma once

#include <memory>
#include <string>

#include "bootstrap/store.h"
#include "hvd/options.h"

namespace hvd {

// The store key of a generation's world, and of the newest generation.
std::string ElasticWorldKey(int64_t generation);
std::string ElasticLeftKey(int64_t generation, const std::string& id);
// Writes elastic/left/<generation>/<id> = why (within 2 s): worker `id` left that world.
Status ReportLeft(StoreClient& store, int64_t generation, const std::string& id,
                  const std::string& why);
// Set by a worker once it has its place in world `generation`; the world forms once every
// worker of it has set its key.
std::string ElasticReadyKey(int64_t generation, const std::string& id);
// Set by a worker (to the generation it was in) once it holds the job's state: it took the
// state rank 0 broadcast after a reset (Engine::StateSynced), or reached a commit
// (Engine::HostsUpdated). A worker of the first world that formed holds the initial state
// without it.
std::string ElasticHoldsKey(const std::string& id);
constexpr const char* kElasticLatestKey = "elastic/latest";
// Set by hvdrun once a worker has exited 0 ("worker <id> (rank r of world g) finished ..."):
// training is over and no world forms after it, so a worker waiting for one fails at once
// with that, instead of at HVD_ELASTIC_TIMEOUT.
constexpr const char* kElasticFinishedKey = "elastic/finished";

// The newest generation hvdrun has published; 0 when none yet.
StatusOr<int64_t> LatestGeneration(StoreClient& store, Deadline deadline);

// Step 2 of the protocol: sets o->rank, size, local and cross rank and size and hostname from
// the world's text. NotFound is FailedPrecondition naming the worker; a malformed text is
// InvalidArgument.
Status PlaceInWorld(const std::string& world, const std::string& id, int64_t generation,
                    Options* o);

// Steps 1-3. On success o holds the place, elastic_generation and store_prefix of the world.
// `trained`: this process ran a world before (a reset); once hvdrun says a worker has finished
// (kElasticFinishedKey) it fails at once instead of waiting for a world. A new worker waits
// on: hvdrun stops it (the job ends with 0) once the workers that trained have all finished.
Status JoinWorld(StoreClient& store, Options* o, Deadline deadline, bool trained = false);

// A store whose keys all live under `prefix` (one generation's engine).
class PrefixStore : public StoreClient {
 public:
  PrefixStore(std::unique_ptr<StoreClient> inner, std::string prefix)
      : inner_(std::move(inner)), prefix_(std::move(prefix)) {}
  Status Set(const std::string& key, const std::string& value, Deadline deadline) override {
    return inner_->Set(prefix_ + key, value, deadline);
  }
  StatusOr<std::string> Get(const std::string& key, Deadline deadline) override {
    return inner_->Get(prefix_ + key, deadline);
  }
  StatusOr<bool> TryGet(const std::string& key, std::string* value, Deadline deadline) override {
    return inner_->TryGet(prefix_ + key, value, deadline);
  }

 private:
  std::unique_ptr<StoreClient> inner_;
  std::string prefix_;
};

}  // namespace hvd
