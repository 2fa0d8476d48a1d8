// JSON pieces shared by the commands' metrics files.
#pragma once

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "run/config_keys.h"

namespace epmoe::run {

// Every key of the command with its value, typed (numbers, bools, strings).
nlohmann::json config_to_json(const ConfigValues& values);

nlohmann::json shape_to_json(const Shape& shape);

// Pretty-printed, written atomically (data/atomic_file.h).
void write_json_file(const std::filesystem::path& path, const nlohmann::json& json);

}  // namespace epmoe::run
