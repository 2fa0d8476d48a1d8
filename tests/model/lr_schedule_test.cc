// Warm-up + cosine schedule at its landmarks. Topology: peak 1e-3, 10 warm-up
// steps, 111 steps in all (so the cosine spans exactly 100 steps, 10..110,
// and its midpoint is step 60), floor 0.1 * peak.
#include "model/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"

namespace epmoe {
namespace {

const LrSchedule kSchedule{.peak = 1e-3, .warmup_steps = 10, .total_steps = 111, .min_ratio = 0.1};

TEST(LrSchedule, WarmupIsLinearFromTheFirstStep) {
  EXPECT_DOUBLE_EQ(kSchedule.at(0), 1e-4);  // (0 + 1) / 10 of peak: step 0 already moves
  EXPECT_DOUBLE_EQ(kSchedule.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(kSchedule.at(9), 1e-3);   // last warm-up step reaches peak
  EXPECT_DOUBLE_EQ(kSchedule.at(10), 1e-3);  // the cosine starts at peak
}

TEST(LrSchedule, CosineMidpointLastStepAndBeyond) {
  EXPECT_DOUBLE_EQ(kSchedule.at(60), 1e-4 + 0.5 * (1e-3 - 1e-4));
  EXPECT_DOUBLE_EQ(kSchedule.at(110), 1e-4);   // total_steps - 1: the floor
  EXPECT_DOUBLE_EQ(kSchedule.at(1000), 1e-4);  // held past the end
  // A quarter of the way: min + (peak - min) (1 + cos(pi / 4)) / 2.
  EXPECT_NEAR(kSchedule.at(35), 1e-4 + 9e-4 * (1 + std::sqrt(0.5)) / 2, 1e-15);
}

TEST(LrSchedule, NeverNegativeOrNanAndDecreasingAfterWarmup) {
  const LrSchedule zero_floor{.peak = 3e-4, .warmup_steps = 3, .total_steps = 20, .min_ratio = 0.0};
  for (const LrSchedule& s : {kSchedule, zero_floor}) {
    double previous = s.at(s.warmup_steps);
    for (std::int64_t step = 0; step < s.total_steps + 5; ++step) {
      const double lr = s.at(step);
      ASSERT_TRUE(std::isfinite(lr) && lr >= 0.0) << step;
      ASSERT_LE(lr, s.peak) << step;
      if (step > s.warmup_steps) {
        ASSERT_LE(lr, previous) << step;
        previous = lr;
      }
    }
  }
  EXPECT_EQ(zero_floor.at(19), 0.0);
}

TEST(LrSchedule, EdgeCasesWithoutDecayStayAtPeak) {
  const LrSchedule no_warmup_one_step{.peak = 2e-3, .warmup_steps = 0, .total_steps = 1};
  EXPECT_DOUBLE_EQ(no_warmup_one_step.at(0), 2e-3);
  EXPECT_DOUBLE_EQ(no_warmup_one_step.at(3), 2e-3);
  const LrSchedule warmup_covers_all{.peak = 2e-3, .warmup_steps = 8, .total_steps = 5};
  EXPECT_DOUBLE_EQ(warmup_covers_all.at(0), 2e-3 / 8);
  EXPECT_DOUBLE_EQ(warmup_covers_all.at(4), 2e-3 * 5 / 8);
  EXPECT_DOUBLE_EQ(warmup_covers_all.at(8), 2e-3);
  const LrSchedule no_warmup{.peak = 2e-3, .warmup_steps = 0, .total_steps = 3, .min_ratio = 0.5};
  EXPECT_DOUBLE_EQ(no_warmup.at(0), 2e-3);
  EXPECT_DOUBLE_EQ(no_warmup.at(1), 1.5e-3);
  EXPECT_DOUBLE_EQ(no_warmup.at(2), 1e-3);
}

TEST(LrSchedule, ValidateNamesTheKey) {
  EXPECT_NO_THROW(kSchedule.validate());
  EXPECT_NO_THROW(LrSchedule{}.validate());
  struct Bad {
    LrSchedule schedule;
    const char* key;
  };
  for (const Bad& bad : {Bad{{.peak = 0.0}, "learning_rate"}, Bad{{.peak = std::nan("")}, "learning_rate"},
                         Bad{{.warmup_steps = -1}, "warmup_steps"}, Bad{{.total_steps = 0}, "steps"},
                         Bad{{.min_ratio = 1.5}, "min_lr_ratio"}, Bad{{.min_ratio = -0.1}, "min_lr_ratio"}}) {
    try {
      bad.schedule.validate();
      ADD_FAILURE() << "no error for " << bad.key;
    } catch (const ConfigError& e) {
      // "steps=" must not be satisfied by "warmup_steps=": the key starts the message.
      EXPECT_EQ(std::string(e.what()).rfind(std::string(bad.key) + "=", 0), 0u) << e.what();
    }
  }
}

}  // namespace
}  // namespace epmoe
