#include "core/memory_ledger.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace epmoe {

namespace {

std::string group_of(const std::string& name) { return name.substr(0, name.find('/')); }

}  // namespace

void MemoryLedger::on_allocate(const std::string& name, std::int64_t bytes) {
  EPMOE_CHECK_GE(bytes, 0);
  std::lock_guard<std::mutex> lock(mutex_);
  LedgerEntry& entry = entries_[name];
  entry.live_bytes += bytes;
  entry.peak_bytes = std::max(entry.peak_bytes, entry.live_bytes);
  entry.num_allocations += 1;
  LedgerEntry& group = groups_[group_of(name)];
  group.live_bytes += bytes;
  group.peak_bytes = std::max(group.peak_bytes, group.live_bytes);
  group.num_allocations += 1;
  total_live_bytes_ += bytes;
  total_peak_bytes_ = std::max(total_peak_bytes_, total_live_bytes_);
}

void MemoryLedger::on_release(const std::string& name, std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  EPMOE_CHECK(it != entries_.end());
  EPMOE_CHECK_LE(bytes, it->second.live_bytes);
  it->second.live_bytes -= bytes;
  groups_[group_of(name)].live_bytes -= bytes;
  total_live_bytes_ -= bytes;
}

std::int64_t MemoryLedger::live_bytes(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  return it == entries_.end() ? 0 : it->second.live_bytes;
}

std::int64_t MemoryLedger::peak_bytes(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  return it == entries_.end() ? 0 : it->second.peak_bytes;
}

std::int64_t MemoryLedger::group_live_bytes(const std::string& group) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = groups_.find(group);
  return it == groups_.end() ? 0 : it->second.live_bytes;
}

std::int64_t MemoryLedger::group_peak_bytes(const std::string& group) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = groups_.find(group);
  return it == groups_.end() ? 0 : it->second.peak_bytes;
}

std::int64_t MemoryLedger::total_live_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_live_bytes_;
}

std::int64_t MemoryLedger::total_peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_peak_bytes_;
}

LedgerSnapshot MemoryLedger::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return LedgerSnapshot{entries_, groups_, total_live_bytes_, total_peak_bytes_};
}

void MemoryLedger::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [name, entry] : entries_) entry.peak_bytes = entry.live_bytes;
  for (auto& [name, group] : groups_) group.peak_bytes = group.live_bytes;
  total_peak_bytes_ = total_live_bytes_;
}

LedgerCharge::LedgerCharge(MemoryLedger* ledger, std::string name, std::int64_t bytes)
    : ledger_(ledger), name_(std::move(name)), bytes_(bytes) {
  if (ledger_ != nullptr) ledger_->on_allocate(name_, bytes_);
}

LedgerCharge::LedgerCharge(LedgerCharge&& other) noexcept
    : ledger_(std::exchange(other.ledger_, nullptr)), name_(std::move(other.name_)), bytes_(other.bytes_) {}

LedgerCharge& LedgerCharge::operator=(LedgerCharge&& other) noexcept {
  if (this != &other) {
    // Release this charge in place. Calling ~LedgerCharge() here would also
    // end name_'s lifetime, and the assignment below would then write into a
    // destroyed std::string (a heap use-after-free once the name is too long
    // for the small-string buffer, as AddressSanitizer reports).
    release();
    ledger_ = std::exchange(other.ledger_, nullptr);
    name_ = std::move(other.name_);
    bytes_ = other.bytes_;
  }
  return *this;
}

void LedgerCharge::release() noexcept {
  if (ledger_ == nullptr) return;
  try {
    ledger_->on_release(name_, bytes_);
  } catch (...) {
    // Destructors never throw; the ledger tests catch imbalances.
  }
  ledger_ = nullptr;
}

LedgerCharge::~LedgerCharge() { release(); }

void LedgerCharge::resize(std::int64_t bytes) {
  EPMOE_CHECK_GE(bytes, 0);
  if (ledger_ != nullptr) {
    if (bytes > bytes_) ledger_->on_allocate(name_, bytes - bytes_);
    if (bytes < bytes_) ledger_->on_release(name_, bytes_ - bytes);
  }
  bytes_ = bytes;
}

}  // namespace epmoe
