#include "run/json_output.h"

#include <string>
#include <variant>

#include "data/atomic_file.h"

namespace epmoe::run {

nlohmann::json config_to_json(const ConfigValues& values) {
  nlohmann::json json = nlohmann::json::object();
  for (const ConfigValues::Entry& entry : values.entries()) {
    std::visit([&](const auto& value) { json[entry.name] = value; }, entry.value);
  }
  return json;
}

nlohmann::json shape_to_json(const Shape& shape) { return nlohmann::json(shape); }

void write_json_file(const std::filesystem::path& path, const nlohmann::json& json) {
  const std::string text = json.dump(2) + "\n";
  write_file_atomically(path, {text});
}

}  // namespace epmoe::run
