// The fault-injection test hook: parsing, matching by (rank, point, NTH), and
// its scope: a point fails only on a thread working for the run that owns
// the injector (a FaultScope), never on another thread of the process.
#include "core/fault_injection.h"

#include <gtest/gtest.h>

#include <thread>

namespace epmoe {
namespace {

TEST(FaultInjection, ThrowsOnlyForTheConfiguredRankPointAndNth) {
  FaultInjector faults("1:dispatch:throw:2");
  const FaultScope scope(&faults);
  EXPECT_NO_THROW(fault_point("dispatch", 0));
  EXPECT_NO_THROW(fault_point("collective", 1));
  EXPECT_NO_THROW(fault_point("dispatch", 1));  // first time: not yet
  try {
    fault_point("dispatch", 1);
    ADD_FAILURE() << "the second dispatch of rank 1 must fail";
  } catch (const InjectedFault& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: injected fault at dispatch"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(fault_point("dispatch", 1));  // only the NTH time
}

// Before, the spec was process-wide: another layer's ranks failed with it.
TEST(FaultInjection, APointFailsOnlyInsideItsRunsScope) {
  FaultInjector faults("0:collective");
  EXPECT_NO_THROW(fault_point("collective", 0)) << "no scope on this thread";
  std::thread other([] { EXPECT_NO_THROW(fault_point("collective", 0)) << "another thread, no scope"; });
  other.join();
  {
    const FaultScope scope(nullptr);  // a run without the key
    EXPECT_NO_THROW(fault_point("collective", 0));
  }
  {
    const FaultScope scope(&faults);
    EXPECT_THROW(fault_point("collective", 0), InjectedFault);
  }
  EXPECT_EQ(this_thread_fault_scope(), nullptr) << "a scope restores the previous one";
}

TEST(FaultInjection, AStopRunsTheScopesStopAndMarksTheInjector) {
  FaultInjector faults("1:dispatch:stop");
  std::string stopped;
  const FaultScope scope(&faults, [&](const std::string& what) { stopped = what; });
  fault_point("dispatch", 1);
  EXPECT_EQ(stopped, "rank 1: injected fault at dispatch (fault_injection=1:dispatch:stop)");
  EXPECT_TRUE(faults.stopped());
  // The run's error then names the stopped rank, whoever's wait timed out.
  try {
    faults.rethrow_naming_stopped_rank(std::make_exception_ptr(PeerError("rank 0: timed out waiting for peer 2")));
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0: timed out waiting for peer 2; rank 1 had stopped at dispatch"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(faults.stopped()) << "a later run's error gets no note";
}

TEST(FaultInjection, MalformedSpecsAreRefusedNamingTheKey) {
  for (const char* spec : {"1", "x:dispatch", "1:", "1:dispatch:explode", "1:dispatch:throw:0", "1:a:throw:2:3"}) {
    try {
      FaultInjector faults(spec);
      ADD_FAILURE() << spec << " must be refused";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("fault_injection"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace epmoe
