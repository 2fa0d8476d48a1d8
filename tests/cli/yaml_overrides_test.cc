// YAML config files: flattening of nested maps to dotted keys, origins with
// line numbers, and a one-line FileError for every malformed file.
#include "cli/yaml_overrides.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "data/test_files.h"

namespace epmoe::cli {
namespace {

using epmoe::testing::ScratchDir;
using epmoe::testing::write_bytes;

std::string file_error(const std::filesystem::path& path) {
  try {
    load_yaml_overrides(path);
  } catch (const FileError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "no FileError for " << path;
  return {};
}

TEST(YamlOverrides, FlattensNestedMapsToDottedKeys) {
  ScratchDir dir;
  write_bytes(dir / "layer.yaml",
              "# example\n"
              "top_k: 2\n"
              "router: sigmoid_grouped\n"
              "remat:\n"
              "  x_sorted: remat\n"
              "  mlpwi_0: save\n"
              "name: 'quoted value'\n");
  const auto assignments = load_yaml_overrides(dir / "layer.yaml");
  ASSERT_EQ(assignments.size(), 5u);
  EXPECT_EQ(assignments[0].key, "top_k");
  EXPECT_EQ(assignments[0].value, "2");
  EXPECT_EQ(assignments[0].origin, (dir / "layer.yaml").string() + ":2");
  EXPECT_EQ(assignments[2].key, "remat.x_sorted");
  EXPECT_EQ(assignments[2].value, "remat");
  EXPECT_EQ(assignments[2].origin, (dir / "layer.yaml").string() + ":5");
  EXPECT_EQ(assignments[3].key, "remat.mlpwi_0");
  EXPECT_EQ(assignments[4].value, "quoted value");
}

TEST(YamlOverrides, ValuesGoThroughTheKeyRegistry) {
  ScratchDir dir;
  write_bytes(dir / "layer.yaml", "top_k: two\n");
  const KeyRegistry registry("layer", {{"layer", {{.name = "top_k", .type = KeyType::integer,
                                                   .default_value = "2", .help = ""}}}});
  try {
    registry.parse(load_yaml_overrides(dir / "layer.yaml"));
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), (dir / "layer.yaml").string() + ":1: top_k=two: expected an integer");
  }
}

TEST(YamlOverrides, EmptyFileGivesNoAssignments) {
  ScratchDir dir;
  write_bytes(dir / "empty.yaml", "# nothing set\n");
  EXPECT_TRUE(load_yaml_overrides(dir / "empty.yaml").empty());
}

TEST(YamlOverrides, MissingFile) {
  ScratchDir dir;
  EXPECT_EQ(file_error(dir / "none.yaml"), (dir / "none.yaml").string() + ": no such file");
}

TEST(YamlOverrides, MalformedYamlNamesFileAndLine) {
  ScratchDir dir;
  write_bytes(dir / "bad.yaml", "top_k: 2\nrouter: [softmax_topk\n");
  const std::string message = file_error(dir / "bad.yaml");
  EXPECT_EQ(message.rfind((dir / "bad.yaml").string() + ":", 0), 0u) << message;
  EXPECT_NE(message.find("malformed YAML"), std::string::npos) << message;
}

TEST(YamlOverrides, TopLevelMustBeAMap) {
  ScratchDir dir;
  write_bytes(dir / "list.yaml", "- top_k\n- 2\n");
  EXPECT_NE(file_error(dir / "list.yaml").find("expected a map"), std::string::npos);
}

TEST(YamlOverrides, ListAndMissingValuesAreRejected) {
  ScratchDir dir;
  write_bytes(dir / "list_value.yaml", "top_k: 2\nexperts: [1, 2]\n");
  EXPECT_EQ(file_error(dir / "list_value.yaml"),
            (dir / "list_value.yaml").string() + ":2: key 'experts' holds a list; config values are scalars");
  write_bytes(dir / "null_value.yaml", "remat:\n  x_sorted:\n");
  EXPECT_EQ(file_error(dir / "null_value.yaml"),
            (dir / "null_value.yaml").string() + ":2: key 'remat.x_sorted' has no value");
}

}  // namespace
}  // namespace epmoe::cli
