// The two pieces every file-reading or file-writing routine builds its
// FileError from: the file's name first, then the rule it broke, and the
// system's reason when a call on it failed.
#pragma once

#include <filesystem>
#include <string>

namespace epmoe {

// strerror(errno): why the last failed system call failed ("No such file or
// directory"). Read it before any other call can change errno.
std::string errno_text();

// Throws FileError("<path>: <rule>").
[[noreturn]] void throw_file_error(const std::filesystem::path& path, const std::string& rule);

}  // namespace epmoe
