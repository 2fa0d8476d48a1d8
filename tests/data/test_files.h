// Test helpers for files, shared by the data and cli tests: a fresh scratch
// directory per test, raw byte I/O, and .npy bytes crafted the way numpy's
// format module writes them (numpy is not a test dependency).
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <system_error>

namespace epmoe::testing {

// The names in a directory (not recursive).
inline std::set<std::string> directory_entries(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// A fresh, empty directory under the system temp dir, removed with everything
// in it when the test ends.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("epmoe-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Magic, version, little-endian header length (2 bytes in 1.0, 4 in 2.0/3.0),
// the dict padded with spaces so the data starts 64-byte aligned, '\n', data.
inline std::string numpy_file_bytes(int major_version, const std::string& dict, const std::string& data) {
  const std::size_t length_bytes = major_version == 1 ? 2 : 4;
  const std::size_t prefix_bytes = 8 + length_bytes;
  std::string header = dict;
  const std::size_t unpadded = prefix_bytes + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += static_cast<char>(major_version);
  bytes += '\0';
  for (std::size_t i = 0; i < length_bytes; ++i) {
    bytes += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  }
  return bytes + header + data;
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace epmoe::testing
