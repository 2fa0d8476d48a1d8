#include "comm/cooperative_progress.h"

#include <vector>

namespace epmoe::comm {
namespace {

// The calling thread's collectives in flight, oldest first. A slot stays
// until a drive_progress or a later launch sees it finished, so the list is
// bounded by the collectives in flight plus those finished since.
std::vector<std::shared_ptr<transport::ProgressSlot>>& in_flight() {
  thread_local std::vector<std::shared_ptr<transport::ProgressSlot>> slots;
  return slots;
}

}  // namespace

int drive_progress() {
  std::vector<std::shared_ptr<transport::ProgressSlot>>& slots = in_flight();
  if (slots.empty()) return 0;
  int loans = 0;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const transport::ProgressSlot::Lent lent = slots[i]->lend(kMaxLoan);
    if (lent == transport::ProgressSlot::Lent::yes) ++loans;
    if (lent == transport::ProgressSlot::Lent::finished) continue;
    if (kept != i) slots[kept] = std::move(slots[i]);
    ++kept;
  }
  slots.resize(kept);
  return loans;
}

namespace detail {

void track_in_flight(std::shared_ptr<transport::ProgressSlot> slot) {
  std::vector<std::shared_ptr<transport::ProgressSlot>>& slots = in_flight();
  // Drop finished ones, so that a thread that never drives keeps a short list.
  std::size_t kept = 0;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i]->finished()) continue;
    if (kept != i) slots[kept] = std::move(slots[i]);
    ++kept;
  }
  slots.resize(kept);
  slots.push_back(std::move(slot));
}

int num_in_flight() {
  int count = 0;
  for (const auto& slot : in_flight()) count += slot->finished() ? 0 : 1;
  return count;
}

}  // namespace detail

}  // namespace epmoe::comm
