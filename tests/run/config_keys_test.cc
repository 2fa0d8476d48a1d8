// The key registry on a small table shaped like the real ones: parsing,
// defaults, types and bounds, messages (one line, naming key, value and rule,
// with a suggestion for typos), and group sharing between commands.
#include "run/config_keys.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace epmoe::run {
namespace {

KeyGroup routing_keys() {
  return {
      "routing",
      {{.name = "top_k", .type = KeyType::integer, .default_value = "2", .help = "experts per token", .min_value = 1},
       {.name = "router",
        .type = KeyType::choice,
        .default_value = "softmax_topk",
        .help = "router kind",
        .choices = {"softmax_topk", "sigmoid_grouped", "random"}},
       {.name = "norm_topk_prob", .type = KeyType::boolean, .default_value = "true", .help = "normalise"},
       {.name = "routed_scaling_factor",
        .type = KeyType::real,
        .default_value = "1.0",
        .help = "scale",
        .min_value = 0,
        .min_exclusive = true},
       {.name = "remat.x_sorted",
        .type = KeyType::choice,
        .default_value = "save",
        .help = "save or remat",
        .choices = {"save", "remat"}}}};
}

KeyGroup run_keys() {
  return {"run",
          {{.name = "run_name", .type = KeyType::text, .default_value = "", .help = "a label"},
           {.name = "threads",
            .type = KeyType::integer,
            .default_value = "2",
            .help = "threads",
            .min_value = 1,
            .max_value = 512}}};
}

const KeyRegistry& registry() {
  static const KeyRegistry keys("layer", {routing_keys(), run_keys()});
  return keys;
}

ConfigValues parse(std::initializer_list<std::string> arguments) {
  return registry().parse(parse_assignments(arguments, "layer"));
}

std::string config_error(std::initializer_list<std::string> arguments) {
  try {
    parse(arguments);
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "no ConfigError";
  return {};
}

TEST(ConfigKeys, DefaultsComeFromTheTable) {
  const ConfigValues values = registry().defaults();
  EXPECT_EQ(values.get_int("top_k"), 2);
  EXPECT_EQ(values.get_string("router"), "softmax_topk");
  EXPECT_TRUE(values.get_bool("norm_topk_prob"));
  EXPECT_DOUBLE_EQ(values.get_float("routed_scaling_factor"), 1.0);
  EXPECT_EQ(values.get_string("remat.x_sorted"), "save");
  EXPECT_EQ(values.get_string("run_name"), "");
  EXPECT_FALSE(values.is_set("top_k"));
  ASSERT_EQ(values.entries().size(), 7u);
  EXPECT_EQ(values.entries().front().name, "top_k");  // declaration order
  EXPECT_EQ(values.entries().back().name, "threads");
}

TEST(ConfigKeys, ParsesEveryTypeAndLaterAssignmentsWin) {
  const ConfigValues values = parse({"top_k=3", "router=sigmoid_grouped", "routed_scaling_factor=2.5e0",
                                     "remat.x_sorted=remat", "run_name=a=b", "top_k=4"});
  EXPECT_EQ(values.get_int("top_k"), 4);
  EXPECT_TRUE(values.is_set("top_k"));
  EXPECT_EQ(values.get_string("router"), "sigmoid_grouped");
  EXPECT_DOUBLE_EQ(values.get_float("routed_scaling_factor"), 2.5);
  EXPECT_EQ(values.get_string("remat.x_sorted"), "remat");
  EXPECT_EQ(values.get_string("run_name"), "a=b");  // split at the first '='
  EXPECT_FALSE(values.is_set("norm_topk_prob"));
}

TEST(ConfigKeys, BoolAcceptsTrueFalseOneZeroOnly) {
  EXPECT_TRUE(parse({"norm_topk_prob=true"}).get_bool("norm_topk_prob"));
  EXPECT_TRUE(parse({"norm_topk_prob=1"}).get_bool("norm_topk_prob"));
  EXPECT_FALSE(parse({"norm_topk_prob=false"}).get_bool("norm_topk_prob"));
  EXPECT_FALSE(parse({"norm_topk_prob=0"}).get_bool("norm_topk_prob"));
  EXPECT_EQ(config_error({"norm_topk_prob=yes"}), "norm_topk_prob=yes: expected true, false, 1 or 0");
}

TEST(ConfigKeys, UnknownKeySuggestsTheClosest) {
  EXPECT_EQ(config_error({"topk=2"}), "unknown key 'topk'; did you mean 'top_k'? (epmoe layer --help lists every key)");
  EXPECT_NE(config_error({"tpo_k=2"}).find("did you mean 'top_k'?"), std::string::npos);
  EXPECT_NE(config_error({"remat.x_sortd=save"}).find("did you mean 'remat.x_sorted'?"), std::string::npos);
  EXPECT_EQ(config_error({"learning_rate=1"}), "unknown key 'learning_rate' (epmoe layer --help lists every key)");
}

TEST(ConfigKeys, WrongTypeNamesKeyValueAndRule) {
  EXPECT_EQ(config_error({"top_k=two"}), "top_k=two: expected an integer");
  EXPECT_EQ(config_error({"top_k=2.5"}), "top_k=2.5: expected an integer");
  EXPECT_EQ(config_error({"top_k="}), "top_k=: expected an integer");
  EXPECT_EQ(config_error({"top_k=99999999999999999999"}),
            "top_k=99999999999999999999: out of the 64-bit integer range");
  EXPECT_EQ(config_error({"routed_scaling_factor=fast"}), "routed_scaling_factor=fast: expected a finite number");
  EXPECT_EQ(config_error({"routed_scaling_factor=inf"}), "routed_scaling_factor=inf: expected a finite number");
  EXPECT_EQ(config_error({"router=topk"}), "router=topk: expected one of softmax_topk, sigmoid_grouped, random");
}

TEST(ConfigKeys, BoundsAreChecked) {
  EXPECT_EQ(config_error({"top_k=0"}), "top_k=0: must be >= 1");
  EXPECT_EQ(config_error({"routed_scaling_factor=0"}), "routed_scaling_factor=0: must be > 0");
  EXPECT_EQ(config_error({"threads=513"}), "threads=513: must be <= 512");
  EXPECT_EQ(parse({"threads=512"}).get_int("threads"), 512);
}

TEST(ConfigKeys, ArgumentWithoutEqualsIsRejected) {
  EXPECT_EQ(config_error({"top_k"}), "'top_k': expected key=value (epmoe layer --help lists every key)");
  EXPECT_NE(config_error({"=3"}).find("expected key=value"), std::string::npos);
}

TEST(ConfigKeys, OriginPrefixesTheMessage) {
  ConfigValues values = registry().defaults();
  try {
    registry().apply(values, {"top_k", "two", "layer.yaml:3"});
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "layer.yaml:3: top_k=two: expected an integer");
  }
  EXPECT_EQ(values.get_int("top_k"), 2) << "a rejected value must not stick";
}

TEST(ConfigKeys, Int32AccessorRejectsValuesThatDoNotFit) {
  const ConfigValues values = parse({"top_k=4294967298"});
  EXPECT_THROW(values.get_int32("top_k"), ConfigError);
  EXPECT_EQ(parse({"top_k=7"}).get_int32("top_k"), 7);
}

TEST(ConfigKeys, ReadingUndeclaredOrMistypedKeysIsABug) {
  const ConfigValues values = registry().defaults();
  EXPECT_THROW(values.get_int("topk"), InternalError);
  EXPECT_THROW(values.get_bool("top_k"), InternalError);
}

TEST(ConfigKeys, BrokenTablesAreCaughtAtConstruction) {
  EXPECT_THROW(KeyRegistry("layer", {routing_keys(), routing_keys()}), InternalError);  // duplicates
  KeyGroup bad_default{"bad", {{.name = "top_k", .type = KeyType::integer, .default_value = "two", .help = ""}}};
  EXPECT_THROW(KeyRegistry("layer", {bad_default}), InternalError);
}

TEST(ConfigKeys, GroupsAreSharedBetweenCommands) {
  const KeyRegistry train("train", {routing_keys(), run_keys()});
  const KeyRegistry bench("bench", {routing_keys()});
  EXPECT_NE(train.find("top_k"), nullptr);
  EXPECT_NE(bench.find("top_k"), nullptr);
  EXPECT_EQ(bench.find("threads"), nullptr);
  try {
    bench.parse({{"threads", "2", ""}});
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("epmoe bench --help"), std::string::npos) << e.what();
  }
}

// epmoe-bench builds its registries with its own program name, so its hints
// name the binary the user typed.
TEST(ConfigKeys, MessagesNameTheProgram) {
  const KeyRegistry layer("layer", {routing_keys()}, "epmoe-bench");
  try {
    layer.parse({{"top_kk", "2", ""}});
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("(epmoe-bench layer --help lists every key)"), std::string::npos) << e.what();
  }
  try {
    parse_assignment("=2", "layer", "epmoe-bench");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("(epmoe-bench layer --help lists every key)"), std::string::npos) << e.what();
  }
}

TEST(ConfigKeys, HelpListsEveryKeyWithTypeDefaultAndHelp) {
  const std::string help = registry().help_text();
  for (const char* fragment : {"routing:", "run:", "top_k", "int >= 1", "softmax_topk|sigmoid_grouped|random",
                               "float > 0", "int >= 1 <= 512", "experts per token", "remat.x_sorted", "bool"}) {
    EXPECT_NE(help.find(fragment), std::string::npos) << "missing " << fragment << " in\n" << help;
  }
  // One line per key: the line naming top_k also holds its default and help.
  const std::size_t line_start = help.find("    top_k");
  const std::string line = help.substr(line_start, help.find('\n', line_start) - line_start);
  EXPECT_NE(line.find(" 2 "), std::string::npos) << line;
  EXPECT_NE(line.find("experts per token"), std::string::npos) << line;
}

TEST(EditDistance, CountsTranspositionsAsOneEdit) {
  EXPECT_EQ(edit_distance("top_k", "top_k"), 0u);
  EXPECT_EQ(edit_distance("topk", "top_k"), 1u);
  EXPECT_EQ(edit_distance("tpo_k", "top_k"), 1u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

}  // namespace
}  // namespace epmoe::run
