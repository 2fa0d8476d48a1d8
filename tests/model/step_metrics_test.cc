// model/step_metrics.h: every rank's step report arrives on every rank as it
// was sent (with and without a modelled time), and rank 0's record sums the
// bytes over ranks, keeps the largest peak, and takes the modelled step's
// time and rate where there is one. (The replica plans' part of the record,
// add_replica_plans, is checked by the trainer's TrainBalance tests.)
#include "model/step_metrics.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "transport/threads/launcher.h"

namespace epmoe {
namespace {

ModelledRankTime modelled_time(double forward_seconds, double backward_seconds) {
  ModelledRankTime time;
  time.forward_seconds = forward_seconds;
  time.backward_seconds = backward_seconds;
  return time;
}

RankStepReport report_of(int rank) {
  RankStepReport report;
  report.bytes_sent = {{"moe/forward/all_to_all_v tokens", 100 * (rank + 1)}, {"gradients/all_reduce", 7}};
  if (rank == 1) report.bytes_sent["moe/forward/replica weights"] = 64;
  report.saved_activation_peak_bytes = 1000 + 10 * ((rank * 7) % 3);
  report.dropped_pairs = rank;
  if (rank == 2) report.modelled = modelled_time(0.5, 1.5);
  return report;
}

bool same(const RankStepReport& a, const RankStepReport& b) {
  return a.bytes_sent == b.bytes_sent && a.saved_activation_peak_bytes == b.saved_activation_peak_bytes &&
         a.dropped_pairs == b.dropped_pairs && a.modelled.has_value() == b.modelled.has_value() &&
         (!a.modelled || a.modelled->step_seconds() == b.modelled->step_seconds());
}

TEST(StepMetrics, EveryRankGetsEveryReportAsSent) {
  constexpr int kRanks = 3;
  std::mutex mutex;
  int checked = 0;
  transport::threads::run_ranks(kRanks, {}, [&](transport::Communicator& comm) {
    StepReportExchange first(comm, 1, report_of(comm.rank()), 0, std::chrono::milliseconds(10000));
    StepReportExchange second(comm, 2, report_of(kRanks - 1 - comm.rank()), 8, std::chrono::milliseconds(10000));
    const std::vector<RankStepReport>& a = first.reports();
    const std::vector<RankStepReport>& b = second.reports();
    ASSERT_EQ(a.size(), std::size_t{kRanks});
    ASSERT_EQ(b.size(), std::size_t{kRanks});
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_TRUE(same(a[r], report_of(r))) << "rank " << r;
      EXPECT_TRUE(same(b[r], report_of(kRanks - 1 - r))) << "rank " << r;
    }
    EXPECT_EQ(&first.reports(), &a);  // decoded once
    std::lock_guard lock(mutex);
    ++checked;
  });
  EXPECT_EQ(checked, kRanks);
}

TEST(StepMetrics, RankZerosRecordSumsBytesAndKeepsThePeak) {
  const std::vector<RankStepReport> reports = {report_of(0), report_of(1)};
  StepRecord record;
  record.step_seconds = 3.0;
  add_rank_reports(record, reports, 4096);
  EXPECT_EQ(record.bytes_sent.at("moe/forward/all_to_all_v tokens"), 300);
  EXPECT_EQ(record.bytes_sent.at("gradients/all_reduce"), 14);
  EXPECT_EQ(record.bytes_sent.at("moe/forward/replica weights"), 64);
  EXPECT_EQ(record.saved_activation_peak_bytes, 1010);
  EXPECT_EQ(record.dropped_pairs, 0);  // every rank sums those itself
  EXPECT_TRUE(record.modelled.is_null());
  EXPECT_EQ(record.step_seconds, 3.0);  // the wall clock's, without a modelled time
}

TEST(StepMetrics, AModelledStepReplacesTheWallClocksTimeAndRate) {
  RankStepReport fast = report_of(0), slow = report_of(1);
  fast.modelled = modelled_time(0.25, 0.5);
  slow.modelled = modelled_time(0.5, 1.5);
  const std::vector<RankStepReport> reports = {fast, slow};
  StepRecord record;
  record.step_seconds = 99.0;
  add_rank_reports(record, reports, 4096);
  EXPECT_EQ(record.step_seconds, 2.0);  // the slowest rank's
  EXPECT_EQ(record.tokens_per_second, 2048.0);
  EXPECT_EQ(record.modelled["tokens_per_second"].get<double>(), 2048.0);
}

}  // namespace
}  // namespace epmoe
