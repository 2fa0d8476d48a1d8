#include <epmoe/config.h>

#include <string>

#include "core/error.h"

namespace epmoe {

RematPolicy RematPolicy::preset(std::string_view key, std::string_view name) {
  if (name == "minimal" || name == "custom") return {true, true, true, true};
  if (name == "full") return {false, false, false, false};
  if (name == "save_dispatch") return {true, false, false, false};
  throw ConfigError(std::string(key) + "=" + std::string(name) +
                    ": must be one of full, minimal, save_dispatch, custom");
}

bool RematPolicy::parse_choice(std::string_view key, std::string_view value) {
  if (value == "save") return true;
  if (value == "remat") return false;
  throw ConfigError(std::string(key) + "=" + std::string(value) + ": must be save or remat");
}

std::string RematPolicy::describe() const {
  auto word = [](bool save) { return save ? "save" : "remat"; };
  return std::string("x_sorted=") + word(save_x_sorted) + " mlpwi_0=" + word(save_mlpwi_0) +
         " mlpwi_1=" + word(save_mlpwi_1) + " mlpwo=" + word(save_mlpwo);
}

}  // namespace epmoe
