// The fault-injection test hook: parsing, matching by (rank, point, NTH).
#include "core/fault_injection.h"

#include <gtest/gtest.h>

namespace epmoe {
namespace {

struct ClearFaults {
  ~ClearFaults() { configure_fault_injection(""); }
};

TEST(FaultInjection, ThrowsOnlyForTheConfiguredRankPointAndNth) {
  ClearFaults clear;
  configure_fault_injection("1:dispatch:throw:2");
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

TEST(FaultInjection, EmptySpecDisablesIt) {
  ClearFaults clear;
  configure_fault_injection("0:collective");
  EXPECT_THROW(fault_point("collective", 0), InjectedFault);
  configure_fault_injection("");
  EXPECT_NO_THROW(fault_point("collective", 0));
  EXPECT_EQ(fault_injection_spec(), "");
}

TEST(FaultInjection, MalformedSpecsAreRefusedNamingTheKey) {
  ClearFaults clear;
  for (const char* spec : {"1", "x:dispatch", "1:", "1:dispatch:explode", "1:dispatch:throw:0", "1:a:throw:2:3"}) {
    try {
      configure_fault_injection(spec);
      ADD_FAILURE() << spec << " must be refused";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("fault_injection"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace epmoe
