// Whole-file writes that are atomic with respect to readers and crashes: the
// bytes go to a temporary file beside the target, are flushed to disk, and the
// temporary is renamed over the target (rename(2) is atomic within a file
// system). A reader therefore sees the old file or the complete new one, never
// a prefix. Used for .npy outputs, metrics and (later) checkpoints.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

namespace epmoe {

// Writes the concatenation of `pieces` to `path`. Throws FileError naming
// `path` and the system's reason; on any error the temporary file is removed
// and `path` is left as it was.
void write_file_atomically(const std::filesystem::path& path, const std::vector<std::string_view>& pieces);

}  // namespace epmoe
