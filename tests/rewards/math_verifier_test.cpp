// The math reward: extraction, normalization and scores as tables of expected values, and
// parity with Hugging Face's math-verify on a committed corpus (tests/rewards/math_corpus.jsonl,
// made by make_math_corpus.py and scored by math_verify_reference.py; no Python at test time).
#include "rewards/math_verifier.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/errors.h"
#include "test_paths.h"

namespace rlhf::rewards {
namespace {

struct ExtractCase {
  std::string response;
  std::optional<std::string> expected;
};

TEST(MathVerifier, ExtractsFinalAnswerInPriorityOrder) {
  const std::vector<ExtractCase> cases = {
      // \boxed wins over everything, the last one, nested braces balanced.
      {"So \\boxed{3} or rather \\boxed{\\frac{1}{2}}. The answer is 7", "\\frac{1}{2}"},
      {"$\\boxed{\\text{x}_{1} + {2}}$", "\\text{x}_{1} + {2}"},
      {"\\fbox{12} cats", "12"},
      {"\\boxed 5$ is it", "5"},
      {"Truncated: \\boxed{4} then \\boxed{12", "4"},
      {"Empty \\boxed{} then 8", "8"},
      // GSM8K's ####.
      {"She has 3 + 4 = 7.\n#### 7\nBye 9", "7"},
      {"#### 1,234", "1,234"},
      // "The answer is" / "answer:", any case, the last one, to the end of the sentence.
      {"The answer is 12. Check: 3*4=12, answer is 13. Then 5.", "13"},
      {"ANSWER: 3.5 meters\nmore text 99", "3.5 meters"},
      {"The final answer is $\\frac{3}{4}$.", "$\\frac{3}{4}$"},
      {"The answer is approximately 3.14, I think", "3.14"},
      {"The answer is x + 1.", "x + 1"},
      {"the answer isn't clear, maybe 6", "6"},
      // The last number.
      {"First 2 then 3, finally 1,234,567 apples.", "1,234,567"},
      {"It costs $-4.50 in the end", "-4.50"},
      {"x = \xE2\x88\x92"
       "3",
       "\xE2\x88\x92"
       "3"},
      {"half is 1/2 of it", "1/2"},
      {"it is \\frac{5}{8}", "\\frac{5}{8}"},
      {"growth of 50% overall", "50%"},
      {"area 5 m^2", "5"},
      {"10-3 is seven", "3"},
      {"values 1,2,3", "3"},
      {"no number here", std::nullopt},
      {"", std::nullopt},
  };
  for (const ExtractCase& c : cases) {
    EXPECT_EQ(extract_final_answer(c.response), c.expected) << "response: " << c.response;
  }
}

struct NormalizeCase {
  std::string answer;
  std::string expected;
};

TEST(MathVerifier, NormalizesAnswers) {
  const std::vector<NormalizeCase> cases = {
      {"  42  ", "42"},
      {"42.", "42"},
      {"$42$", "42"},
      {"\\$42", "42"},
      {"\\(\\frac{1}{2}\\)", "1/2"},
      {"\\dfrac{3}{4}", "3/4"},
      {"\\tfrac12", "1/2"},
      {"-\\frac{\\sqrt{3}}{2}", "-(\\sqrt{3})/2"},
      {"2\\frac{1}{2}", "2 1/2"},
      {"\\text{12 apples}", "12"},
      {"\\mathrm{5\\,cm}", "5"},
      {"12 apples", "12"},
      {"$3 dollars", "3"},
      {"60 km/h", "60"},
      {"5 m^2", "5"},
      {"5x", "5x"},
      {"1,234", "1234"},
      {"1{,}234,567.00", "1234567"},
      {"3.50", "3.5"},
      {"12.0", "12"},
      {"50\\%", "50%"},
      {"\\left( 1, 2 \\right)", "(1,2)"},
      {"\xE2\x88\x92"
       "3",
       "-3"},
      {"- 3", "-3"},
      {"+7", "7"},
      {"x = 5", "5"},
      {"90^\\circ", "90"},
      {"{5}", "5"},
      {"x + 1", "x+1"},
      {"\\text{Paris}", "Paris"},
      {"$ $", ""},
  };
  for (const NormalizeCase& c : cases) {
    EXPECT_EQ(normalize_answer(c.answer), c.expected) << "answer: " << c.answer;
  }
}

struct ValueCase {
  std::string normalized;
  std::optional<double> expected;
};

TEST(MathVerifier, NumericValues) {
  const std::vector<ValueCase> cases = {
      {"42", 42.0},
      {"-3", -3.0},
      {"0.25", 0.25},
      {".5", 0.5},
      {"3/4", 0.75},
      {"-1/8", -0.125},
      {"50%", 50.0},
      {"1 1/2", 1.5},
      {"-2 1/4", -2.25},
      {"1/0", std::nullopt},
      {"x", std::nullopt},
      {"1e5", std::nullopt},
      {"", std::nullopt},
      {"1.2.3", std::nullopt},
      {"(1)/(2)", std::nullopt},
      {"inf", std::nullopt},
  };
  for (const ValueCase& c : cases) {
    const std::optional<double> value = numeric_value(c.normalized);
    ASSERT_EQ(value.has_value(), c.expected.has_value()) << c.normalized;
    // Exact: every expected value here is a binary fraction from_chars returns exactly.
    if (value) {
      EXPECT_EQ(*value, *c.expected) << c.normalized;
    }
  }
}

struct ScoreCase {
  std::string response;
  std::string label;
  double expected;
};

TEST(MathVerifier, ScoresResponsesAgainstLabels) {
  const std::vector<ScoreCase> cases = {
      {"The answer is \\boxed{72}.", "72", 1.0},
      {"\\boxed{71}", "72", 0.0},
      {"Natalia sold 48 + 24 = 72 clips.", "Natalia sold 48/2 = 24 clips in May.\n#### 72", 1.0},
      {"\\boxed{\\frac{1}{2}}", "0.5", 1.0},
      {"The answer is 0.5", "\\frac{1}{2}", 1.0},
      {"answer: 1,234 apples", "1234", 1.0},
      {"So it costs $12.00.", "12", 1.0},
      {"A 50% increase", "50", 1.0},
      {"A 50% increase", "0.5", 0.0},
      {"\\boxed{x+1}", "x + 1", 1.0},
      {"\\boxed{1+x}", "x+1", 0.0},  // no algebra: strings differ
      {"The answer is \\text{Paris}.", "Paris", 1.0},
      {"I don't know.", "3", 0.0},
      {"\\boxed{-3}",
       "\xE2\x88\x92"
       "3",
       1.0},
      {"#### 1,000,000", "\\boxed{1000000}", 1.0},
      // Tolerance: relative 1e-6, absolute 1e-9 near zero.
      {"\\boxed{1000000.5}", "1000000", 1.0},
      {"\\boxed{1000002}", "1000000", 0.0},
      {"\\boxed{0.3333333}", "1/3", 1.0},
      {"\\boxed{0.3333}", "1/3", 0.0},
      {"\\boxed{0.0000000005}", "0", 1.0},
      {"\\boxed{0.000001}", "0", 0.0},
  };
  for (const ScoreCase& c : cases) {
    EXPECT_EQ(math_score(c.response, c.label), c.expected)
        << "response: " << c.response << "\nlabel: " << c.label;
  }
}

TEST(MathVerifier, LabelWithoutAnswerThrowsInputError) {
  for (const std::string label : {"", "   ", "$$", "\\boxed{}", "\\text{ }"}) {
    try {
      math_score("\\boxed{1}", label);
      ADD_FAILURE() << "expected InputError for label \"" << label << "\"";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()),
                "reward rule math: label \"" + label + "\" has no answer to compare with");
    }
  }
}

// One pair of the corpus, with our intended score and math-verify's verdict.
struct CorpusRow {
  std::string id;
  std::string response;
  std::string label;
  double expected = 0;
  double math_verify = 0;
  std::string disagreement_reason;  // why we differ from math-verify; "" when we agree
};

std::vector<CorpusRow> read_corpus() {
  const std::string path = std::string(RLHF_SOURCE_DIR) + "/tests/rewards/math_corpus.jsonl";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::vector<CorpusRow> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json row = nlohmann::json::parse(line);
    rows.push_back({row.at("id").get<std::string>(), row.at("response").get<std::string>(),
                    row.at("label").get<std::string>(), row.at("expected").get<double>(),
                    row.at("math_verify").get<double>(),
                    row.value("disagreement_reason", std::string())});
  }
  return rows;
}

TEST(MathVerifier, MatchesTheCorpusExpectedScores) {
  const std::vector<CorpusRow> rows = read_corpus();
  ASSERT_GE(rows.size(), 300u);
  for (const CorpusRow& row : rows) {
    EXPECT_EQ(math_score(row.response, row.label), row.expected)
        << row.id << "\nresponse: " << row.response << "\nlabel: " << row.label;
  }
}

// Every pair where we and math-verify differ carries a stated reason, and every stated reason
// still describes a difference: a fix on either side shows up here.
TEST(MathVerifier, AgreesWithMathVerifyOnTheCorpus) {
  const std::vector<CorpusRow> rows = read_corpus();
  ASSERT_GE(rows.size(), 300u);
  int agree = 0;
  for (const CorpusRow& row : rows) {
    const double ours = math_score(row.response, row.label);
    const bool differs = ours != row.math_verify;
    if (!differs) ++agree;
    if (differs) {
      EXPECT_FALSE(row.disagreement_reason.empty())
          << row.id << ": ours " << ours << ", math-verify " << row.math_verify
          << " with no disagreement_reason\nresponse: " << row.response << "\nlabel: " << row.label;
    } else {
      EXPECT_TRUE(row.disagreement_reason.empty())
          << row.id << ": states \"" << row.disagreement_reason << "\" but both score " << ours;
    }
  }
  std::cout << "[ agreement] " << agree << "/" << rows.size() << " with math-verify\n";
}

}  // namespace
}  // namespace rlhf::rewards
