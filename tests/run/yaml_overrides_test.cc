// YAML config files: flattening of nested maps to dotted keys, origins with
// line numbers, and a one-line FileError for every malformed file.
#include "run/yaml_overrides.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "data/test_files.h"

namespace epmoe::run {
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
  const KeyRegistry registry(
      "layer", {{"layer", {{.name = "top_k", .type = KeyType::integer, .default_value = "2", .help = ""}}}});
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

TEST(YamlOverrides, DuplicateKeysAreRefusedNamingBothLines) {
  ScratchDir dir;
  // yaml-cpp keeps both pairs; the run would have used one without a word.
  write_bytes(dir / "dup.yaml", "top_k: 2\nrouter: random\ntop_k: 1\n");
  EXPECT_EQ(file_error(dir / "dup.yaml"), (dir / "dup.yaml").string() + ":3: key 'top_k' is set twice (first at " +
                                              (dir / "dup.yaml").string() + ":1); a config file sets each key once");
  write_bytes(dir / "nested.yaml", "remat:\n  x_sorted: save\n  x_sorted: remat\n");
  EXPECT_NE(file_error(dir / "nested.yaml").find(":3: key 'remat.x_sorted' is set twice"), std::string::npos);
  // The same flattened key spelled two ways.
  write_bytes(dir / "dotted.yaml", "remat:\n  x_sorted: save\nremat.x_sorted: remat\n");
  EXPECT_NE(file_error(dir / "dotted.yaml").find(":3: key 'remat.x_sorted' is set twice"), std::string::npos);
}

TEST(YamlOverrides, SeveralDocumentsAreRefused) {
  ScratchDir dir;
  // yaml-cpp's Load reads the first document and drops the rest.
  write_bytes(dir / "two.yaml", "top_k: 2\n---\ntop_k: 1\n");
  EXPECT_EQ(file_error(dir / "two.yaml"), (dir / "two.yaml").string() +
                                              ": holds 2 YAML documents (separated by '---'); a config file is one "
                                              "map of keys");
  write_bytes(dir / "one.yaml", "---\ntop_k: 2\n...\n");  // explicit start and end of one document: fine
  EXPECT_EQ(load_yaml_overrides(dir / "one.yaml").size(), 1u);
}

// Special files are refused before they are opened. Run in a child with a
// deadline: the old reader blocked forever on a FIFO (and read /dev/zero
// without end), which would stall the suite instead of failing the test.
void expect_refused_in_child(const std::filesystem::path& path) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(10);  // SIGALRM ends a blocked child
    try {
      load_yaml_overrides(path);
    } catch (const FileError& e) {
      ::_exit(std::string(e.what()) ==
                      path.string() + ": not a regular file (a FIFO, socket or device); a YAML config is a file"
                  ? 0
                  : 1);
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(3);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << path << ": " << (WIFSIGNALED(status) ? "blocked (killed by the deadline)" : "wrong or no error");
}

TEST(YamlOverrides, FifoAndDeviceAreRefusedWithoutBlocking) {
  ScratchDir dir;
  ASSERT_EQ(::mkfifo((dir / "fifo.yaml").c_str(), 0644), 0);
  expect_refused_in_child(dir / "fifo.yaml");
  std::filesystem::create_symlink("/dev/zero", dir / "zero.yaml");
  expect_refused_in_child(dir / "zero.yaml");
}

}  // namespace
}  // namespace epmoe::run
