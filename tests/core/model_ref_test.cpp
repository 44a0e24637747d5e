// Model references (core/model_ref.h) on real directory layouts: a Hugging Face Hub cache
// tree with two snapshots and refs/main, a named revision, rlhf's own model cache, and the
// places a reference that resolves nowhere names; then the same through a job spec.
#include "core/model_ref.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/errors.h"
#include "core/spec.h"
#include "test_paths.h"

namespace rlhf {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

// Sets an environment variable for one test and puts the old value back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class ModelRef : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("rlhf-model-ref-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    // The Hub cache as huggingface_hub lays it out: two snapshots, refs/main naming the
    // newer, a branch ref naming the older.
    const fs::path repo = root_ / "hf" / "hub" / "models--Org--Tiny";
    for (const char* rev : {"1111aaaa", "2222bbbb"})
      write(repo / "snapshots" / rev / "config.json", std::string("{\"rev\": \"") + rev + "\"}");
    write(repo / "refs" / "main", "2222bbbb\n");
    write(repo / "refs" / "v1", "1111aaaa");
    // One repo with a single snapshot and no refs/main.
    write(root_ / "hf" / "hub" / "models--Org--Lone" / "snapshots" / "9999" / "config.json", "{}");
    write(root_ / "rlhf" / "smollm2-135m-instruct" / "config.json", "{}");
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path snapshot(const std::string& rev) const {
    return root_ / "hf" / "hub" / "models--Org--Tiny" / "snapshots" / rev;
  }
  fs::path root_;
  ScopedEnv hf_home_{"HF_HOME", ""};
  ScopedEnv hub_{"HF_HUB_CACHE", ""};
  ScopedEnv rlhf_{"RLHF_MODEL_CACHE", ""};
};

TEST_F(ModelRef, EachStepInOrder) {
  ::setenv("HF_HOME", (root_ / "hf").c_str(), 1);
  ::setenv("RLHF_MODEL_CACHE", (root_ / "rlhf").c_str(), 1);
  // 1. an existing directory, as given (even one shaped like a Hub name would be elsewhere)
  auto dir = resolve_model_ref(snapshot("1111aaaa").string());
  ASSERT_TRUE(dir);
  EXPECT_EQ(dir->found_in, "directory");
  EXPECT_EQ(dir->path, snapshot("1111aaaa").string());
  // 2. a preset stays a preset
  auto preset = resolve_model_ref("preset:llama-3-8b");
  ASSERT_TRUE(preset);
  EXPECT_EQ(preset->path, "preset:llama-3-8b");
  // 3. a name scripts/get-model makes, in rlhf's model cache
  auto named = resolve_model_ref("smollm2-135m-instruct");
  ASSERT_TRUE(named);
  EXPECT_EQ(named->found_in, "rlhf model cache");
  EXPECT_EQ(named->path, (root_ / "rlhf" / "smollm2-135m-instruct").string());
  // 4. ORG/NAME: refs/main's snapshot, not the other one
  auto hub = resolve_model_ref("Org/Tiny");
  ASSERT_TRUE(hub);
  EXPECT_EQ(hub->found_in, "Hub cache");
  EXPECT_EQ(hub->path, snapshot("2222bbbb").string());
  EXPECT_EQ(hub->revision, "2222bbbb");
  EXPECT_EQ(hub->describe("actor.model"), "actor.model: Org/Tiny -> " +
                                              snapshot("2222bbbb").string() +
                                              " (Hub cache, revision 2222bbbb)");
  // @REVISION: a snapshot's hash, or a ref (branch or tag) naming one
  EXPECT_EQ(resolve_model_ref("Org/Tiny@1111aaaa")->path, snapshot("1111aaaa").string());
  EXPECT_EQ(resolve_model_ref("Org/Tiny@v1")->revision, "1111aaaa");
  // no refs/main and one snapshot: that one
  EXPECT_EQ(resolve_model_ref("Org/Lone")->revision, "9999");
  // $HF_HUB_CACHE wins over $HF_HOME/hub
  ::setenv("HF_HUB_CACHE", (root_ / "elsewhere").c_str(), 1);
  EXPECT_FALSE(resolve_model_ref("Org/Tiny"));
}

TEST_F(ModelRef, AReferenceFoundNowhereNamesEveryPlaceLooked) {
  ::setenv("HF_HUB_CACHE", (root_ / "hf" / "hub").c_str(), 1);
  ::setenv("RLHF_MODEL_CACHE", (root_ / "empty").c_str(), 1);
  try {
    require_model_ref("Org/Tiny@3333", "--model");
    ADD_FAILURE() << "a missing revision resolved";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--model: model \"Org/Tiny@3333\" not found (looked in: "), std::string::npos)
        << m;
    EXPECT_NE(m.find("(a directory): not there"), std::string::npos) << m;
    EXPECT_NE(m.find(snapshot("3333").string() + " (the Hub cache, revision 3333): not there "
                                                 "(snapshots: 1111aaaa, 2222bbbb)"),
              std::string::npos)
        << m;
  }
  std::vector<std::string> looked;
  EXPECT_FALSE(resolve_model_ref("Other/Model", &looked));
  ASSERT_EQ(looked.size(), 2u);
  EXPECT_NE(looked[1].find("models--Other--Model (the Hub cache): not there"), std::string::npos);
  looked.clear();
  EXPECT_FALSE(resolve_model_ref("smollm2-135m-instruct", &looked));
  ASSERT_EQ(looked.size(), 2u);
  EXPECT_NE(looked[1].find("scripts/get-model smollm2-135m-instruct makes it"), std::string::npos)
      << looked[1];
  EXPECT_TRUE(is_model_name("Org/Tiny@v1"));
  EXPECT_TRUE(is_model_name("smollm2-135m-instruct"));
  EXPECT_FALSE(is_model_name("runs/models/tiny"));
  EXPECT_FALSE(is_model_name("./tiny"));
}

// A spec names its model; the resolved directory and revision are what the job reads and
// what a run records (JobSpec::models, the console note); ref.model inherits the directory.
TEST_F(ModelRef, AJobSpecNamesItsModel) {
  ::setenv("HF_HUB_CACHE", (root_ / "hf" / "hub").c_str(), 1);
  const fs::path spec_file = root_ / "job.json";
  write(spec_file, R"({"kind": "ppo", "actor": {"model": "Org/Tiny@v1"},
                       "algo": {"advantage": {"estimator": "group_norm"}},
                       "reward": {"rule": "letters"},
                       "data": {"prompt_dataset": "synthetic:letters"}})");
  const JobSpec spec = JobSpec::load(spec_file.string(), {"rollout.n_samples_per_prompt=2"});
  EXPECT_EQ(spec.get_string("actor.model"), snapshot("1111aaaa").string());
  EXPECT_EQ(spec.get_string("ref.model"), snapshot("1111aaaa").string());
  ASSERT_EQ(spec.models().count("actor.model"), 1u);
  EXPECT_EQ(spec.models().at("actor.model").revision, "1111aaaa");
  EXPECT_EQ(spec.models().at("actor.model").ref, "Org/Tiny@v1");
  bool noted = false;
  for (const auto& n : spec.notes()) noted |= n.find("actor.model: Org/Tiny@v1 -> ") == 0;
  EXPECT_TRUE(noted);
  // Found nowhere: the name stays as written (not made relative to the spec's folder), and
  // the files check names the places looked.
  const JobSpec missing = JobSpec::load(
      spec_file.string(), {"actor.model=Org/Absent", "rollout.n_samples_per_prompt=2"});
  EXPECT_EQ(missing.get_string("actor.model"), "Org/Absent");
  bool listed = false;
  for (const auto& p : missing_inputs(missing))
    listed |= p.path.rfind("actor.model", 0) == 0 &&
              p.message.find("model \"Org/Absent\" not found (looked in: ") == 0 &&
              p.message.find("models--Org--Absent (the Hub cache): not there") != std::string::npos;
  EXPECT_TRUE(listed);
}

// The names rlhf knows are the ones scripts/get-model makes, with the same Hub names.
TEST(KnownModels, AreTheOnesScriptsGetModelMakes) {
  std::ifstream in(std::string(RLHF_SOURCE_DIR) + "/scripts/convert_gguf_model.py");
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  std::vector<std::pair<std::string, std::string>> script;
  const std::regex entry(R"re(\n    "([a-z0-9.-]+)": \{)re"), hub(R"re("hub_id": "([^"]+)")re");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), entry); it != std::sregex_iterator();
       ++it) {
    std::smatch id;
    const std::string rest = s.substr(static_cast<size_t>(it->position()));
    ASSERT_TRUE(std::regex_search(rest, id, hub)) << (*it)[1];
    script.push_back({(*it)[1], id[1]});
  }
  std::vector<std::pair<std::string, std::string>> ours;
  for (const auto& k : known_models()) ours.push_back({k.name, k.hub_id});
  EXPECT_EQ(ours, script);
}

}  // namespace
}  // namespace rlhf
