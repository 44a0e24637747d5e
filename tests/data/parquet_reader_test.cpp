// read_parquet_rows on files pyarrow writes (tests/data/make_parquet.py, run with RLHF_PYTHON
// once per test process into a fresh temporary directory). Values are compared exactly, kinds
// included (an integer label stays an integer, "42" stays a string): the conversion does no
// arithmetic, so there is no tolerance. A helper that cannot run fails the tests.
#include "data/parquet_reader.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"
#include "test_paths.h"

namespace rlhf::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `f`; expects an InputError whose message contains every entry of `needles`.
void expect_input_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const auto& needle : needles) {
      EXPECT_NE(msg.find(needle), std::string::npos) << "'" << needle << "' not in: " << msg;
    }
  }
}

class ParquetReaderTest : public ::testing::Test {
 protected:
  // The files of make_parquet.py in a temporary directory, made once per test process.
  static void SetUpTestSuite() {
    std::string tmpl = (fs::temp_directory_path() / "rlhf_parquet_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) {
      error_ = "mkdtemp failed for " + tmpl;
      return;
    }
    dir_ = tmpl;
    const std::string script = std::string(RLHF_SOURCE_DIR) + "/tests/data/make_parquet.py";
    const fs::path log = dir_ / "make_parquet.log";
    const std::string cmd = "timeout 120 " + quote(RLHF_PYTHON) + " " + quote(script) + " " +
                            quote(dir_.string()) + " >" + quote(log.string()) + " 2>&1";
    const int status = std::system(cmd.c_str());
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      error_ = "make_parquet.py failed (" + cmd + ", status " + std::to_string(status) +
               "); run scripts/setup to install pyarrow. Output:\n" + slurp(log);
    }
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  void SetUp() override { ASSERT_TRUE(error_.empty()) << error_; }

  static std::string file(const std::string& name) { return (dir_ / name).string(); }

  static inline fs::path dir_;
  static inline std::string error_;
};

TEST_F(ParquetReaderTest, BuiltWithArrow) {
  EXPECT_TRUE(parquet_reader_available())
      << "rlhf_data was built without pyarrow (see the RLHF_WITH_PARQUET message of cmake)";
}

// The golden table: make_parquet.py's prompts_table(), row by row.
TEST_F(ParquetReaderTest, ConvertsEveryColumnKindExactly) {
  std::vector<json> expected = {
      json::parse(R"({
        "prompt": "What is 6*7?", "label": "42", "label_id": 1, "small": -128,
        "big_unsigned": 18446744073709551615, "score": 0.25, "accepted": true,
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "6*7?"}],
        "reward_model": {"ground_truth": "42", "style": "rule"},
        "token_ids": [1, 2, 3], "data_source": "gsm8k", "tags": {"a": 1, "b": 2},
        "long_text": "long", "nothing": null})"),
      json::parse(R"({
        "prompt": "Say hi", "label": "hi", "label_id": -2, "small": 127, "big_unsigned": 0,
        "score": -1e300, "weight": 1.5, "accepted": false,
        "messages": [{"role": "user", "content": "hi"}],
        "reward_model": {"ground_truth": "hi", "style": null},
        "token_ids": [], "data_source": "gsm8k", "tags": {}, "long_text": null,
        "nothing": null})"),
      json::parse(R"({
        "prompt": null, "label": "x", "label_id": null, "small": 0, "big_unsigned": 1,
        "score": null, "weight": 2.0, "accepted": null, "messages": null,
        "reward_model": null, "token_ids": null, "data_source": "math", "tags": null,
        "long_text": "x", "nothing": null})"),
      json::parse(R"({
        "prompt": "日本語で \"quoted\"\n", "label": null, "label_id": 1099511627776,
        "small": null, "big_unsigned": 2, "score": 3.0, "weight": null, "accepted": true,
        "messages": [], "reward_model": {"ground_truth": "", "style": "model"},
        "token_ids": [7, null], "data_source": "gsm8k", "tags": {"z": null},
        "long_text": "y", "nothing": null})"),
      json::parse(R"({
        "prompt": "", "label": "", "label_id": 0, "small": 5, "big_unsigned": null,
        "score": 0.0, "weight": -0.5, "accepted": false,
        "messages": [{"role": "assistant", "content": null}, null],
        "reward_model": {"ground_truth": "7", "style": "rule"},
        "token_ids": [2147483647], "data_source": null, "tags": {"k": -1},
        "long_text": "z", "nothing": null})"),
  };
  expected[0]["weight"] = static_cast<double>(0.1f);  // float32 widened, not rounded to 0.1

  const std::vector<json> rows = read_parquet_rows(file("prompts.parquet"));
  ASSERT_EQ(rows.size(), expected.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(rows[r], expected[r]) << "row " << r << ": got " << rows[r].dump();
  }
  // json's == equates 1 and 1.0: the kinds are checked apart.
  EXPECT_TRUE(rows[0]["label"].is_string());
  EXPECT_TRUE(rows[0]["label_id"].is_number_integer());
  EXPECT_TRUE(rows[0]["small"].is_number_integer());
  EXPECT_TRUE(rows[0]["big_unsigned"].is_number_unsigned());
  EXPECT_TRUE(rows[3]["score"].is_number_float());
  EXPECT_TRUE(rows[1]["weight"].is_number_float());
  EXPECT_TRUE(rows[0]["token_ids"][0].is_number_integer());
}

TEST_F(ParquetReaderTest, MaxRowsStopsAcrossRowGroups) {
  const std::vector<json> all = read_parquet_rows(file("prompts.parquet"));
  ASSERT_EQ(all.size(), 5u);
  for (int64_t max_rows : {1, 2, 3, 5}) {
    const std::vector<json> rows = read_parquet_rows(file("prompts.parquet"), max_rows);
    ASSERT_EQ(rows.size(), static_cast<size_t>(max_rows)) << "max_rows " << max_rows;
    for (size_t r = 0; r < rows.size(); ++r) EXPECT_EQ(rows[r], all[r]) << "row " << r;
  }
  EXPECT_EQ(read_parquet_rows(file("prompts.parquet"), 100).size(), 5u);
}

// 100000 rows in 4 row groups: more than one batch of 65536, read in order.
TEST_F(ParquetReaderTest, ManyRowsKeepTheirOrder) {
  const std::vector<json> rows = read_parquet_rows(file("many.parquet"));
  ASSERT_EQ(rows.size(), 100000u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const json want = {{"id", i}, {"text", "row " + std::to_string(i)}};
    if (rows[i] != want) {
      ADD_FAILURE() << "row " << i << ": got " << rows[i].dump() << ", want " << want.dump();
      break;
    }
  }
  const std::vector<json> head = read_parquet_rows(file("many.parquet"), 70000);
  ASSERT_EQ(head.size(), 70000u);
  EXPECT_EQ(head.back(), rows[69999]);
}

TEST_F(ParquetReaderTest, EmptyTableHasNoRows) {
  EXPECT_TRUE(read_parquet_rows(file("empty.parquet")).empty());
}

TEST_F(ParquetReaderTest, NonParquetFileIsAnInputErrorNamingIt) {
  const std::string jsonl = file("prompts.jsonl");
  std::ofstream(jsonl) << R"({"prompt": "this is JSONL, not Parquet"})"
                       << "\n";
  expect_input_error([&] { read_parquet_rows(jsonl); }, {jsonl, "not a readable Parquet file"});
  const std::string empty = file("empty_file.parquet");
  std::ofstream{empty};
  expect_input_error([&] { read_parquet_rows(empty); }, {empty, "not a readable Parquet file"});
  // A Parquet file cut short loses its footer.
  const std::string cut = file("cut.parquet");
  const std::string whole = slurp(file("prompts.parquet"));
  std::ofstream(cut, std::ios::binary) << whole.substr(0, whole.size() / 2);
  expect_input_error([&] { read_parquet_rows(cut); }, {cut, "not a readable Parquet file"});
}

TEST_F(ParquetReaderTest, MissingFileIsAnInputErrorNamingIt) {
  const std::string missing = file("no_such_dataset.parquet");
  expect_input_error([&] { read_parquet_rows(missing); },
                     {missing, "cannot open", "No such file or directory"});
}

TEST_F(ParquetReaderTest, UnsupportedColumnTypeIsNamed) {
  expect_input_error([&] { read_parquet_rows(file("binary.parquet")); },
                     {file("binary.parquet"), "column 'image'", "Arrow type binary"});
  // Nested: the column, its whole type and the part that is not converted.
  expect_input_error([&] { read_parquet_rows(file("nested_date.parquet")); },
                     {file("nested_date.parquet"), "column 'meta'",
                      "struct<id: int64, created: date32[day]>", "(date32[day])"});
}

}  // namespace
}  // namespace rlhf::data
