// A small command-line parser for subcommands: flags, options with values (repeatable),
// and positionals. Unknown options are an InputError naming the option.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace rlhf::cli {

struct OptionSpec {
  std::string name;  // "--set"
  bool takes_value;  // false: a flag
  std::string help;  // one line for `rlhf CMD --help`
  std::string value_name = "VALUE";
  bool hidden = false;  // accepted, but not listed in --help (internal options)
};

class Args {
 public:
  // Parses argv[first..]; throws InputError on an unknown option or a missing value.
  Args(const std::vector<std::string>& argv, const std::vector<OptionSpec>& options);

  bool flag(const std::string& name) const;
  std::optional<std::string> value(const std::string& name) const;  // last occurrence
  std::vector<std::string> values(const std::string& name) const;   // all occurrences
  // The option's value as an integer >= min, `fallback` when absent; throws InputError
  // ("NAME must be an integer >= MIN, got ...") otherwise.
  int64_t integer(const std::string& name, int64_t fallback, int64_t min) const;
  const std::vector<std::string>& positionals() const { return positionals_; }
  // A model option's value (--model, --adapter, --tokenizer) resolved as a job spec's *.model
  // keys are (core/model_ref.h): the directory, nullopt when absent; InputError naming the
  // option and every place looked in when it resolves nowhere. A name found in a cache is
  // said on stderr.
  std::optional<std::string> model(const std::string& name) const;

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positionals_;
};

// Formats the option list for a subcommand's --help.
std::string format_options(const std::vector<OptionSpec>& options);

}  // namespace rlhf::cli
