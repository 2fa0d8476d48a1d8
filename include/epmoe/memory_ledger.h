// MemoryLedger: live and peak bytes by name (e.g. "saved/x_sorted",
// "buffer/dispatch"), by group (the name up to its first '/': "saved",
// "buffer"), plus the total. Every buffer whose size matters for the memory
// story (saved activations, communication buffers, replica slots) is
// allocated through one, so peaks are measured rather than guessed
// (DESIGN.md §4.7). A group's peak is the peak of its sum, not the sum of
// its names' peaks: "saved" is what the backward holds at once, which is
// what the plan's memory model projects. Thread-safe: one ledger per rank is
// the usual set-up, but helper threads of that rank may allocate too.
//
// Public and std-only: a caller may hand one to an MoE layer
// (<epmoe/moe_layer.h>) to see what it saves for the backward and the
// buffers it keeps.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace epmoe {

struct LedgerEntry {
  std::int64_t live_bytes = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t num_allocations = 0;
};

struct LedgerSnapshot {
  std::map<std::string, LedgerEntry> by_name;
  std::map<std::string, LedgerEntry> by_group;  // num_allocations summed
  std::int64_t total_live_bytes = 0;
  std::int64_t total_peak_bytes = 0;
};

class MemoryLedger {
 public:
  void on_allocate(const std::string& name, std::int64_t bytes);
  // Throws InternalError when more is released under `name` than is live.
  void on_release(const std::string& name, std::int64_t bytes);

  std::int64_t live_bytes(const std::string& name) const;
  std::int64_t peak_bytes(const std::string& name) const;
  std::int64_t group_live_bytes(const std::string& group) const;
  std::int64_t group_peak_bytes(const std::string& group) const;
  std::int64_t total_live_bytes() const;
  std::int64_t total_peak_bytes() const;
  LedgerSnapshot snapshot() const;

  // Peaks restart from the current live values (e.g. at the start of a step).
  void reset_peaks();

 private:
  mutable std::mutex mutex_;  // guards everything below
  std::map<std::string, LedgerEntry> entries_;
  std::map<std::string, LedgerEntry> groups_;
  std::int64_t total_live_bytes_ = 0;
  std::int64_t total_peak_bytes_ = 0;
};

// Bytes held outside a Tensor (e.g. a std::vector of routing metadata),
// recorded in a ledger for the charge's lifetime. Move-only.
class LedgerCharge {
 public:
  LedgerCharge() = default;
  LedgerCharge(MemoryLedger* ledger, std::string name, std::int64_t bytes);
  LedgerCharge(LedgerCharge&& other) noexcept;
  LedgerCharge& operator=(LedgerCharge&& other) noexcept;
  ~LedgerCharge();

  // Grows or shrinks the charge to `bytes` by the difference only, so a
  // buffer that grows never counts its old and new size at once. A charge
  // without a ledger ignores it.
  void resize(std::int64_t bytes);
  std::int64_t bytes() const { return bytes_; }

 private:
  void release() noexcept;  // gives the bytes back to the ledger, once

  MemoryLedger* ledger_ = nullptr;  // not owned
  std::string name_;
  std::int64_t bytes_ = 0;
};

}  // namespace epmoe
