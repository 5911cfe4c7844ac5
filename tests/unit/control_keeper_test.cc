// The control keeper (engine/control_keeper.h): it polls only while a call is in progress and
// past its grace, one poll at a time with the caller held at the call's end, and never after the
// call has returned, however the call ends.
#include "engine/control_keeper.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace hvd {
namespace {

// What the keeper's polls saw: how many ran, and how many ran while no call was in progress
// or while the calling thread was past the call (both must stay 0).
struct Observed {
  std::atomic<bool> inside{false};
  std::atomic<int> polls{0};
  std::atomic<int> outside{0};
};

std::function<void()> Poller(Observed* o) {
  return [o] {
    if (!o->inside.load()) o->outside.fetch_add(1);
    o->polls.fetch_add(1);
    // A poll that takes a while: the caller's return must wait for it.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (!o->inside.load()) o->outside.fetch_add(1);
  };
}

// Runs a call of `length` through the keeper, `inside` raised from before it until Call has
// returned: a poll in progress when the call itself ends still sees it raised, since Call waits
// for that poll; one that began later would not.
void CallFor(ControlKeeper& k, Observed& o, std::chrono::milliseconds length) {
  o.inside = true;
  k.Call([&] { std::this_thread::sleep_for(length); });
  o.inside = false;
}

constexpr auto kNoLimit = std::chrono::hours(1);

TEST(ControlKeeper, ShortCallsAreNotPolled) {
  Observed o;
  ControlKeeper k(Poller(&o), kNoLimit);
  auto longest = std::chrono::steady_clock::duration::zero();
  for (int i = 0; i < 100; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const int got = k.Call([i] { return i * 2; });
    longest = std::max(longest, std::chrono::steady_clock::now() - start);
    EXPECT_EQ(got, i * 2);
  }
  // A call shorter than the grace is never polled, however the keeper's wake-ups fall. (A
  // loaded machine may hold a call up past the grace: then a poll is allowed.)
  if (longest < ControlKeeper::kGrace) {
    EXPECT_EQ(o.polls.load(), 0);
    EXPECT_EQ(k.polls(), 0u);
  }
}

TEST(ControlKeeper, LongCallIsPolledUntilItReturns) {
  Observed o;
  ControlKeeper k(Poller(&o), kNoLimit);
  CallFor(k, o, std::chrono::milliseconds(400));
  const int during = o.polls.load();
  // 400 ms less the grace, at one poll a millisecond: hundreds; a loaded machine still gives
  // some. The bound only says that polls happened.
  EXPECT_GE(during, 5);
  EXPECT_EQ(static_cast<uint64_t>(during), k.polls());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(o.polls.load(), during) << "a poll ran after the call returned";
  EXPECT_EQ(o.outside.load(), 0) << "a poll ran outside the call";
}

TEST(ControlKeeper, CallsAfterAPauseAreWatchedAgain) {
  Observed o;
  ControlKeeper k(Poller(&o), kNoLimit);
  CallFor(k, o, std::chrono::milliseconds(150));
  const int first = o.polls.load();
  EXPECT_GE(first, 1);
  // Longer than the keeper's watch: it sleeps untimed, and the next call must wake it.
  std::this_thread::sleep_for(ControlKeeper::kWatch + std::chrono::milliseconds(200));
  EXPECT_EQ(o.polls.load(), first);
  CallFor(k, o, std::chrono::milliseconds(150));
  EXPECT_GT(o.polls.load(), first);
  EXPECT_EQ(o.outside.load(), 0);
}

TEST(ControlKeeper, AnExceptionEndsTheCall) {
  Observed o;
  ControlKeeper k(Poller(&o), kNoLimit);
  o.inside = true;
  EXPECT_THROW(k.Call([&]() -> void* {
                 std::this_thread::sleep_for(std::chrono::milliseconds(200));
                 throw std::runtime_error("out of memory");
               }),
               std::runtime_error);
  o.inside = false;
  const int polls = o.polls.load();
  EXPECT_GE(polls, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(o.polls.load(), polls) << "a poll ran after the call threw";
  EXPECT_EQ(o.outside.load(), 0);
}

// A call that lasts the limit is taken as stuck: the keeper gives up on it once (the engine
// tells every rank that this one is stuck), polling stops, and resumes with the next call.
TEST(ControlKeeper, StopsPollingAStuckCallAtTheLimit) {
  Observed o;
  std::atomic<int64_t> last_us{0};  // the last poll's start, from the call's start
  std::chrono::steady_clock::time_point start;
  auto poll = [&] {
    last_us = std::chrono::duration_cast<std::chrono::microseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    o.polls.fetch_add(1);
  };
  std::atomic<int> gave_up{0};
  std::atomic<int64_t> ran_us{0};  // what the keeper said the stuck call had run
  auto give_up = [&](hvd::Clock::duration ran) {
    ran_us = std::chrono::duration_cast<std::chrono::microseconds>(ran).count();
    gave_up.fetch_add(1);
  };
  ControlKeeper k(poll, std::chrono::milliseconds(150), give_up);
  start = std::chrono::steady_clock::now();
  k.Call([] { std::this_thread::sleep_for(std::chrono::milliseconds(900)); });
  const int first = o.polls.load();
  EXPECT_GE(first, 1);
  // The keeper decides each poll before the limit; a loaded machine may start one late, but
  // not by the 600 ms left of the call.
  EXPECT_LT(last_us.load(), 600 * 1000) << "polls went on past the limit";
  EXPECT_EQ(gave_up.load(), 1) << "the stuck call was not given up on exactly once";
  EXPECT_GE(ran_us.load(), 150 * 1000);
  EXPECT_LT(ran_us.load(), 900 * 1000);
  start = std::chrono::steady_clock::now();
  k.Call([] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); });
  EXPECT_GT(o.polls.load(), first) << "the next call was not polled";
  EXPECT_EQ(gave_up.load(), 1) << "a call within the limit was given up on";
}

TEST(ControlKeeper, DestroyedWithAndWithoutItsThread) {
  Observed o;
  { ControlKeeper never(Poller(&o), kNoLimit); }  // no call: no thread to join
  {
    ControlKeeper k(Poller(&o), kNoLimit);
    CallFor(k, o, std::chrono::milliseconds(1));  // its thread starts, and stays awake (watch)
  }
  EXPECT_EQ(o.outside.load(), 0);
}

}  // namespace
}  // namespace hvd
