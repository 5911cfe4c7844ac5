// The background thread: negotiation traffic, the coordinator step and the execution order.
// The protocol is described in coordinator/coordinator.h; the threads in engine_impl.h.
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "common/cpu_relax.h"
#include "common/logging.h"
#include "engine/engine_impl.h"
#include "planner/fusion.h"
#include "transport/transport_factory.h"

namespace hvd {

namespace {
constexpr auto kIdleTick = std::chrono::milliseconds(100);
constexpr auto kDueSleep = std::chrono::microseconds(20);
// While it spins with every control link polled in memory, how often the background thread
// also polls the io_context (a syscall).
constexpr auto kIoPollEvery = std::chrono::microseconds(20);
// How long the background thread, stepped aside for helping callers, yields before it sleeps.
// Sleeping sooner measured worse: in a stream of helped operations each caller that left woke
// it (a futex wake on the caller's path), and 4-byte allreduces at 2 ranks took 20-25 µs in
// some runs.
constexpr auto kAsideYield = std::chrono::milliseconds(100);
// How long a rank whose engine another rank's shutdown ended waits for its own program to shut
// hvd down before it finalizes MPI (where hvd started MPI): see Loop.
constexpr auto kFinishEarlyGrace = std::chrono::seconds(2);
// A helping caller whose pass moved nothing waits for its peers, which have cores of their own
// (callers help only where the host has a core per rank, and this process may use as many
// CPUs: ProgressHelper::pause_idle): it pauses on its core, and yields only this often.
// Yielding at every pass, it handed the core to its stepped-aside background thread and back
// at every pass (4 B-1 KiB allreduces at 2 ranks: 7.0-7.2 µs against 4.2-5.8, and 25,000
// context switches in a run of 5,000 against 300).
constexpr auto kHelpYieldEvery = std::chrono::microseconds(20);
// A burst of enqueues (EngineImpl::AwaitEnqueueBurst): over once none came for kEnqueueGap
// (a C++ caller enqueues one every 0.1-0.3 µs, a Python loop of allreduce_async_ one every
// 2.5-4 µs), drained at least every kEnqueueBurstMost.
constexpr auto kEnqueueGap = std::chrono::microseconds(5);
constexpr auto kEnqueueBurstMost = std::chrono::microseconds(200);

// The background thread, stepped aside, kept on one CPU (the helping caller's) while it yields
// (not while it sleeps after kAsideYield). A thread that yields stays runnable, and the
// scheduler spreads runnable threads, not work: on a host with a core per rank and none to
// spare, it often put both ranks' callers, which then did all the work, on one core and both
// yielding background threads on the other (a step of 1,000 tiny allreduces at 2 ranks on 2
// cores then took 2-4 times as long, with 10-20 times the context switches). Kept beside its
// caller, a background thread yields only to it, and a core that only background threads would
// share has none: the scheduler moves a caller there.
class AsidePin {
 public:
  explicit AsidePin(int cpu) {
    if (cpu < 0 || sched_getaffinity(0, sizeof(saved_), &saved_) != 0) return;
    if (!CPU_ISSET(cpu, &saved_) || CPU_COUNT(&saved_) < 2) return;
    CPU_ZERO(&one_);
    CPU_SET(cpu, &one_);
    pinned_ = sched_setaffinity(0, sizeof(one_), &one_) == 0;
  }
  // The mask it had, unless something else set another meanwhile; where that fails (the CPUs
  // it had are gone from its cpuset), every CPU, which the kernel narrows to what it may use.
  ~AsidePin() {
    if (!pinned_) return;
    cpu_set_t now;
    if (sched_getaffinity(0, sizeof(now), &now) != 0 || !CPU_EQUAL(&now, &one_)) return;
    if (sched_setaffinity(0, sizeof(saved_), &saved_) == 0) return;
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
    sched_setaffinity(0, sizeof(all), &all);
  }
  AsidePin(const AsidePin&) = delete;
  AsidePin& operator=(const AsidePin&) = delete;

 private:
  cpu_set_t saved_;
  cpu_set_t one_;
  bool pinned_ = false;
};

}  // namespace

// kAbort's payload (coordinator/messages.h): the cause's code in one byte, then its message. A
// receiver fails with Timeout where the cause was one (a stopped or hung peer, a stall
// shutdown), so that every survivor of a freeze reports the same code, and with PeerLost
// otherwise: for it the communicator is gone, whatever ended it elsewhere. A payload that starts
// with a printable byte is all message.
std::shared_ptr<const std::vector<uint8_t>> AbortPayload(const Status& cause) {
  std::vector<uint8_t> p;
  p.reserve(1 + cause.message().size());
  p.push_back(static_cast<uint8_t>(cause.code()));
  p.insert(p.end(), cause.message().begin(), cause.message().end());
  return std::make_shared<const std::vector<uint8_t>>(std::move(p));
}

namespace {

Status AbortStatus(const std::vector<uint8_t>& p) {
  const bool coded = !p.empty() && p[0] < 0x20;
  std::string why(p.begin() + (coded ? 1 : 0), p.end());
  if (coded && p[0] == static_cast<uint8_t>(StatusCode::kTimeout)) {
    return Status::Timeout(std::move(why));
  }
  return Status::PeerLost(std::move(why));
}

// Whether a failure's message names `rank` as the lost one, or as the peer a data-plane wait
// gave up on ("... bytes from rank 2").
bool BlamesRank(const std::string& message, int rank) {
  const std::string r = "rank " + std::to_string(rank);
  for (const char* verdict : {" lost", " (the coordinator) lost"}) {
    if (message.find(r + verdict) != std::string::npos) return true;
  }
  for (const char* side : {"from ", "to "}) {
    const std::string at = side + r;
    for (size_t i = message.find(at); i != std::string::npos; i = message.find(at, i + 1)) {
      const size_t end = i + at.size();
      if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end]))) {
        return true;
      }
    }
  }
  return false;
}

std::vector<uint8_t> IntPayload(int v) {
  std::vector<uint8_t> out(4);
  std::memcpy(out.data(), &v, 4);
  return out;
}

// Whether this thread runs an engine's work now (the background thread, or a caller helping):
// a callback it makes that waits on a handle must not ask for the lock it holds.
thread_local bool t_running_engine = false;
}  // namespace

ProgressHelper* ProgressHelper::New() {
  // Never freed (handles may outlive the engine), yet reachable for leak checkers.
  static std::mutex mu;
  static std::vector<std::unique_ptr<ProgressHelper>>* all =
      new std::vector<std::unique_ptr<ProgressHelper>>();
  std::lock_guard<std::mutex> l(mu);
  for (auto& p : *all) {
    // A retired one that no caller is inside (the fields the next engine sets anew go back
    // to their start).
    if (!p->retired.load() || p->waiting.load() != 0 || p->blocked.load() != 0) continue;
    std::unique_lock<std::mutex> run(p->run, std::try_to_lock);
    if (!run.owns_lock()) continue;
    p->engine = nullptr;
    p->pin_aside.store(false);
    p->caller_cpu.store(-1);
    p->pause_idle.store(false);
    {
      std::lock_guard<std::mutex> a(p->aside_mu);
      p->aside = false;
    }
    p->retired.store(false);
    return p.get();
  }
  all->push_back(std::make_unique<ProgressHelper>());
  return all->back().get();
}

// No exception leaves this thread: one that escapes the loop (a failed allocation in a message,
// a framework's callback) stops the engine the way a lost peer does, with every operation
// failing with Internal and the others told, instead of ending the process.
void EngineImpl::Loop() {
  t_running_engine = true;
  std::unique_lock<std::mutex> run(helper_->run);
  helper_->engine = this;
  for (int escapes = 0; escapes < 3; ++escapes) {
    try {
      RunLoop(run);
      break;
    } catch (...) {
      Status s = Status::Internal("rank " + std::to_string(options_.rank) +
                                  ": hvd's background thread stopped on an exception: " +
                                  ExceptionMessage(std::current_exception()));
      HVD_LOG(kError) << s.message();
      if (abort_.ok()) {
        abort_ = s;  // RunLoop fails everything with it and returns
        failing_on_own_ = true;
      }
    }
  }
  done_ = true;
  helper_->engine = nullptr;  // callers that wait from now on only wait
  timeline_.reset();  // writes the file
  // Every rank ends its engine with a shutdown: MPI may finish now, where hvd started it, as
  // Horovod's background thread finalizes it, rather than when this rank's program ends
  // (MpiContext::FinishEarly).
  if (shut_down_ && backends_->FinishesEarly()) {
    // Where another rank's shutdown ended this engine, this rank's program may be inside an MPI
    // call of its own (a barrier the other rank has just left): MPI_Finalize here would pull
    // MPI from under it (a crash in MPI's shared-memory transport, about 1 job in 4). The program
    // gets up to kFinishEarlyGrace to shut hvd down itself; its thread then waits in Shutdown,
    // out of MPI. A program that works on without hvd still lets MPI finish, so that a rank
    // that has left the job is not held in MPI_Finalize by the others' programs.
    const auto until = Clock::now() + kFinishEarlyGrace;
    while (Clock::now() < until) {
      {
        std::lock_guard<SpinLock> l(mu_);
        if (shutdown_requested_) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    backends_->FinishEarly();
  }
}

bool EngineImpl::Work(bool by_caller) {
  const auto start = timeline_->marks_cycles() ? Clock::now() : Clock::time_point();
  const bool worked = WorkCycle(by_caller);
  if (worked) {  // a cycle that did something: its mark, and the timeline written now and then
    timeline_->MarkCycle(start);
    timeline_->Tick(/*idle=*/false);
  }
  return worked;
}

bool EngineImpl::WorkCycle(bool by_caller) {
  if (!by_caller) handed_back_ = false;  // this thread runs what a caller left
  bool worked = DrainQueue();
  if (!abort_.ok()) return worked;
  if (rounds_) {
    CheckPeerLinks();
    worked = TryRounds() || worked;
  }
  if (coordinator()) CoordinatorStep();
  while (!to_execute_.empty() && abort_.ok()) {
    if (by_caller && !CallerMayExecute(to_execute_.front().get())) {
      handed_back_ = true;  // the background thread runs it once the caller leaves
      return worked;
    }
    QueuedResponse q = std::move(to_execute_.front());
    to_execute_.pop_front();
    Execute(q.get());
    if (q.shared) {
      Recycle(q.shared);
    } else {
      Recycle(std::move(q.own));
    }
    worked = true;
  }
  return worked;
}

// Where this rank has a core to spare, the background thread runs on another core than the
// caller, and a drain as each tensor comes moves every entry's memory (its node, name, handle)
// between the two cores' caches, and back when the caller waits on its handle: with one rank
// on two cores, a step of 1,000 tiny allreduces took 4 times as long as on one core (about
// 430 µs against 106), and the step was cut into two collectives at a point that moved from
// step to step, so their responses were built again every step. While a caller enqueues
// (more tensors came in the last kEnqueueGap), the thread waits, up to kEnqueueBurstMost, and
// drains the burst in one batch; a caller that then waits on one of them runs the work itself
// on its own core (caller-driven progress): true asks the loop to step aside for it. Where
// the rank has no core to spare, the two threads share one, and nothing changes (spare_core_).
bool EngineImpl::EnqueueBurstUnderway() const {
  return spare_core_ && spin_.count() > 0 && queued_.load(std::memory_order_relaxed) &&
         helper_->waiting.load(std::memory_order_relaxed) == 0 &&
         helper_->blocked.load(std::memory_order_relaxed) == 0;
}

bool EngineImpl::AwaitEnqueueBurst() {
  const auto start = Clock::now();
  auto grew_at = start;
  uint64_t seen = enqueued_.load(std::memory_order_relaxed);
  for (;;) {
    if (helper_->waiting.load(std::memory_order_relaxed) > 0) return true;
    if (helper_->blocked.load(std::memory_order_relaxed) > 0) return false;  // (not helping)
    for (int i = 0; i < 16; ++i) CpuRelax();
    const auto now = Clock::now();
    const uint64_t n = enqueued_.load(std::memory_order_relaxed);
    if (n != seen) {
      seen = n;
      grew_at = now;
    }
    if (now - grew_at >= kEnqueueGap || now - start >= kEnqueueBurstMost) return false;
  }
}

void EngineImpl::RunLoop(std::unique_lock<std::mutex>& run) {
  bool due_retried = false;  // a pass ran since a wait of rank 0's fell due, and it is due still
  while (!done_) {
    if (EnqueueBurstUnderway()) {
      // Waited out with `run` released: a caller that comes to wait takes it at once.
      run.unlock();
      if (AwaitEnqueueBurst()) StandAside();
      run.lock();
      last_work_ = Clock::now();
    }
    bool worked = Work(/*by_caller=*/false);
    if (!abort_.ok()) {
      backends_->JobFailed(abort_);
      FailAll(abort_);
      ReportLeftWorld(abort_);
      break;
    }
    if (shutdown_by_ < 0 && shutdown_sent_ && Clock::now() > shutdown_deadline_) {
      HVD_LOG(kWarning) << "no answer from rank 0 to shutdown; closing anyway";
      shutdown_by_ = options_.rank;
    }
    if (shutdown_by_ >= 0 && !RoundsLeftAtShutdown()) {
      FinishShutdown(shutdown_by_);
      shut_down_ = true;
      break;
    }
    if (worked) {
      // A stream of work (a caller enqueuing many tensors) must not starve the control
      // plane: the peers' announcements are read between batches.
      last_work_ = Clock::now();
      if (poller_) poller_->Poll();
      if (control_over_tcp_ || last_work_ - io_polled_ >= kIoPollEvery) {
        io_polled_ = last_work_;
        if (io_.stopped()) io_.restart();
        io_.poll();
      }
      continue;
    }
    if (io_.stopped()) io_.restart();
    // Right after work the next message (a response, the peer's data) or the caller's next
    // operation is usually microseconds away: poll for it (yielding the core) before sleeping
    // in the kernel. The queue is looked at without a syscall (Wake()).
    const auto now = Clock::now();
    if (helper_->waiting.load(std::memory_order_relaxed) > 0) {
      StepAside(run);
      continue;
    }
    if (spin_.count() > 0 && now - last_work_ < spin_) {
      if (queued_.load()) continue;
      if (SpinPoll(now)) continue;
      // Yield every round: the thread that will answer may be waiting for this core.
      sched_yield();
      continue;
    }
    if (polling_) {
      // Peers ring from here on; what they sent before they saw the flag down is read now.
      StopPolling();
      if (poller_->Poll()) continue;
    }
    // A wait of rank 0's (a cycle, a straggler hold) that fell due since the pass's Work looked
    // is ended by one more pass (while spinning, every pass's Work looks); one that is due
    // after that is slept out below.
    const Clock::duration due_in = CycleRemaining();
    if (due_in != Clock::duration::zero()) {
      due_retried = false;
    } else if (!due_retried) {
      due_retried = true;
      continue;
    }
    timeline_->Tick(/*idle=*/true);
    Clock::duration sleep = std::min<Clock::duration>(kIdleTick, timeline_->IdleFlushIn());
    // The event loop sleeps in whole milliseconds; a timer (a timerfd) wakes it when the wait
    // ends, to the microsecond (at least kDueSleep ahead: a wait still due after one more pass
    // is not spun on). It is armed again only for an end earlier by more than the clock's drift
    // between two passes: re-arming cancels the wait pending, whose handler (run at once,
    // aborted) ends the next sleep at once.
    if (due_in != Clock::duration::max()) {
      const Clock::time_point at = Clock::now() + std::max<Clock::duration>(due_in, kDueSleep);
      if (!due_armed_ || at + kDueSleep < due_timer_.expiry()) {
        const uint64_t arm = ++due_arms_;
        due_timer_.expires_at(at);
        due_timer_.async_wait([this, arm](const asio::error_code&) {
          if (arm == due_arms_) due_armed_ = false;  // (not an earlier wait's, cancelled)
        });
        due_armed_ = true;
      }
    }
    sleeping_.store(true);
    if (!queued_.load()) {
      // Work held while it sleeps: an io_context with nothing to wait for (a world of one: no
      // connection, no heartbeat) returns from run_one_for at once, and the loop spun a core.
      // A caller's Wake posts to it; the guard's end may stop it (restarted below).
      const auto hold = asio::make_work_guard(io_);
      io_.run_one_for(sleep);
    }
    sleeping_.store(false);
    if (io_.stopped()) io_.restart();
    io_.poll();
  }
}

void EngineImpl::StepAside(std::unique_lock<std::mutex>& run) {
  run.unlock();
  StandAside();
  run.lock();
  // What moved while a caller ran the work counts as recent: poll before sleeping.
  last_work_ = Clock::now();
}

void EngineImpl::StandAside() {
  ProgressHelper& p = *helper_;
  // Callers usually help one operation after another (wait, submit, wait): yield while they do,
  // so that none of them pays for waking this thread when it leaves. Only a long stretch of
  // help (kAsideYield) puts it to sleep, woken by the last caller to leave.
  {
    const AsidePin pin(p.pin_aside.load(std::memory_order_relaxed)
                           ? p.caller_cpu.load(std::memory_order_relaxed)
                           : -1);
    const auto until = Clock::now() + kAsideYield;
    while (p.waiting.load() > 0 && Clock::now() < until) sched_yield();
  }
  if (p.waiting.load() > 0) {
    std::unique_lock<std::mutex> l(p.aside_mu);
    p.aside = true;
    p.aside_cv.wait_for(l, kIdleTick, [&p] { return p.waiting.load() == 0; });
    p.aside = false;
  }
}

bool EngineImpl::SpinPoll(Clock::time_point now) {
  if (poller_) {
    if (!polling_) poller_->SetPolling(polling_ = true);
    if (poller_->Poll()) return true;
  }
  // TCP control links are read by the io_context: poll it every round. With every link in
  // memory, only timers and the rest need it now and then.
  if (control_over_tcp_ || now - io_polled_ >= kIoPollEvery) {
    io_polled_ = now;
    if (io_.stopped()) io_.restart();
    return io_.poll() > 0;
  }
  return false;
}

int EngineImpl::HelpStep() {
  // (A caller holding the lock found the engine running, so done_ is false.)
  if (!abort_.ok() || shutdown_sent_ || handed_back_) return -1;
  try {
    bool moved = Work(/*by_caller=*/true);
    if (!abort_.ok() || shutdown_sent_ || handed_back_) return -1;
    const auto now = Clock::now();
    moved = SpinPoll(now) || moved;  // the control plane, as the background thread spins
    if (moved) last_work_ = now;
    return moved ? 1 : 0;
  } catch (...) {
    // As an exception on the background thread: the engine stops, and its thread fails
    // everything once this caller has left.
    Status s = Status::Internal("rank " + std::to_string(options_.rank) +
                                ": hvd's work, run by a waiting caller, stopped on an exception: " +
                                ExceptionMessage(std::current_exception()));
    HVD_LOG(kError) << s.message();
    if (abort_.ok()) {
      abort_ = s;
      failing_on_own_ = true;
    }
    return -1;
  }
}

void HelpProgress(ProgressHelper* p, const Handle& h, std::chrono::microseconds spin,
                  Clock::time_point until) {
  if (t_running_engine || spin.count() <= 0) return;
  // (For AsidePin: before `waiting`, which the background thread sees before it reads this.)
  if (p->pin_aside.load(std::memory_order_relaxed)) {
    p->caller_cpu.store(sched_getcpu(), std::memory_order_relaxed);
  }
  p->waiting.fetch_add(1);
  std::unique_lock<std::mutex> run(p->run, std::defer_lock);
  auto moved_at = Clock::now(), yielded_at = moved_at;
  while (!h.Finished()) {
    const auto now = Clock::now();
    if (now - moved_at >= spin || now >= until) break;
    if (!run.owns_lock() && !run.try_lock()) {
      sched_yield();  // the background thread is busy, or about to step aside
      yielded_at = Clock::now();
      continue;
    }
    if (p->engine == nullptr) break;
    t_running_engine = true;
    const int step = p->engine->HelpStep();
    t_running_engine = false;
    if (step < 0) break;
    if (step > 0) {
      moved_at = Clock::now();
    } else if (!p->pause_idle.load(std::memory_order_relaxed) ||
               Clock::now() - yielded_at >= kHelpYieldEvery) {
      sched_yield();  // (the peers this step waits for may need this core)
      yielded_at = Clock::now();
    } else {
      CpuRelax();
    }
  }
  if (run.owns_lock()) run.unlock();
  if (p->waiting.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> l(p->aside_mu);
    if (p->aside) p->aside_cv.notify_one();
  }
}

// An executed response of many tensors keeps its names and shapes for the fast path to write
// the next step's over (ResponseCache::RebuildAll): a step of the same tensors then allocates
// none of them.
void EngineImpl::Recycle(Response&& r) {
  constexpr size_t kSpares = 4;
  if (r.names.size() < 2 || spare_responses_.size() >= kSpares) return;
  spare_responses_.push_back(std::move(r));
}

// A step's responses, once nothing else holds them (neither a queued response nor the set's
// last step): their names' storage for the next rebuild.
void EngineImpl::Recycle(std::shared_ptr<std::vector<Response>>& step) {
  if (step.use_count() == 1) {
    for (auto& r : *step) Recycle(std::move(r));
  }
  step.reset();
}

std::shared_ptr<std::vector<Response>> EngineImpl::StepResponses(ProcessSetState& ps,
                                                                 const std::vector<uint64_t>& bits,
                                                                 size_t threshold,
                                                                 const PlanKnobs& knobs,
                                                                 size_t* bytes) {
  ResponseCache& cache = *ps.cache;
  const uint64_t contents = cache.contents();
  ++ps.known_steps_clock;
  fast_path_steps_.fetch_add(1, std::memory_order_relaxed);
  for (auto& k : ps.known_steps) {
    if (k.responses && k.contents == contents && k.threshold == threshold && k.knobs == knobs &&
        k.bits == bits) {
      if (!cache.MarkUsed(bits)) break;  // (a bit is empty: the rebuild below says so)
      k.used = ps.known_steps_clock;
      fast_path_steps_reused_.fetch_add(1, std::memory_order_relaxed);
      *bytes = k.bytes;
      return k.responses;
    }
  }
  // The entry to build into: an empty one, else one of other contents (it can never match
  // again), else the one least recently taken.
  if (ps.known_steps.size() < ProcessSetState::kKnownSteps) ps.known_steps.emplace_back();
  ProcessSetState::KnownStep* into = &ps.known_steps[0];
  for (auto& k : ps.known_steps) {
    if (!k.responses) {
      into = &k;
      break;
    }
    if (into->contents == contents && (k.contents != contents || k.used < into->used)) into = &k;
  }
  Recycle(into->responses);
  auto step = std::make_shared<std::vector<Response>>();
  if (!cache.RebuildAll(bits, threshold, step.get(), &spare_responses_)) return nullptr;
  size_t total = 0;
  for (auto& r : *step) {
    r.process_set = ps.id;
    r.knobs = knobs;
    total += ResponseBytes(r);
  }
  into->bits = bits;
  into->threshold = threshold;
  into->knobs = knobs;
  into->contents = contents;
  into->bytes = total;
  into->used = ps.known_steps_clock;
  into->responses = step;
  *bytes = total;
  return step;
}

void EngineImpl::QueueStep(const std::shared_ptr<std::vector<Response>>& step) {
  for (size_t i = 0; i < step->size(); ++i) {
    QueuedResponse q;
    q.shared = step;
    q.index = i;
    to_execute_.push_back(std::move(q));
  }
}

void EngineImpl::StopPolling() {
  if (!polling_) return;
  polling_ = false;
  poller_->SetPolling(false);
}

bool EngineImpl::DrainQueue() {
  // The caller's queue and this one trade places, so both keep their capacity from step to
  // step: a step of many tensors allocates no queue.
  std::vector<InFlightNode*>& batch = draining_;
  batch.clear();
  bool shutdown;
  std::unique_ptr<TimelineSwitch> timeline_switch;
  queued_.store(false);
  wake_posted_.store(false);
  {
    std::lock_guard<SpinLock> l(mu_);
    batch.swap(queue_);
    if (sweep_wanted_) {  // nodes a caller took for operations it then refused
      in_flight_.Sweep();
      sweep_wanted_ = false;
    }
    shutdown = shutdown_requested_;
    timeline_switch.swap(timeline_switch_);
  }
  if (timeline_switch) {
    // Before this batch: what was submitted after StartTimeline returned is in the new one.
    timeline_.reset();  // closes the file before a new one (perhaps the same) opens
    timeline_ = std::make_unique<Timeline>(timeline_switch->path, options_.rank,
                                           timeline_switch->mark_cycles);
    timeline_switched_.store(timeline_switch->ticket);
  }
  const auto start = batch.empty() ? Clock::time_point() : Clock::now();
  // By process set: the nodes drained (their entries stay where the caller put them). The
  // lists keep their capacity from drain to drain.
  auto& requests = drained_;
  for (auto& kv : requests) kv.second.clear();
  bool any = false;
  // The set of the entry before, its state and its list: a step's tensors are mostly of one.
  bool have_last = false;
  int32_t last_set = 0;
  const ProcessSetState* last_ps = nullptr;
  std::vector<InFlightNode*>* last_list = nullptr;  // made for a live set only
  for (InFlightNode* node : batch) {
    TensorEntry& e = node->value;
    if (e.raw) {
      StopPolling();
      // Benchmark hook: every rank runs it at the same point, without negotiation.
      Status s = (*e.raw)(*transport_, scratch_);
      if (!s.ok() && s.code() != StatusCode::kInvalidArgument) abort_ = s;
      CompleteEntry(e, s);
      continue;
    }
    const int32_t set = e.request.process_set;
    if (!have_last || set != last_set) {
      have_last = true;
      last_set = set;
      last_ps = FindSet(set);
      last_list = nullptr;
    }
    const ProcessSetState* ps = last_ps;
    if (ps == nullptr || ps->removed) {  // its removal was negotiated after the caller's check
      CompleteEntry(e, Status::FailedPrecondition(
                           std::string(OpTypeName(e.request.type)) + " '" + e.request.name +
                           "': process set " + std::to_string(set) + " was removed"));
      continue;
    }
    if (e.request.type == OpType::kJoin) {
      joined_ = true;
      join_device_ = e.input.device;  // this join's (a plain join names none)
    }
    timeline_->Negotiate(set, e.request.name, OpTypeName(e.request.type));
    e.drained = true;
    if (last_list == nullptr) last_list = &requests[set];
    last_list->push_back(node);
    any = true;
  }
  for (auto& [set, list] : requests) {
    if (!list.empty()) Announce(*sets_.at(set), list, start);
  }
  if (any) CountBookkeeping(CountNegotiation(start));
  if (shutdown && !shutdown_sent_) {
    shutdown_sent_ = true;
    shutdown_deadline_ = DeadlineAfterSeconds(options_.timeout_seconds);
    if (options_.rank == 0 || options_.size == 1) {
      shutdown_by_ = options_.rank;
    } else if (control_[0] && control_[0]->open()) {
      control_[0]->Send(static_cast<uint8_t>(MessageType::kShutdown),
                        Payload(IntPayload(options_.rank)));
    } else {
      shutdown_by_ = options_.rank;
    }
  }
  const bool drained = !batch.empty();
  batch.clear();
  return drained;
}

int EngineImpl::LookupBit(ProcessSetState& ps, NameTable<TensorEntry>::Node* node) {
  TensorEntry& e = node->value;
  if (!e.request.error.empty()) return -1;  // a refusal goes to the coordinator (Request::error)
  if (!ps.announce_in_full.empty() && ps.announce_in_full.erase(e.request.name) > 0) return -1;
  const uint64_t contents = ps.cache->contents();
  int bit;
  if (e.hint_contents == contents && node->hint != 0) {
    bit = static_cast<int>(node->hint - 1);  // the same request where the same cache has it
  } else {
    bit = ps.cache->Lookup(e.request, &node->hint);
    e.hint_contents = bit >= 0 ? contents : 0;
  }
  if (bit < 0) return bit;
  if (ps.nodes_generation != in_flight_.erasures()) {  // nodes it holds may be gone
    ps.node_of_bit.assign(ps.node_of_bit.size(), nullptr);
    ps.nodes_generation = in_flight_.erasures();
  }
  if (static_cast<size_t>(bit) >= ps.node_of_bit.size()) ps.node_of_bit.resize(bit + 1, nullptr);
  ps.node_of_bit[bit] = node;
  node->value.announced_bit = bit;
  return bit;
}

NameTable<TensorEntry>::Node* EngineImpl::PendingNode(ProcessSetState& ps, const Response& r,
                                                      size_t i) {
  if (r.from_cache && i < r.bits.size() && r.bits[i] < ps.node_of_bit.size() &&
      ps.nodes_generation == in_flight_.erasures()) {
    auto* node = ps.node_of_bit[r.bits[i]];  // live and drained (engine_impl.h)
    // The response was built from the bit, which holds the node's request while the cache's
    // contents are those the node found it at; else the names must match.
    if (node != nullptr && ((node->value.hint_contents == ps.cache->contents() &&
                             node->value.announced_bit == static_cast<int32_t>(r.bits[i])) ||
                            node->value.request.name == r.names[i])) {
      return node;
    }
  }
  const std::string key =
      r.process_set == kGlobalProcessSet ? std::string() : PendingKey(r.process_set, r.names[i]);
  std::lock_guard<SpinLock> l(mu_);
  auto* node = in_flight_.Find(r.process_set == kGlobalProcessSet ? std::string_view(r.names[i])
                                                                   : std::string_view(key));
  // An entry the caller has queued and this thread not drained is not announced yet.
  return node != nullptr && node->value.drained ? node : nullptr;
}

// LookupBit for each node, where a group's members (Submit queues them together, one after
// another) are hits all or none: a group with a member the cache lacks goes to the coordinator
// whole, which holds its members until the group is complete on every rank, while its members
// on the fast path wait for each other there (ResponseCache::CloseGroups) and leave it together
// (ResponseCache::WidenToGroups), so that a rank's members of a group reach the coordinator in
// one batch, as it takes a group (Coordinator::AddRequests): in rounds (rounds.cc), and where
// rank 0 answers (OfferList, DemoteBits).
void EngineImpl::LookupBits(ProcessSetState& ps,
                            const std::vector<NameTable<TensorEntry>::Node*>& nodes,
                            std::vector<int>* bits) {
  // (A member forced to miss below keeps the node LookupBit remembered by its bit: harmless,
  // as no round agrees on a bit this rank has not announced.)
  bits->resize(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) (*bits)[i] = LookupBit(ps, nodes[i]);
  for (size_t i = 0; i < nodes.size();) {
    const Request& q = nodes[i]->value.request;
    if (q.group_size <= 1) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < nodes.size() && nodes[end]->value.request.group == q.group) ++end;
    const bool whole = end - i == static_cast<size_t>(q.group_size) &&
                       std::all_of(bits->begin() + i, bits->begin() + end,
                                   [](int b) { return b >= 0; });
    if (!whole) std::fill(bits->begin() + i, bits->begin() + end, -1);
    i = end;
  }
}

void EngineImpl::Announce(ProcessSetState& ps,
                          const std::vector<NameTable<TensorEntry>::Node*>& nodes,
                          Clock::time_point now) {
  // The symmetric fast path (rounds.cc): cached tensors join this rank's row, the others go to
  // the coordinator.
  const bool symmetric = Symmetric(ps);
  std::vector<int>& bits = announce_bits_;
  LookupBits(ps, nodes, &bits);
  if (symmetric) {
    std::vector<Request> full;
    uint64_t hits = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const int bit = bits[i];
      if (bit >= 0) {
        ++hits;
        AnnounceBit(static_cast<uint32_t>(bit), now);
      } else {
        full.push_back(nodes[i]->value.request);
      }
    }
    cache_hits_.fetch_add(hits);
    if (!full.empty()) SendToCoordinator(std::move(full));
    return;
  }
  // Fast path: tensors whose request is cached travel as bits of a bit vector (rank 0 offers
  // its own list to itself).
  RequestList list;
  list.process_set = ps.id;
  list.cache_epoch = ps.cache->epoch();
  uint64_t hits = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto* node = nodes[i];
    const int bit = bits[i];
    if (bit < 0) {
      list.requests.push_back(node->value.request);
      continue;
    }
    size_t word = static_cast<size_t>(bit) / 64;
    if (list.cached_bits.size() <= word) list.cached_bits.resize(word + 1, 0);
    list.cached_bits[word] |= uint64_t{1} << (bit % 64);
    ++hits;
  }
  cache_hits_.fetch_add(hits);
  if (coordinator()) {
    // (Its own bits are at its own epoch, each a hit: no error is possible.)
    const Status s =
        OfferList(ps, ps.rank, list.cache_epoch, list.cached_bits, std::move(list.requests));
    if (!s.ok()) {
      HVD_LOG(kError) << "rank 0's own announcement: " << s.message();
    }
    return;
  }
  control_[0]->Send(static_cast<uint8_t>(MessageType::kRequests), Payload(Encode(list)));
  negotiation_messages_.fetch_add(1, std::memory_order_relaxed);
}

// Bits announced at rank 0's current epoch mean what its cache says now: they join the fast
// path, and so do bits from an older epoch (a response list crossed the announcement) whose
// entry has not changed since. The others are decoded as they were then and go to the
// coordinator.
Status EngineImpl::OnRequests(int peer, RequestList&& list) {
  ProcessSetState* found = FindSet(list.process_set);
  // A set whose removal is negotiated: its members fail these operations themselves.
  if (found == nullptr || !found->coordinator) return Status::OK();
  ProcessSetState& ps = *found;
  auto it = std::lower_bound(ps.ranks.begin(), ps.ranks.end(), peer);
  if (it == ps.ranks.end() || *it != peer) {
    return Status::InvalidArgument("requests for process set " + std::to_string(ps.id) +
                                   ", which the rank is not a member of");
  }
  const int q = static_cast<int>(it - ps.ranks.begin());
  if (Symmetric(ps)) {
    // The symmetric fast path (rounds.cc): bits travel in rounds; these are requests only, from
    // a rank whose cache may be a round ahead of this one's.
    if (!list.cached_bits.empty()) {
      return Status::InvalidArgument("cached bits in a request list, but the ranks agree on "
                                     "cached tensors in rounds");
    }
    if (!list.requests.empty()) AddFull(ps, q, std::move(list.requests));
    return Status::OK();
  }
  if (list.cache_epoch > ps.cache->epoch()) {
    return Status::InvalidArgument("request list from a future cache epoch");
  }
  HVD_RETURN_IF_ERROR(
      OfferList(ps, q, list.cache_epoch, list.cached_bits, std::move(list.requests)));
  ps.worker_epochs[q] = std::max(ps.worker_epochs[q], list.cache_epoch);
  uint64_t oldest = ps.cache->epoch();
  for (size_t m = 0; m < ps.ranks.size(); ++m) {
    if (ps.ranks[m] != 0) oldest = std::min(oldest, ps.worker_epochs[m]);
  }
  ps.cache->PruneHistory(oldest);
  return Status::OK();
}

// ---------------------------------------------------------------- the fast path (rank 0)
//
// A cached tensor that a rank announces at rank 0's cache epoch is one bit in that rank's row
// of ready_bits_. The tensors every rank has announced are one AND over the rows: rank 0 sends
// that bit vector (with its fusion threshold) in the next response list, and every rank, rank 0
// included, builds the responses from its own cache, in bit order, fused alike. Rank 0 never
// turns those bits into requests, so a step of cached tensors costs it the same bit operations
// whatever their number. A name is on one path at a time: when the coordinator holds a request
// for it (a first or changed request, a join), its bits are turned into requests and go there
// too (DemoteBits); so do bits that wait longer than kBitPatience (a rank is late: the
// coordinator's stall inspector then names it) and bits whose cache entry a response list is
// about to change. A group's members are agreed on only whole, and a member that goes to the
// coordinator takes the rest of its group with it (LookupBits).

namespace {
constexpr auto kBitPatience = std::chrono::seconds(1);
}  // namespace

void EngineImpl::TickReady(const ProcessSetState& ps, int rank, const Request& r) {
  if (ps.rank >= 0 && timeline_->enabled()) {
    timeline_->RankReady(ps.id, r.name, OpTypeName(r.type), ps.ranks[rank], Clock::now());
  }
}

// Rank `rank`'s announcement: the bits of `words`, at cache epoch `epoch` (rank 0's or older),
// and its requests. A bit joins the rank's row where its entry means what it meant at `epoch`,
// unless the coordinator must see its name (it holds a request for the name, or a rank has
// joined); otherwise it goes to the coordinator as the request it meant. Such a bit takes the
// rest of its group with it, so the rank's members of a group reach the coordinator in one
// batch (LookupBits).
Status EngineImpl::OfferList(ProcessSetState& ps, int rank, uint64_t epoch,
                             const std::vector<uint64_t>& words, std::vector<Request> requests) {
  const bool current = epoch == ps.cache->epoch();
  const Coordinator& co = *ps.coordinator;
  // Bits of names some rank owes go to the coordinator, where the debt is paid
  // (Coordinator::OwedNames): a late rank's bit must not be agreed on with the next step's.
  std::vector<uint64_t> owed;
  if (co.owes_any() && !words.empty()) {
    owed.assign(words.size(), 0);
    ps.cache->SetBitsOf(co.OwedNames(), &owed);
    bool any = false;
    for (size_t w = 0; w < owed.size(); ++w) any = (owed[w] &= words[w]) != 0 || any;
    if (!any) owed.clear();
  }
  if (current && co.idle() && !co.any_joined() && owed.empty() && !timeline_->enabled()) {
    // The steady state of training: no name is on the coordinator's path.
    HVD_RETURN_IF_ERROR(OfferWords(ps, rank, words));
  } else if (!words.empty()) {
    // The bits that go to the coordinator, decoded where their entry changed since `epoch`.
    std::vector<uint64_t> out(ps.ready_bits[rank].size(), 0);
    std::vector<uint64_t> decoded(out.size(), 0);
    std::vector<std::string> groups;  // of the requests
    for (const Request& r : requests) {
      if (r.group_size > 1) groups.push_back(r.group);
    }
    auto decode = [&](uint32_t bit) -> Status {
      Request r;
      if (!ps.cache->Decode(bit, epoch, &r)) {
        return Status::InvalidArgument("unknown response-cache bit " + std::to_string(bit));
      }
      r.process_set = ps.id;
      if (r.group_size > 1) groups.push_back(r.group);
      requests.push_back(std::move(r));
      return Status::OK();
    };
    for (size_t w = 0; w < words.size(); ++w) {
      for (uint64_t word = words[w]; word; word &= word - 1) {
        const uint32_t bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(word));
        const uint64_t mask = uint64_t{1} << (bit % 64);
        if (w >= out.size()) {
          return Status::InvalidArgument("unknown response-cache bit " + std::to_string(bit));
        }
        const Request* cached = ps.cache->At(bit);
        if (cached == nullptr || (!current && !ps.cache->UnchangedSince(bit, epoch))) {
          HVD_RETURN_IF_ERROR(decode(bit));
          decoded[w] |= mask;
          out[w] |= mask;
        } else if (co.any_joined() || (!co.idle() && co.Has(cached->name)) ||
                   (!owed.empty() && (owed[w] & mask))) {
          out[w] |= mask;
        }
      }
    }
    ps.cache->WidenToGroups(&out, groups);
    // The rest of `out` goes as requests (unchanged since `epoch`: what it means now); the
    // bits left join the row.
    std::vector<uint64_t> keep(words.size());
    for (size_t w = 0; w < words.size(); ++w) {
      for (uint64_t word = words[w] & out[w] & ~decoded[w]; word; word &= word - 1) {
        HVD_RETURN_IF_ERROR(decode(static_cast<uint32_t>(w * 64 + __builtin_ctzll(word))));
      }
      keep[w] = words[w] & ~out[w];
      for (uint64_t word = keep[w]; word; word &= word - 1) {
        TickReady(ps, rank, *ps.cache->At(static_cast<uint32_t>(w * 64 + __builtin_ctzll(word))));
      }
    }
    HVD_RETURN_IF_ERROR(OfferWords(ps, rank, keep));
  }
  if (!requests.empty()) AddFull(ps, rank, std::move(requests));
  return Status::OK();
}

// Bits that join rank `rank`'s row, a word at a time (OfferList: at once where the bits are at
// the cache's epoch, no rank has joined and the coordinator holds no request, so none is for
// the bits' names; else those its checks left). The clock is read once, not per bit.
Status EngineImpl::OfferWords(ProcessSetState& ps, int rank, const std::vector<uint64_t>& words) {
  if (const int64_t empty = ps.cache->FirstEmpty(words); empty >= 0) {
    return Status::InvalidArgument("unknown response-cache bit " + std::to_string(empty));
  }
  std::vector<uint64_t>& row = ps.ready_bits[rank];
  Clock::time_point now;
  for (size_t w = 0; w < words.size(); ++w) {
    const uint64_t word = words[w];
    if (word == 0) continue;
    const size_t first = w * 64;
    row[w] |= word;
    for (uint64_t x = word; x; x &= x - 1) {
      Clock::time_point& since = ps.bit_since[first + __builtin_ctzll(x)];
      if (since != Clock::time_point()) continue;
      if (now == Clock::time_point()) now = Clock::now();
      since = now;
    }
    ps.bits_changed = true;
  }
  return Status::OK();
}

void EngineImpl::AddFull(ProcessSetState& ps, int rank, std::vector<Request> requests) {
  if (timeline_->enabled()) {
    for (const auto& r : requests) TickReady(ps, rank, r);
  }
  if (Symmetric(ps)) {
    // Other ranks may hold bits of these names, or (a join) of any: rank 0's next part of a
    // round withdraws them (rounds.cc).
    for (const auto& r : requests) {
      if (r.type == OpType::kJoin || ps.cache->SlotOf(r.name) >= 0) {
        rounds_->coordinator_news = true;
      }
    }
    ps.coordinator->AddRequests(rank, std::move(requests));
    // Names some rank has come to owe: rank 0's next part of a round withdraws their bits.
    if (!ps.coordinator->TakeNewlyOwed().empty()) rounds_->coordinator_news = true;
    return;
  }
  // The other ranks' bits of these names (of every name, for a join) go to the coordinator
  // first, with their groups.
  std::vector<uint64_t> demote;
  for (const auto& r : requests) {
    if (r.type == OpType::kJoin) {
      demote.assign((ps.bit_since.size() + 63) / 64, ~uint64_t{0});
      break;
    }
    if (int bit = ps.cache->SlotOf(r.name); bit >= 0) {
      if (demote.empty()) demote.resize((ps.bit_since.size() + 63) / 64, 0);
      demote[bit / 64] |= uint64_t{1} << (bit % 64);
    }
  }
  if (!demote.empty()) DemoteBits(ps, std::move(demote));
  ps.coordinator->AddRequests(rank, std::move(requests));
  // Bits of names some rank has come to owe that wait in a row go to the coordinator too, where
  // the debt is paid, instead of being agreed on with the others' next step (each batch they
  // bring may fail more names).
  for (auto owed = ps.coordinator->TakeNewlyOwed(); !owed.empty();
       owed = ps.coordinator->TakeNewlyOwed()) {
    std::vector<uint64_t> bits((ps.bit_since.size() + 63) / 64, 0);
    ps.cache->SetBitsOf(owed, &bits);
    DemoteBits(ps, std::move(bits));  // (which masks bits past the slots)
  }
}

// The bits of `bits` waiting in some member's row, with the rest of their groups (a group's
// members wait or leave together), turned into the requests they meant (`was` for a changed
// entry's bit, else what the cache says now), one batch per rank: its members of a group
// reach the coordinator together (Coordinator::AddRequests).
void EngineImpl::DemoteBits(ProcessSetState& ps, std::vector<uint64_t> bits,
                            const std::vector<std::pair<uint32_t, Request>>& was) {
  const size_t slots = ps.bit_since.size();
  bits.resize((slots + 63) / 64, 0);
  if (slots % 64 != 0 && !bits.empty()) bits.back() &= (uint64_t{1} << (slots % 64)) - 1;
  // The common case costs a look at the bits only: none of them waits in a row.
  auto waiting = [&ps, &bits] {
    for (size_t w = 0; w < bits.size(); ++w) {
      for (uint64_t word = bits[w]; word; word &= word - 1) {
        if (ps.bit_since[w * 64 + __builtin_ctzll(word)] != Clock::time_point()) return true;
      }
    }
    return false;
  };
  std::vector<std::string> groups;
  for (const auto& [bit, r] : was) {
    if (r.group_size > 1) groups.push_back(r.group);
  }
  ps.cache->WidenToGroups(&bits, groups);  // (a word-by-word check where no group is cached)
  if (!waiting()) return;
  std::unordered_map<uint32_t, const Request*> meant;  // what `was` says a bit meant
  meant.reserve(was.size());
  for (const auto& [bit, r] : was) meant.emplace(bit, &r);
  const size_t members = ps.ready_bits.size();
  std::vector<std::vector<Request>> batch(members);
  std::vector<std::vector<Clock::time_point>> since(members);
  for (size_t w = 0; w < bits.size(); ++w) {
    for (uint64_t word = bits[w]; word; word &= word - 1) {
      const uint32_t bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(word));
      if (bit >= slots || ps.bit_since[bit] == Clock::time_point()) continue;  // in no row
      const Clock::time_point t = ps.bit_since[bit];  // the stall clock goes on from there
      ps.bit_since[bit] = Clock::time_point();
      Request r;
      if (auto m = meant.find(bit); m != meant.end()) {
        r = *m->second;
      } else if (!ps.cache->Decode(bit, ps.cache->epoch(), &r)) {
        continue;
      }
      r.process_set = ps.id;
      const uint64_t mask = uint64_t{1} << (bit % 64);
      for (size_t q = 0; q < members; ++q) {
        uint64_t& row = ps.ready_bits[q][w];
        if (!(row & mask)) continue;
        row &= ~mask;
        batch[q].push_back(r);
        since[q].push_back(t);
      }
    }
  }
  for (size_t q = 0; q < members; ++q) {
    if (!batch[q].empty()) {
      ps.coordinator->AddRequests(static_cast<int>(q), std::move(batch[q]), since[q]);
    }
  }
}

std::vector<uint64_t> EngineImpl::AgreedBits(const ProcessSetState& ps) {
  std::vector<uint64_t> agreed = ps.ready_bits[0];
  for (size_t q = 1; q < ps.ready_bits.size(); ++q) {
    for (size_t w = 0; w < agreed.size(); ++w) agreed[w] &= ps.ready_bits[q][w];
  }
  // A group only whole. Each rank's row holds a group's members all or none (LookupBits,
  // OfferList, DemoteBits), so this only guards that rule.
  ps.cache->CloseGroups(&agreed);
  const bool any = std::any_of(agreed.begin(), agreed.end(), [](uint64_t w) { return w != 0; });
  if (!any) agreed.clear();
  return agreed;
}

std::vector<uint64_t> EngineImpl::AgreeOnBits(ProcessSetState& ps) {
  std::vector<uint64_t> agreed = AgreedBits(ps);
  for (size_t w = 0; w < agreed.size(); ++w) {
    for (auto& row : ps.ready_bits) row[w] &= ~agreed[w];
    for (uint64_t word = agreed[w]; word; word &= word - 1) {
      ps.bit_since[w * 64 + __builtin_ctzll(word)] = Clock::time_point();
    }
  }
  return agreed;
}

void EngineImpl::DemoteLateBits(ProcessSetState& ps, Clock::time_point now) {
  if (now - ps.bits_checked < std::chrono::milliseconds(100)) return;
  ps.bits_checked = now;
  std::vector<uint64_t> late;
  for (size_t bit = 0; bit < ps.bit_since.size(); ++bit) {
    if (ps.bit_since[bit] != Clock::time_point() && now - ps.bit_since[bit] > kBitPatience) {
      if (late.empty()) late.resize((ps.bit_since.size() + 63) / 64, 0);
      late[bit / 64] |= uint64_t{1} << (bit % 64);
    }
  }
  if (!late.empty()) DemoteBits(ps, std::move(late));
}

Status EngineImpl::OnResponses(ResponseList&& list) {
  ProcessSetState* found = FindSet(list.process_set);
  if (found == nullptr || found->rank < 0) {
    return Status::InvalidArgument("responses for process set " + std::to_string(list.process_set) +
                                   ", which this rank is not a member of");
  }
  ProcessSetState& ps = *found;
  for (auto& r : list.responses) {
    if (!r.cache_bits.empty()) {
      std::vector<uint32_t> bits = std::move(r.cache_bits);
      if (!ps.cache->Rebuild(bits, &r)) {
        return Status::InvalidArgument("response names an empty response-cache bit");
      }
    }
    HVD_RETURN_IF_ERROR(CheckResponse(r, static_cast<int>(ps.ranks.size())));
  }
  // The agreed bits' responses, after the list's others, as on rank 0 (CoordinatorStep).
  std::shared_ptr<std::vector<Response>> step;
  if (!list.ready_bits.empty()) {
    const auto rebuild = Clock::now();
    size_t bytes = 0;
    step = StepResponses(ps, list.ready_bits, list.fusion_threshold, list.knobs, &bytes);
    if (!step) return Status::InvalidArgument("ready bits name an empty response-cache bit");
    CountBookkeeping(Clock::now() - rebuild);
  }
  for (auto& r : list.responses) {
    r.process_set = ps.id;
    r.knobs = list.knobs;
  }
  if (Symmetric(ps)) {
    std::vector<std::pair<uint32_t, Request>> changed;
    ps.cache->Apply(list.responses, &changed);
    FitBits(ps);
    OnCacheChanged(changed);
  } else {
    ps.cache->Apply(list.responses);
    FitBits(ps);
  }
  if (ps.id == kGlobalProcessSet) ApplyProcessSets(list.responses);
  for (auto& r : list.responses) to_execute_.push_back(QueuedResponse{std::move(r)});
  if (step) QueueStep(step);
  return Status::OK();
}

size_t EngineImpl::FusionThreshold() const {
  return autotune_ ? autotune_->current().fusion_bytes : options_.fusion_threshold_bytes;
}

double EngineImpl::CycleTimeMs() const {
  return autotune_ ? autotune_->current().cycle_ms : options_.cycle_time_ms;
}

// What autotune samples now, once per phase, and what it chose (info).
void EngineImpl::ReportAutotune() {
  static const char* const kPhases[] = {"the cycle time", "the fusion threshold",
                                        "the hierarchical allreduce choice",
                                        "the recursive doubling threshold"};
  const int phase = autotune_->done() ? 4 : autotune_->phase();
  if (phase == autotune_reported_) return;
  autotune_reported_ = phase;
  if (phase < 4) {
    HVD_LOG(kInfo) << "autotune: sampling " << kPhases[phase] << " ("
                   << autotune_->candidates().size() << " candidates)";
    return;
  }
  const Autotuner::Setting& s = autotune_->current();
  const int32_t h = s.knobs.hierarchical_allreduce;
  HVD_LOG(kInfo) << "autotune: chose fusion threshold " << s.fusion_bytes << " bytes, cycle time "
                 << s.cycle_ms << " ms, hierarchical allreduce "
                 << (h == 1 ? "on" : h == 2 ? "off" : "auto") << ", recursive doubling up to "
                 << s.knobs.small_allreduce_bytes << " bytes";
}

PlanKnobs EngineImpl::Knobs() const {
  return autotune_ ? autotune_->current().knobs : DefaultKnobs(options_);
}

Clock::duration EngineImpl::CycleWindow() const {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(CycleTimeMs()));
}

// When the agreed bits go out: HVD_CYCLE_TIME after the first became agreed, or, while a member
// has announced a cached tensor that another has not, up to kStragglerHold after. A step's
// tensors are then still arriving on some rank (its caller part of the way through enqueuing
// them, or waiting for a core), and what is agreed now would run as a collective of its own with
// the rest in another after it: on ranks that share cores, each collective's hand-offs cost
// more than its tensors. The last of a step's tensors (every member has announced whatever any
// has) never wait, and a cached tensor that only some members announce waits no longer than
// the hold: Horovod's cycle time holds every response 1 ms.
Clock::time_point EngineImpl::AgreedGoAt(const ProcessSetState& ps) const {
  const Clock::time_point cycle = ps.agreed_since + CycleWindow();
  const Clock::time_point hold = ps.agreed_since + kStragglerHold;
  if (hold <= cycle) return cycle;
  const size_t words = ps.ready_bits.empty() ? 0 : ps.ready_bits[0].size();
  for (size_t w = 0; w < words; ++w) {
    uint64_t any = 0, all = ~uint64_t{0};
    for (const auto& row : ps.ready_bits) {
      any |= row[w];
      all &= row[w];
    }
    if (any != all) return hold;
  }
  return cycle;
}

// What waits on rank 0's clock (responses gathering more tensors for HVD_CYCLE_TIME, agreed
// bits held for a straggler) and how long until it goes: the loop works then, whether it spins
// or sleeps. Only waits that the loop's next pass ends count: none while shutdown is decided,
// and none of rank 0's lists while its part of a round is out (a message ends that wait).
Clock::duration EngineImpl::CycleRemaining() const {
  Clock::duration left = Clock::duration::max();
  if (shutdown_by_ >= 0) return left;
  const bool cycle = CycleTimeMs() > 0;
  const auto now = Clock::now();
  if (rounds_ && !rounds_->sent) {
    // A round this rank has news for starts HVD_CYCLE_TIME after its last (rounds.cc).
    if (cycle && PartHasNews()) {
      left = rounds_->started + CycleWindow() - now;
    }
    // Rank 0 starts the round that ends a hold (RoundNews).
    if (coordinator() && rounds_->holding) {
      left = std::min(left, rounds_->holding_since + kStragglerHold - now);
    }
    // A part held for a burst's pause goes when it ends.
    left = std::min(left, BurstHoldRemaining(now));
  }
  for (const auto& kv : sets_) {
    if (!coordinator() || (rounds_ && rounds_->sent)) break;
    const ProcessSetState& ps = *kv.second;
    if (!ps.coordinator) continue;
    if (cycle && ps.coordinator->has_ready()) {
      left = std::min(left, ps.coordinator->ready_since() + CycleWindow() - now);
    }
    if (ps.agreed_since != Clock::time_point()) left = std::min(left, AgreedGoAt(ps) - now);
  }
  return std::max(left, Clock::duration::zero());
}

// Each process set's coordinator in turn (a set waiting on a slow member holds back no other).
void EngineImpl::CoordinatorStep() {
  // No list goes out while rank 0's part of a round is (rounds.cc: the order of lists and rounds).
  if (rounds_ && rounds_->sent) return;
  StepCoordinators([](const ProcessSetState&) { return true; });
}

void EngineImpl::StepCoordinators(const std::function<bool(const ProcessSetState&)>& which) {
  const auto now = Clock::now();
  bool sent = false;
  // Stepping the global set may add a set: iterators of a std::map stay valid.
  for (auto& kv : sets_) {
    ProcessSetState& ps = *kv.second;
    if (ps.coordinator && which(ps) && abort_.ok()) sent = CoordinatorStep(ps, now) || sent;
  }
  if (sent) CountNegotiation(now);
}

// Only sets without rank 0: rank 0 executes its own sets' responses in list order, after this
// one, and the global set holds every rank. The lists go out in rank 0's one order of lists,
// so two sets that share members still run in the same order on each; and, as everywhere, not
// while rank 0's part of a round is out (rounds.cc).
void EngineImpl::StepSetsAside(int32_t set) {
  if (!in_collective_ || !coordinator() || (rounds_ && rounds_->sent) || !abort_.ok()) return;
  StepCoordinators(
      [set](const ProcessSetState& ps) { return ps.rank < 0 && (set < 0 || ps.id == set); });
}

Clock::duration EngineImpl::CountNegotiation(Clock::time_point since) {
  const Clock::duration d = Clock::now() - since;
  negotiation_ns_.fetch_add(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()),
      std::memory_order_relaxed);
  return d;
}

void EngineImpl::CountBookkeeping(Clock::duration d) {
  bookkeeping_ns_.fetch_add(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()),
      std::memory_order_relaxed);
}

// One response list of a set, sent to its members: the coordinator's responses (after
// HVD_CYCLE_TIME), then the cached tensors every member has announced (at once).
bool EngineImpl::CoordinatorStep(ProcessSetState& ps, Clock::time_point now) {
  Coordinator& coordinator = *ps.coordinator;
  const size_t threshold = FusionThreshold();
  coordinator.set_fusion_threshold(threshold);
  coordinator.CheckStalls(now);
  if (!coordinator.stall_shutdown().empty() && abort_.ok()) {
    // Every rank fails, as for a lost peer (RunLoop): the coordinator's Timeout names the
    // ranks that never submitted the tensor. Each rank leaves its failure note (none of them
    // failed on its own: the missing ranks are the cause).
    abort_ = Status::Timeout(coordinator.stall_shutdown());
    BroadcastControl(static_cast<uint8_t>(MessageType::kAbort), AbortPayload(abort_));
    transport_->Abort(abort_);
    return false;
  }
  DemoteLateBits(ps, now);
  std::vector<Response> ready;
  if (!coordinator.has_ready() || coordinator.ready_since() + CycleWindow() <= now) {
    ready = coordinator.ComputeResponses();
  }
  // Agreed bits wait HVD_CYCLE_TIME too, from when the first became agreed.
  if (ps.bits_changed) {
    ps.bits_changed = false;
    if (ps.agreed_since == Clock::time_point() && !AgreedBits(ps).empty()) ps.agreed_since = now;
  }
  std::vector<uint64_t> agreed;
  if (ps.agreed_since != Clock::time_point() && now >= AgreedGoAt(ps)) {
    agreed = AgreeOnBits(ps);
    ps.agreed_since = Clock::time_point();
  }
  if (ready.empty() && agreed.empty()) return false;
  const PlanKnobs knobs = Knobs();
  for (auto& r : ready) {
    r.process_set = ps.id;
    r.knobs = knobs;
  }
  // Gives added sets their ids before the list goes out (it may turn one into an error).
  if (ps.id == kGlobalProcessSet) ApplyProcessSets(ready);
  if (options_.size > 1) {
    ResponseList wire;
    wire.process_set = ps.id;
    for (const auto& r : ready) {
      Response w;
      if (ps.cache->Encodable(r, &w.cache_bits)) {
        cache_hits_.fetch_add(1);
      } else {
        w = r;
      }
      wire.responses.push_back(std::move(w));
    }
    wire.ready_bits = agreed;
    wire.fusion_threshold = threshold;
    wire.knobs = knobs;
    wire.after_round = rounds_ ? rounds_->done : 0;
    BroadcastControl(static_cast<uint8_t>(MessageType::kResponses), Payload(Encode(wire)),
                     &ps.ranks);
    negotiation_messages_.fetch_add(1, std::memory_order_relaxed);
  }
  // The agreed bits' responses run after the list's others, as on the workers (OnResponses);
  // a step like the one before takes its responses again. Built before the list is applied:
  // the agreed tensors are marked used first, on every rank alike (ResponseCache).
  std::shared_ptr<std::vector<Response>> step;
  size_t bytes = 0;
  if (!agreed.empty()) {
    const auto rebuild = Clock::now();
    step = StepResponses(ps, agreed, threshold, knobs, &bytes);
    CountBookkeeping(Clock::now() - rebuild);
  }
  ApplyOnRankZero(ps, ready);
  if (autotune_) {
    for (const auto& r : ready) bytes += ResponseBytes(r);
    autotune_->Record(bytes, now);
    ReportAutotune();
  }
  if (ps.rank < 0) return true;  // rank 0 coordinates a set it is not a member of
  for (auto& r : ready) to_execute_.push_back(QueuedResponse{std::move(r)});
  if (step) QueueStep(step);
  return true;
}

// Applying a list may give a bit to another tensor: bits still waiting on such an entry go to
// the coordinator as the requests they meant. Only the bits the list changed are looked at, so
// a list costs nothing per waiting tensor.
void EngineImpl::ApplyOnRankZero(ProcessSetState& ps, std::vector<Response>& list) {
  std::vector<std::pair<uint32_t, Request>> changed;
  ps.cache->Apply(list, &changed);
  FitBits(ps);
  if (Symmetric(ps)) return OnCacheChanged(changed);
  if (changed.empty()) return;
  std::vector<uint64_t> bits;
  for (const auto& c : changed) {
    if (bits.size() <= c.first / 64) bits.resize(c.first / 64 + 1, 0);
    bits[c.first / 64] |= uint64_t{1} << (c.first % 64);
  }
  DemoteBits(ps, std::move(bits), changed);
}

void EngineImpl::BroadcastControl(uint8_t type, std::shared_ptr<const std::vector<uint8_t>> p,
                                  const std::vector<int>* members) {
  if (members == nullptr) {
    for (auto& c : control_) {
      if (c && c->open()) c->Send(type, p);
    }
    return;
  }
  for (int w : *members) {
    if (w == options_.rank || static_cast<size_t>(w) >= control_.size()) continue;
    auto& c = control_[w];
    if (c && c->open()) c->Send(type, p);
  }
}

// ---------------------------------------------------------------- process sets
//
// Adding and removing a set are requests of the global set (OpType::kProcessSet), negotiated like a
// barrier, so every rank agrees on the ranks and on the order. Rank 0 checks the set and gives it
// an id as it makes the response (a removed set's, first removed first, else the next unused one;
// engine_impl.h says why a given-again id is safe); each rank sets the set up for negotiation as it
// applies that response list (before any response of the new set can reach it on the same link),
// and lets callers use it as it executes the response. A removal stops rank 0 taking the set's
// requests at once; each member fails its operations of the set still in flight as it executes the
// removal.

ProcessSetState* EngineImpl::FindSet(int32_t id) {
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second.get();
}

std::unique_ptr<ProcessSetState> EngineImpl::NewSet(int32_t id, std::vector<int> ranks) {
  auto ps = std::make_unique<ProcessSetState>();
  ps->id = id;
  ps->ranks = std::move(ranks);
  const int n = static_cast<int>(ps->ranks.size());
  auto me = std::lower_bound(ps->ranks.begin(), ps->ranks.end(), options_.rank);
  if (me != ps->ranks.end() && *me == options_.rank) ps->rank = static_cast<int>(me - ps->ranks.begin());
  ps->cache = std::make_unique<ResponseCache>(options_.cache_capacity, coordinator());
  if (ps->rank >= 0) {
    auto comm = std::make_unique<Comm>();
    comm->rank = ps->rank;
    comm->size = n;
    comm->plan.size = n;
    comm->plan.hierarchical_allreduce = options_.hierarchical_allreduce;
    comm->plan.hierarchical_allgather = options_.hierarchical_allgather;
    comm->t = transport_.get();
    if (id != kGlobalProcessSet) {
      auto view = GroupView::Create(*transport_, ps->ranks);
      if (view.ok()) {
        comm->view = std::move(*view);
        comm->t = comm->view.get();
      } else {
        HVD_LOG(kError) << "process set " << id << ": " << view.status().message();
      }
    }
    if (n > 1 && topology_.size() == options_.size) {
      Topology sub;  // where the members run, counted in the set
      for (int w : ps->ranks) sub.host_of.push_back(topology_.host_of[w]);
      Status s = SetUpViews(*comm, sub, id == kGlobalProcessSet ? layout_note_ : "");
      if (!s.ok()) {
        HVD_LOG(kWarning) << "process set " << id << " runs flat: " << s.message();
      }
    }
    ps->comm = std::move(comm);
  }
  if (coordinator()) {
    ps->coordinator = std::make_unique<Coordinator>(n, options_.fusion_threshold_bytes,
                                                    options_.stall_check_seconds,
                                                    options_.stall_shutdown_seconds);
    if (id != kGlobalProcessSet) ps->coordinator->SetProcessSet(id, ps->ranks);
    ps->ready_bits.assign(n, std::vector<uint64_t>());  // (FitBits: none given out yet)
    ps->worker_epochs.assign(n, 0);
  }
  return ps;
}

// The fast path's bit vectors span the bits the set's cache has given out, not
// HVD_CACHE_CAPACITY: a step's bit operations (the AND, the copies, the checks for late bits)
// cost the names in use, however large the capacity (sized to it, a 4-byte allreduce took
// milliseconds at a capacity of 4 Mi). The cache gives bits out lowest first and never takes
// one back, so they only grow, as an Apply gives new names bits.
void EngineImpl::FitBits(ProcessSetState& ps) {
  const size_t slots = ps.cache->slots();
  const size_t words = (slots + 63) / 64;
  if (ps.coordinator && ps.bit_since.size() < slots) {
    for (auto& row : ps.ready_bits) row.resize(words, 0);
    ps.bit_since.resize(slots, Clock::time_point());
  }
  if (rounds_ && ps.id == kGlobalProcessSet && rounds_->since.size() < slots) {
    rounds_->ready.resize(words, 0);
    rounds_->withdraw.resize(words, 0);
    rounds_->missing.resize(words, 0);
    rounds_->since.resize(slots, Clock::time_point());
  }
}

// As a list of the global set is applied. On rank 0 (before the list goes out) an addition
// gets its id, or becomes an error when a set with those ranks exists; a removal of a set that
// does not exist becomes an error.
void EngineImpl::ApplyProcessSets(std::vector<Response>& list) {
  for (auto& r : list) {
    if (r.type != OpType::kProcessSet) continue;
    std::string error;
    if (!r.sizes.empty()) {
      std::vector<int> ranks(r.sizes.begin(), r.sizes.end());
      if (coordinator()) {
        for (const auto& kv : sets_) {
          if (!kv.second->removed && kv.second->ranks == ranks) {
            error = "a process set with these ranks exists already (id " +
                    std::to_string(kv.first) + ")";
          }
        }
        if (error.empty()) {
          if (free_set_ids_.empty()) {
            r.root = next_set_id_++;
          } else {
            r.root = free_set_ids_.front();
            free_set_ids_.pop_front();
          }
        }
      }
      if (error.empty() && !FindSet(r.root)) sets_[r.root] = NewSet(r.root, std::move(ranks));
    } else {
      ProcessSetState* ps = FindSet(r.root);
      if (ps == nullptr || ps->removed) {
        error = "there is no process set " + std::to_string(r.root) + " to remove";
      } else {
        ps->removed = true;
        ps->coordinator.reset();
      }
    }
    if (!error.empty()) {
      Response e;
      e.type = OpType::kError;
      e.names = r.names;
      e.error = error;
      e.process_set = r.process_set;
      r = std::move(e);
    }
  }
}

Status EngineImpl::ExecuteProcessSet(const Response& r, std::vector<TensorEntry*>& entries) {
  const int32_t id = r.root;
  if (!r.sizes.empty()) {
    {
      std::lock_guard<SpinLock> l(mu_);
      known_sets_[id].ranks.assign(r.sizes.begin(), r.sizes.end());
    }
    for (auto* e : entries) {
      if (e) e->handle->process_set_id_ = id;
    }
    return Status::OK();
  }
  {
    std::lock_guard<SpinLock> l(mu_);
    known_sets_.erase(id);
  }
  const Status gone = Status::FailedPrecondition(
      "process set " + std::to_string(id) + " was removed while this operation was in flight");
  std::vector<TensorEntry*> stranded;  // drained; the queued ones fail as they are drained
  {
    std::lock_guard<SpinLock> l(mu_);
    in_flight_.ForEachLive([&](TensorEntry& e) {
      if (e.drained && e.request.process_set == id) stranded.push_back(&e);
    });
  }
  for (TensorEntry* e : stranded) {
    CompleteEntry(*e, gone.WithContext(std::string(OpTypeName(e->request.type)) + " '" +
                                       e->request.name + "'"));
  }
  sets_.erase(id);
  if (coordinator()) free_set_ids_.push_back(id);  // for a later addition (ApplyProcessSets)
  return Status::OK();
}

// Liveness: every background thread sends a heartbeat on its control connections each
// interval, from a timer that also fires inside long collectives (they run io_). A peer silent
// for longer than HVD_TIMEOUT_SECONDS (stopped, hung, unreachable) fails the job with Timeout
// naming it, so no rank waits forever on a negotiation that cannot finish.
void EngineImpl::StartHeartbeat() {
  last_heard_.assign(control_.size(), Clock::now());
  heartbeat_ = std::make_unique<asio::steady_timer>(io_);
  heartbeat_->expires_at(Clock::now());  // (the first run is not a late one)
  OnHeartbeatTimer();
}

void EngineImpl::OnHeartbeatTimer() {
  if (done_ || !abort_.ok()) return;
  auto now = Clock::now();
  last_tick_ = now;
  if (heartbeat_ &&
      std::chrono::duration<double>(now - heartbeat_->expiry()).count() >=
          options_.timeout_seconds / 2) {
    held_up_until_ = now + std::chrono::seconds(1);
  }
  auto limit = std::chrono::duration<double>(options_.timeout_seconds);
  const auto limit_d = std::chrono::duration_cast<Clock::duration>(limit);
  auto empty = Payload({});
  // The next tick: the heartbeat period, or sooner where a peer's silence reaches the limit
  // before that, so that a silent peer is found at HVD_TIMEOUT_SECONDS, not up to a period
  // later. A live peer's heartbeats keep its limit a period or more away.
  auto interval = std::min(std::chrono::duration<double>(1.0), limit / 4);
  const auto interval_d = std::chrono::duration_cast<Clock::duration>(interval);
  Clock::time_point next = now + interval_d;
  // A tick an interval or more late: this thread was held up itself (long work between two
  // polls), and what the peers sent meanwhile may still be unread. Their silence is judged at
  // the next tick, at once, after this poll has read it.
  const bool held_up = now - heartbeat_->expiry() >= interval_d;
  // The control rings of this host's ranks first: while this rank's `polling` flag is up (in a
  // collective) their senders do not ring it, and what they sent may be waiting there unread.
  if (poller_) poller_->Poll();
  if (held_up) next = now + std::chrono::milliseconds(1);
  for (auto& c : control_) {
    if (!c || !c->open()) continue;
    next = std::min(next, last_heard_[c->peer()] + limit_d);
    if (!held_up && now - last_heard_[c->peer()] >= limit_d) {
      std::ostringstream os;
      os << "nothing heard for " << options_.timeout_seconds
         << " s (HVD_TIMEOUT_SECONDS): the process is stopped, hung or unreachable";
      return OnControlError(c->peer(), os.str(), StatusCode::kTimeout);
    }
    c->Send(static_cast<uint8_t>(MessageType::kHeartbeat), empty);
  }
  StepSetsAside();  // stalls and HVD_CYCLE_TIME of the sets rank 0 is not in
  heartbeat_->expires_at(std::max(next, now + std::chrono::milliseconds(1)));
  heartbeat_->async_wait([this](const asio::error_code& ec) {
    if (!ec) OnHeartbeatTimer();
  });
}

Status EngineImpl::PollControlPlane() {
  if (poller_) poller_->Poll();
  if (io_.stopped()) io_.restart();
  io_.poll();
  return abort_;
}

void EngineImpl::KeeperPoll() {
  try {
    PollControlPlane();
  } catch (...) {
    if (!abort_.ok()) return;  // (said once: the keeper may poll again before the call returns)
    abort_ = Status::Internal("rank " + std::to_string(options_.rank) +
                              ": hvd's control plane, polled while a framework's allocator or "
                              "CUDA ran, stopped on an exception: " +
                              ExceptionMessage(std::current_exception()));
    failing_on_own_ = true;
    HVD_LOG(kError) << abort_.message();
  }
}

// Said to every rank before the job's links close, so that each survivor names this rank:
// their data-plane waits stalled as long as the call ran, and each would blame the peer it
// waits on (in a ring, mostly another survivor). This rank's own operation fails too once the
// call returns (its transport is aborted), instead of succeeding where the others failed. A
// world of one has no one to wait for it: the call goes on, as slow as it is.
void EngineImpl::KeeperGaveUp(Clock::duration ran) {
  if (!abort_.ok() || options_.size <= 1 || shutdown_by_ >= 0 || done_) return;
  std::ostringstream os;
  os << "rank " << options_.rank << " stuck: code that is not hvd's (a framework's output "
     << "allocator, or CUDA allocating or freeing memory) ran on it for "
     << std::chrono::duration<double>(ran).count()
     << " s, HVD_TIMEOUT_SECONDS or more, inside a collective; the job's collectives are "
        "abandoned";
  try {
    abort_ = Status::Timeout(os.str());
    failing_on_own_ = true;
    HVD_LOG(kError) << abort_.message();
    if (coordinator()) {
      BroadcastControl(static_cast<uint8_t>(MessageType::kAbort), AbortPayload(abort_));
    } else if (control_.size() == 1 && control_[0] && control_[0]->open()) {
      control_[0]->Send(static_cast<uint8_t>(MessageType::kAbort), AbortPayload(abort_));
    }
    FlushControl(Clock::now() + std::chrono::seconds(1));
    transport_->Abort(abort_);
  } catch (...) {
    HVD_LOG(kError) << "rank " << options_.rank << ": telling the others that this rank is "
                    << "stuck failed: " << ExceptionMessage(std::current_exception());
  }
}

// A collective that broke because a survivor closed its connections names that survivor;
// the rank that saw the real loss tells the coordinator, which tells everyone. Wait briefly
// for that message so that every survivor reports the rank that was actually lost.
Status EngineImpl::AwaitRootCause(const Status& local, Clock::duration wait) {
  auto limit = Clock::now() + wait;
  // (A collective runs with the control rings' flag up: down, so that the message rings.)
  StopPolling();
  while (abort_.ok() && Clock::now() < limit) {
    if (poller_ && poller_->Poll()) continue;
    if (io_.stopped()) io_.restart();
    io_.run_one_for(std::chrono::milliseconds(50));
  }
  return abort_.ok() ? local : abort_;
}

void EngineImpl::OnControlMessage(int peer, uint8_t type, std::vector<uint8_t>&& payload) {
  auto mt = static_cast<MessageType>(type);
  if (peer >= 0 && static_cast<size_t>(peer) < last_heard_.size()) last_heard_[peer] = Clock::now();
  if (mt == MessageType::kHeartbeat) return;
  if (mt == MessageType::kRound) {
    Status s = OnRoundPart(peer, payload);
    if (!s.ok()) return OnControlError(peer, s.message());
  } else if (!coordinator() && peer != 0) {
    // Between workers only rounds travel.
    OnControlError(peer, "unexpected message type " + std::to_string(type) + " from a worker");
  } else if (mt == MessageType::kRequests && coordinator()) {
    const auto start = Clock::now();
    RequestList list;
    Status s = Decode(payload.data(), payload.size(), &list);
    const int32_t set = list.process_set;
    if (s.ok()) s = OnRequests(peer, std::move(list));
    if (!s.ok()) return OnControlError(peer, s.message());
    CountNegotiation(start);
    StepSetsAside(set);
  } else if (mt == MessageType::kResponses && !coordinator()) {
    const auto start = Clock::now();
    ResponseList list;
    Status s = Decode(payload.data(), payload.size(), &list);
    if (s.ok() && rounds_ && list.after_round > rounds_->done + 1) {
      s = Status::InvalidArgument("a response list for after round " +
                                  std::to_string(list.after_round) + ", but this rank has not sent "
                                  "its part of round " + std::to_string(rounds_->done + 2));
    }
    if (s.ok() && rounds_ && (list.after_round > rounds_->done || !rounds_->held.empty())) {
      rounds_->held.push_back(std::move(list));  // runs after that round (rounds.cc)
    } else if (s.ok()) {
      s = OnResponses(std::move(list));
    }
    if (!s.ok()) return OnControlError(peer, s.message());
    CountNegotiation(start);
  } else if (mt == MessageType::kShutdown && (payload.size() == 4 || payload.size() == 12)) {
    // The rank that called shutdown; from rank 0, also the rounds it completed (rounds.cc).
    int by;
    std::memcpy(&by, payload.data(), 4);
    if (payload.size() == 12 && !coordinator()) {
      std::memcpy(&shutdown_after_round_, payload.data() + 4, 8);
    }
    if (shutdown_by_ < 0) shutdown_by_ = (by >= 0 && by < options_.size) ? by : peer;
  } else if (mt == MessageType::kAbort) {
    if (!abort_.ok()) return;  // the first cause is the one reported
    Status why = AbortStatus(payload);
    // Heard by the rank the others gave up on (stopped, or held up, for longer than
    // HVD_TIMEOUT_SECONDS, and going on now): it says that it is this one.
    auto this_one = [](const Status& s) {
      return Status(s.code(), s.message() +
                                  " (that is this rank: the others heard nothing from it for "
                                  "HVD_TIMEOUT_SECONDS and ended the job's collectives)");
    };
    if (coordinator()) {
      // A worker saw the communicator break: tell everyone else. Where it blames rank 0, what
      // rank 0 sees instead, unless rank 0 was held up itself (its heartbeat timer ran that
      // long ago: the silences it sees are its own, and the verdict stands).
      Status relay = why;
      if (BlamesRank(why.message(), 0)) {
        if (HeldUp()) {
          why = this_one(why);
        } else {
          relay = why = BlameSeenByCoordinator(peer, why);
        }
      } else if (why.code() == StatusCode::kTimeout &&
                 why.message().rfind("rank " + std::to_string(peer) + " stuck:", 0) != 0) {
        bool unsure = false;
        relay = why = BlameSeenByWorker(peer, why, &unsure);
        if (unsure) return HoldVerdict(why);
      }
      BroadcastControl(type, AbortPayload(relay));
    } else if (why.message().find("rank " + std::to_string(options_.rank) + " lost:") !=
               std::string::npos) {  // (not "rank N lost touch with rank 0")
      why = this_one(why);
    }
    abort_ = std::move(why);
    transport_->Abort(abort_);
  } else {
    OnControlError(peer, "unexpected control message type " + std::to_string(type));
  }
}

bool EngineImpl::HeldUp() const {
  const auto now = Clock::now();
  return now < held_up_until_ ||
         std::chrono::duration<double>(now - last_tick_).count() >= options_.timeout_seconds / 2;
}

// A worker's verdict that blames rank 0 (it heard nothing from rank 0, or its data-plane wait
// on rank 0 timed out) comes to rank 0, which is running: relayed as it is, every rank, rank 0
// included, reported rank 0 lost, and hvdrun pointed at rank 0's host. After a network cut
// between hosts heals, the verdicts of the ranks beyond the cut reach rank 0 as it judges them
// itself: the rank that rank 0 has not heard from longest is named where that silence is half
// of HVD_TIMEOUT_SECONDS or more (the cut host's), else the worker that lost touch with rank 0.
// (Not where rank 0 itself was held up: OnControlMessage.)
Status EngineImpl::BlameSeenByCoordinator(int from, const Status& why) const {
  const auto now = Clock::now();
  int quiet = -1;
  for (size_t q = 1; q < last_heard_.size(); ++q) {
    if (static_cast<int>(q) == from || q >= control_.size() || !control_[q]) continue;
    if (quiet < 0 || last_heard_[q] < last_heard_[quiet]) quiet = static_cast<int>(q);
  }
  const double silent =
      quiet < 0 ? 0 : std::chrono::duration<double>(now - last_heard_[quiet]).count();
  std::ostringstream os;
  if (quiet >= 0 && silent >= options_.timeout_seconds / 2) {
    os << "rank " << quiet << " lost: control connection: nothing heard for " << silent
       << " s (rank " << from << ", which lost touch with rank 0 meanwhile, said: "
       << why.message() << ")";
  } else {
    os << "rank " << from << " lost touch with rank 0 (the coordinator), which runs: "
       << why.message();
  }
  return Status(why.code(), os.str());
}

// The rank named by a data-plane verdict ("... from rank 3", "... to rank 3", "waiting for
// rank 3"), or -1.
static int NamedPeer(const std::string& message) {
  for (const char* side : {"from rank ", "to rank ", "waiting for rank "}) {
    const size_t i = message.find(side);
    if (i == std::string::npos) continue;
    const char* at = message.c_str() + i + std::strlen(side);
    if (!std::isdigit(static_cast<unsigned char>(*at))) continue;
    return static_cast<int>(std::strtol(at, nullptr, 10));
  }
  return -1;
}

// A wait of rank `from` on worker X timed out (no byte moved for HVD_TIMEOUT_SECONDS). Rank 0
// hears heartbeats from every worker, so it can tell the cases apart that the ranks in the
// data plane cannot: X silent to rank 0 too (stopped, gone: the verdict stands); X heard, but
// another worker silent for half of HVD_TIMEOUT_SECONDS or more (X waited on that one in turn:
// it is named instead); X heard and no worker silent (X runs: the link between the two carried
// nothing, or X waits on a rank that waits in turn). The verdict says which rank saw it, so
// that every rank, and hvdrun's summary, reports it as that rank's, not as its own.
Status EngineImpl::BlameSeenByWorker(int from, const Status& why, bool* unsure) const {
  const int x = NamedPeer(why.message());
  std::string msg = why.message();
  const std::string seen = "(rank " + std::to_string(from) + ")";
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  if (msg.find(seen) == std::string::npos) os << " (seen by rank " << from << ")";
  auto silence = [&](int q) {
    return std::chrono::duration<double>(Clock::now() - last_heard_[q]).count();
  };
  auto heard = [&](int q) {
    return q > 0 && static_cast<size_t>(q) < last_heard_.size() &&
           static_cast<size_t>(q) < control_.size() && control_[q];
  };
  // Rank 0 held up itself (stopped, say): what it heard last says nothing of the others now.
  if (HeldUp()) return Status(why.code(), msg + os.str());
  // (Named already where this rank's own connection drops what it sends: tcp_transport.cc.)
  if (x == from || msg.find("drops what is sent on it") != std::string::npos) {
    return Status(why.code(), msg + os.str());
  }
  if (!heard(x)) {
    // A wait that names no rank (an MPI or device collective's): a rank stuck in code that is
    // not hvd's may yet report itself (HoldVerdict).
    if (unsure && x < 0) *unsure = true;
    return Status(why.code(), msg + os.str());
  }
  const double half = options_.timeout_seconds / 2;
  if (silence(x) >= half) {
    os << "; rank 0 has heard nothing from rank " << x << " for " << silence(x) << " s either";
    return Status(why.code(), msg + os.str());
  }
  int quiet = -1;
  for (int q = 1; q < static_cast<int>(last_heard_.size()); ++q) {
    if (q == from || q == x || !heard(q)) continue;
    if (quiet < 0 || last_heard_[q] < last_heard_[quiet]) quiet = q;
  }
  if (quiet >= 0 && silence(quiet) >= half) {
    std::ostringstream lost;
    lost << std::fixed << std::setprecision(1) << "rank " << quiet
         << " lost: control connection: nothing heard for " << silence(quiet)
         << " s (rank " << from << " said: " << msg << ")";
    return Status(why.code(), lost.str());
  }
  if (unsure) *unsure = true;
  os << "; rank " << x << " is running (rank 0 heard from it " << silence(x)
     << " s ago): the link between ranks " << from << " and " << x
     << " moved nothing, or rank " << x << " itself waited on another rank";
  return Status(why.code(), msg + os.str());
}

// A worker's timeout that names a rank rank 0 hears from (or names no rank) is held briefly
// before it goes to every rank: the rank named may be stuck in code that is not hvd's (a
// framework's allocator), and its own report of that (KeeperGaveUp) comes at about the same
// time, as its keeper counts the same HVD_TIMEOUT_SECONDS as the others' waits. That report,
// or any other verdict that comes meanwhile (a rank lost), is the one every rank gets; else
// the first one held.
void EngineImpl::HoldVerdict(const Status& why) {
  if (!held_verdict_.ok()) return;  // the first held stands
  held_verdict_ = why;
  if (!verdict_timer_) verdict_timer_ = std::make_unique<asio::steady_timer>(io_);
  verdict_timer_->expires_after(kVerdictHold);
  verdict_timer_->async_wait([this](const asio::error_code& ec) {
    if (!ec) ReleaseVerdict();
  });
}

void EngineImpl::ReleaseVerdict() {
  if (done_) return;  // (after Loop's end the members may be gone: the timer's late run)
  Status why = std::move(held_verdict_);
  held_verdict_ = Status::OK();
  if (why.ok() || !abort_.ok() || shutdown_by_ >= 0) return;
  BroadcastControl(static_cast<uint8_t>(MessageType::kAbort), AbortPayload(why));
  abort_ = std::move(why);
  transport_->Abort(abort_);
}

void EngineImpl::TellCoordinatorFirst(const Status& why) {
  if (coordinator() || !abort_.ok() || control_.size() != 1 || !control_[0] ||
      !control_[0]->open()) {
    return;
  }
  control_[0]->Send(static_cast<uint8_t>(MessageType::kAbort), AbortPayload(why));
  if (io_.stopped()) io_.restart();
  io_.poll();  // (on its way before this rank's wait for the root cause)
}

void EngineImpl::OnControlError(int peer, const std::string& what, StatusCode code) {
  if (shutdown_by_ >= 0 || done_) return;  // connections close as the job ends
  if (!abort_.ok()) return;                 // already failing for an earlier cause
  if (!coordinator() && peer != 0) return OnPeerLinkError(peer, what);
  std::ostringstream os;
  if (coordinator()) {
    os << "rank " << peer << " lost: control connection: " << what;
  } else {
    os << "rank 0 (the coordinator) lost: control connection: " << what;
  }
  Status s(code, os.str());
  HVD_LOG(kError) << s.message();
  if (coordinator()) BroadcastControl(static_cast<uint8_t>(MessageType::kAbort), AbortPayload(s));
  if (abort_.ok()) abort_ = s;
  transport_->Abort(abort_);
}

void EngineImpl::FailAll(const Status& status, bool notify) {
  if (notify && !coordinator() && control_.size() == 1 && control_[0] && control_[0]->open()) {
    // Tell the coordinator, which relays it, so that every rank fails fast.
    control_[0]->Send(static_cast<uint8_t>(MessageType::kAbort), AbortPayload(status));
  } else if (notify && coordinator()) {
    // Rank 0's own failure (a data-plane wait that timed out, say): the workers fail with its
    // cause rather than with its links closing ("rank 0 (the coordinator) lost"). One that
    // already failed ignores it.
    BroadcastControl(static_cast<uint8_t>(MessageType::kAbort), AbortPayload(status));
  }
  transport_->Abort(status);
  std::vector<HandlePtr> handles;  // of every entry, queued or drained
  std::vector<TensorEntry> gone;    // what they hold, let go of outside the lock (allocators,
                                    // device events)
  {
    std::lock_guard<SpinLock> l(mu_);
    if (dead_.ok()) dead_ = status;
    // With dead_, under the same hold: a caller refused from here on sees the note owed.
    if (!failing_on_own_) OweFailureNoteLocked(status);
    queue_.clear();
    in_flight_.ForEachLive([&](TensorEntry& e) {
      if (e.handle) handles.push_back(std::move(e.handle));
      gone.push_back(std::move(e));
    });
    in_flight_.Clear();
  }
  gone.clear();
  for (auto& kv : sets_) kv.second->node_of_bit.clear();
  if (!handles.empty()) PayOwedFailureNote();  // before those operations fail
  for (auto& h : handles) h->Complete(status);
  to_execute_.clear();
  FlushControl(Clock::now() + std::chrono::seconds(2));
  for (auto& c : control_) {
    if (c) c->Close();
  }
  for (auto& c : peers_) {
    if (c) c->Close();
  }
}

void EngineImpl::FinishShutdown(int requested_by) {
  if (coordinator() && options_.size > 1) {
    std::vector<uint8_t> p = IntPayload(requested_by);
    const uint64_t done = rounds_ ? rounds_->done : 0;  // the workers run these rounds first
    p.resize(12);
    std::memcpy(p.data() + 4, &done, 8);
    BroadcastControl(static_cast<uint8_t>(MessageType::kShutdown), Payload(std::move(p)));
  }
  // Another rank's shutdown: what ends its operations on this one. As Horovod says, the usual
  // cause is an exception on that rank, or its script ending while this one still runs
  // collectives.
  // This rank asked too (shutdown_sent_): the job's usual end, whichever rank came first.
  const std::string who = "rank " + std::to_string(requested_by);
  Status s = Status::Aborted(
      requested_by == options_.rank || shutdown_sent_
          ? "hvd has been shut down (rank " + std::to_string(options_.rank) +
                ", this one, called shutdown)"
          : "hvd has been shut down (" + who + " called shutdown): an exception on " + who +
                ", or its program ending while this rank still runs collectives; if an "
                "exception, its traceback or error is in that rank's output");
  done_ = true;  // connection errors from here on are the job ending, not a lost peer
  // A rank that asked to shut down too is ending of its own accord (a job's usual end): no note.
  if (requested_by == options_.rank || shutdown_sent_) failing_on_own_ = true;
  FailAll(s, /*notify=*/false);
}

// Before this rank's operations fail (and its program, most likely, exits): a rank whose
// failure follows another's exits at about the same moment, often first, and hvdrun would name
// it as the job's failure. Called by the thread that runs the engine's work, or by a caller
// whose operation is refused (PayOwedFailureNote); one note, written under note_mu_, so that a
// thread that finds it being written waits until it is. The connection has been idle since the
// job started and may have been dropped on the way (a firewall's idle limit): a failed write is
// tried once more on a new one. Bounded: at worst, hvdrun's store unreachable, about two
// seconds.
void EngineImpl::LeaveFailureNote(const Status& status) {
  std::lock_guard<std::mutex> l(note_mu_);
  if (note_state_.load() == kNoteLeft) return;
  WriteFailureNoteLocked(status);
}

void EngineImpl::WriteFailureNoteLocked(const Status& status) {
  note_state_.store(kNoteLeft);
  if (!job_store_ || options_.size == 1) return;
  Status s;
  for (int attempt = 0; attempt < 2; ++attempt) {
    s = job_store_->Set(FailureNoteKey(options_.rank), status.ToString(),
                        Clock::now() + std::chrono::milliseconds(500));
    if (s.ok()) break;
  }
  if (!s.ok()) {
    HVD_LOG(kDebug) << "failure note not left: " << s.message();
  }
  job_store_.reset();  // one note
}

void EngineImpl::OweFailureNoteLocked(const Status& status) {
  if (note_state_.load() != kNoNote) return;
  std::lock_guard<std::mutex> l(note_mu_);  // (taken inside mu_ only here, never the reverse)
  if (note_state_.load() != kNoNote) return;
  owed_note_ = status;
  note_state_.store(kNoteOwed);
}

// Any thread, holding no lock: the owed note, written once. Past kNoNote it takes note_mu_,
// which the writer holds for the whole write: a caller returns once the note is in the store.
void EngineImpl::PayOwedFailureNote() {
  if (note_state_.load() == kNoNote) return;
  std::lock_guard<std::mutex> l(note_mu_);
  if (note_state_.load() == kNoteOwed) WriteFailureNoteLocked(owed_note_);
}

void EngineImpl::FlushControl(Deadline deadline) {
  auto busy = [this] {
    for (auto& c : control_) {
      if (c && c->open() && !c->idle()) return true;
    }
    return false;
  };
  while (busy() && Clock::now() < deadline) {
    if (poller_ && poller_->Poll()) continue;
    if (io_.stopped()) io_.restart();
    io_.run_one_for(std::chrono::milliseconds(poller_ ? 1 : 50));
  }
}

}  // namespace hvd
