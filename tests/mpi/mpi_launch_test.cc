// hvdrun --mpi's translation of its flags into an mpirun command line (launcher/mpi_launch.h).
#include "mpi_launch.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace hvd {
namespace launcher {
namespace {

using Words = std::vector<std::string>;

// True if `needle` appears in `hay` as consecutive words.
bool Has(const Words& hay, const Words& needle) {
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

LaunchOptions TwoHosts() {
  LaunchOptions o;
  o.np = 6;
  o.hosts = {HostSlots{"a", 4}, HostSlots{"b", 2}};
  o.command = {"python3", "train.py", "--lr", "0.1"};
  o.knobs = {{"HVD_FUSION_THRESHOLD", "1048576"}, {"HVD_TIMEOUT_SECONDS", "20"}};
  return o;
}

TEST(MpirunCommand, JobAndKnobs) {
  Words c = MpirunCommand(TwoHosts(), {}, false);
  EXPECT_EQ(c[0], "mpirun");
  EXPECT_TRUE(Has(c, {"-np", "6"}));
  EXPECT_TRUE(Has(c, {"-H", "a:4,b:2"}));
  EXPECT_TRUE(Has(c, {"-x", "HVD_FUSION_THRESHOLD=1048576"}));
  EXPECT_TRUE(Has(c, {"-x", "HVD_TIMEOUT_SECONDS=20"}));
  EXPECT_TRUE(Has(c, {"--tag-output"}));
  EXPECT_FALSE(Has(c, {"--allow-run-as-root"}));
  // The command comes last, unchanged.
  EXPECT_TRUE(std::equal(c.end() - 4, c.end(), Words({"python3", "train.py", "--lr", "0.1"}).begin()));
}

TEST(MpirunCommand, SshNetworkRootAndPrefix) {
  LaunchOptions o = TwoHosts();
  o.ssh_port = 2222;
  o.ssh_identity_file = "/k/id";
  o.network_interface = "eth1";
  o.prefix_output = false;
  Words c = MpirunCommand(o, {}, true);
  EXPECT_TRUE(Has(c, {"--allow-run-as-root"}));
  EXPECT_TRUE(Has(c, {"--mca", "plm_rsh_args", "-p 2222 -i /k/id"}));
  EXPECT_TRUE(Has(c, {"--mca", "btl_tcp_if_include", "eth1"}));
  EXPECT_TRUE(Has(c, {"--mca", "oob_tcp_if_include", "eth1"}));
  EXPECT_FALSE(Has(c, {"--tag-output"}));
}

TEST(MpirunCommand, ForwardsKnobsButNotTheContract) {
  Words env = {"PATH", "HVD_CPU_OPERATIONS", "HOROVOD_CYCLE_TIME", "HVD_RANK", "HVD_SIZE",
               "HVD_RENDEZVOUS_ADDR", "HVD_SECRET", "HVD_TIMEOUT_SECONDS", "HOROVOD_RANK",
               "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "_", "X"};
  Words c = MpirunCommand(TwoHosts(), env, false);
  EXPECT_TRUE(Has(c, {"-x", "HVD_CPU_OPERATIONS"}));
  EXPECT_TRUE(Has(c, {"-x", "HOROVOD_CYCLE_TIME"}));
  EXPECT_TRUE(Has(c, {"-x", "HVD_SECRET"}));  // by name: the value never reaches a command line
  EXPECT_TRUE(Has(c, {"-x", "PATH"}));        // as horovodrun: the whole environment
  EXPECT_TRUE(Has(c, {"-x", "X"}));
  EXPECT_FALSE(Has(c, {"-x", "HVD_RANK"}));
  EXPECT_FALSE(Has(c, {"-x", "HVD_SIZE"}));
  EXPECT_FALSE(Has(c, {"-x", "HVD_RENDEZVOUS_ADDR"}));
  // hvdrun's ranks get their identity under horovodrun's names too: also mpirun's to give.
  EXPECT_FALSE(Has(c, {"-x", "HOROVOD_RANK"}));
  EXPECT_FALSE(Has(c, {"-x", "HOROVOD_LOCAL_SIZE"}));
  EXPECT_FALSE(Has(c, {"-x", "HOROVOD_CROSS_RANK"}));
  EXPECT_FALSE(Has(c, {"-x", "_"}));
  EXPECT_FALSE(Has(c, {"-x", "HVD_TIMEOUT_SECONDS"}));  // the flag's value wins
}

TEST(MpirunCommand, LeavesOutWhatIsTheHostsOrMpirunsOwn) {
  Words env = {"OLDPWD", "HOSTNAME", "BASH_FUNC_f%%", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
               "PMI_RANK", "SSH_CONNECTION", "CUDA_VISIBLE_DEVICES", "PYTHONPATH"};
  Words c = MpirunCommand(TwoHosts(), env, false);
  for (const std::string& name : env) {
    EXPECT_EQ(Has(c, {"-x", name}), name == "PYTHONPATH") << name;
  }
}

TEST(MpirunCommand, NoBindingUnlessTheUserBinds) {
  Words c = MpirunCommand(TwoHosts(), {}, false);
  EXPECT_TRUE(Has(c, {"-bind-to", "none", "-map-by", "slot"}));
  LaunchOptions o = TwoHosts();
  o.mpi_args = {"-bind-to", "core", "-map-by", "socket"};  // --binding-args "-bind-to core ..."
  c = MpirunCommand(o, {}, false);
  EXPECT_FALSE(Has(c, {"-bind-to", "none"}));
  EXPECT_TRUE(Has(c, {"-bind-to", "core", "-map-by", "socket"}));
}

TEST(MpirunCommand, DefaultHostIsLocal) {
  LaunchOptions o;
  o.np = 3;
  o.command = {"./a"};
  Words c = MpirunCommand(o, {}, false);
  EXPECT_TRUE(Has(c, {"-H", "localhost:3"}));
}

}  // namespace
}  // namespace launcher
}  // namespace hvd
