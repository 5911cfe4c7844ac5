// A native trainer's elastic loop (hvd::Engine::Reset, HostsUpdated), run by
// mp_elastic_native_* under hvdrun's elastic mode.
//
// The "model" is one float64 that every step adds the average of every rank's 1.0 to, so after
// S steps it is S in any world, provided rollback and state sync are right; every step also
// checks that the sum of the ranks' 1.0 equals the world's size. The state is committed every
// two steps. The worker started as number --die-worker kills itself at step --die-at-step of
// its first world; --step-ms sleeps after each step. The worker started as number
// --hang-worker reaches the rendezvous only --hang-ms after its start (a start that hangs, a
// host cut off while the first world forms; default: never, it sleeps until hvdrun kills it).
// Rank 0 prints ELASTIC-NATIVE-WORLD once each world has formed and synced, and ELASTIC-NATIVE-OK
// with the final world size.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "hvd/engine.h"

namespace {

struct State {
  double model = 0;
  int64_t step = 0;
};

int Fail(const std::string& what) {
  std::printf("FAIL %s\n", what.c_str());
  return 1;
}

// Copies rank 0's state to every rank (after a reset the new rank 0 holds the last commit).
hvd::Status Sync(hvd::Engine& e, State* s) {
  hvd::TensorView m(&s->model, hvd::DataType::kFloat64, {1});
  hvd::TensorView st(&s->step, hvd::DataType::kInt64, {1});
  hvd::Status a = e.Broadcast("sync.model", m, m, 0)->Wait();
  hvd::Status b = e.Broadcast("sync.step", st, st, 0)->Wait();
  return a.ok() ? b : a;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20, die_worker = -1, die_at = -1, step_ms = 0, hang_worker = -1;
  int hang_ms = 300000;  // bounded: the test's timeout ends it sooner
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--die-worker")) die_worker = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--die-at-step")) die_at = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--step-ms")) step_ms = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--hang-worker")) hang_worker = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--hang-ms")) hang_ms = std::atoi(argv[i + 1]);
  }
  const char* id = std::getenv("HVD_ELASTIC_ID");
  const int number = id && std::strchr(id, '#') ? std::atoi(std::strchr(id, '#') + 1) : -1;
  if (number == hang_worker) ::usleep(static_cast<useconds_t>(hang_ms) * 1000);
  auto created = hvd::Engine::CreateFromEnvironment();
  if (!created.ok()) return Fail("init: " + created.status().ToString());
  std::unique_ptr<hvd::Engine> e = std::move(*created);
  State state, committed;
  int resets = 0;
  bool sync = true;
  while (true) {
    hvd::Status failed;
    bool hosts_updated = false;
    if (sync) failed = Sync(*e, &state);
    if (sync && failed.ok()) failed = e->StateSynced();  // hvdrun may make it a later rank 0
    if (sync && failed.ok() && e->rank() == 0) {
      std::printf("ELASTIC-NATIVE-WORLD generation %lld size %d\n",
                  static_cast<long long>(e->elastic_generation()), e->size());
      std::fflush(stdout);
    }
    while (failed.ok() && state.step < steps) {
      if (number == die_worker && resets == 0 && state.step == die_at) ::kill(::getpid(), SIGKILL);
      double one = 1.0, sum = 0;
      hvd::TensorView in(&one, hvd::DataType::kFloat64, {1});
      hvd::TensorView out(&sum, hvd::DataType::kFloat64, {1});
      failed = e->Allreduce("grad", in, out, hvd::ReduceOp::kSum)->Wait();
      if (!failed.ok()) break;
      if (sum != e->size()) return Fail("step sum " + std::to_string(sum) + " in a world of " + std::to_string(e->size()));
      state.model += sum / e->size();
      ++state.step;
      if (step_ms > 0) ::usleep(static_cast<useconds_t>(step_ms) * 1000);
      if (state.step % 2 == 0) {
        committed = state;
        auto updated = e->HostsUpdated();
        if (!updated.ok()) failed = updated.status();
        hosts_updated = updated.ok() && *updated;
        if (hosts_updated) break;
      }
    }
    if (failed.ok() && !hosts_updated) break;
    if (!failed.ok()) {
      if (failed.code() != hvd::StatusCode::kPeerLost && failed.code() != hvd::StatusCode::kTimeout) {
        return Fail("unexpected error: " + failed.ToString());
      }
      state = committed;  // roll back
    }
    auto next = hvd::Engine::Reset(std::move(e));
    if (!next.ok() && next.status().code() == hvd::StatusCode::kFailedPrecondition) {
      std::printf("LEFT-OUT %s\n", next.status().message().c_str());  // hvdrun is stopping it
      return 0;
    }
    if (!next.ok()) return Fail("reset: " + next.status().ToString());
    e = std::move(*next);
    ++resets;
    sync = true;
  }
  if (state.model != static_cast<double>(steps)) {
    return Fail("model " + std::to_string(state.model) + ", expected " + std::to_string(steps));
  }
  if (e->rank() == 0) {
    std::printf("ELASTIC-NATIVE-OK size %d generation %lld resets %d\n", e->size(),
                static_cast<long long>(e->elastic_generation()), resets);
  }
  std::fflush(stdout);
  e->Shutdown();
  return 0;
}
