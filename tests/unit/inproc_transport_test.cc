// The in-process test transport itself: byte-stream semantics, failures and deadlines.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "inproc_transport.h"

namespace hvd {
namespace test {
namespace {

using Bytes = std::vector<uint8_t>;

Deadline Soon() { return DeadlineAfterSeconds(30); }

TEST(InProcTransport, ReceivesAndSendsNeedNotMatchOneToOne) {
  InProcWorld world(2, /*pipe_capacity=*/7);
  Bytes data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 13 + 5);
  Bytes got(1000);
  auto st = RunRanks(world, [&](Transport& t) -> Status {
    if (t.rank() == 0) {  // 600 bytes, an empty send, then 100 + 1 + 299 bytes
      return t.WaitAll({t.Isend(1, data.data(), 600), t.Isend(1, data.data(), 0),
                        t.Isend(1, data.data() + 600, 100), t.Isend(1, data.data() + 700, 1),
                        t.Isend(1, data.data() + 701, 299)},
                       Soon());
    }
    return t.WaitAll({t.Irecv(0, got.data(), 250), t.Irecv(0, got.data() + 250, 0),
                      t.Irecv(0, got.data() + 250, 750)},
                     Soon());
  });
  EXPECT_TRUE(st[0].ok()) << st[0].ToString();
  EXPECT_TRUE(st[1].ok()) << st[1].ToString();
  EXPECT_EQ(got, data);
}

TEST(InProcTransport, FullPipeBlocksTheSenderUntilTheDeadline) {
  InProcWorld world(2, /*pipe_capacity=*/16);
  Bytes data(17);
  Transport& t = world.transport(0);
  const Status st = t.Send(1, data.data(), data.size(), DeadlineAfterSeconds(0.05));
  EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.ToString();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  EXPECT_TRUE(t.Send(1, data.data(), 0, Soon()).ok());  // zero bytes never wait
}

TEST(InProcTransport, KillFailsPendingAndLaterRequestsOfEveryRank) {
  InProcWorld world(3);
  Bytes buf(8);
  Transport& t0 = world.transport(0);
  const TransportRequest pending = t0.Irecv(1, buf.data(), 8);  // rank 1 is alive but silent
  world.KillRank(2);
  const Status a = t0.Wait(pending, Soon());
  const Status b = world.transport(1).Send(0, buf.data(), 8, Soon());
  const Status c = world.transport(2).Recv(0, buf.data(), 8, Soon());
  EXPECT_EQ(a.code(), StatusCode::kPeerLost) << a.ToString();
  EXPECT_NE(a.message().find("rank 2 lost"), std::string::npos) << a.message();
  EXPECT_EQ(b.code(), StatusCode::kPeerLost) << b.ToString();
  EXPECT_EQ(c.code(), StatusCode::kAborted) << c.ToString();
}

}  // namespace
}  // namespace test
}  // namespace hvd
