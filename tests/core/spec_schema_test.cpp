// The key table's machinery on its own: a schema composed from sections declares each key
// once, runs each section's rules, asks the section that runs a job kind for its roles; and
// the one parser of "FILE.py:NAME".
#include "core/spec_schema.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "cli/job_schema.h"
#include "core/python_ref.h"
#include "core/spec.h"
#include "core/spec_check.h"

namespace rlhf {
namespace {

using nlohmann::json;

// A job kind of its own: every role's placement keys (core's rules read them), one key
// "toy.level" with a rule, and the roles "ppo" uses here (the actor alone).
SpecSection toy_section() {
  SpecSection s;
  s.owner = "toy";
  s.keys = [](KeyTable& t) {
    for (Role role : kAllRoles)
      add_role_placement(t, role_name(role), "A model directory of the toy job.");
    t.integer("toy.level", 1, 0, 10, "How hard the toy job is (a rule caps it at 3).");
  };
  s.roles = [](const json& r) -> std::optional<RoleUse> {
    if (r.at("kind") != "ppo") return std::nullopt;
    return RoleUse{{Role::kActor}, {Role::kActor}};
  };
  s.rules = [](SpecCheck& v) {
    if (v.ok({"toy.level"}) && v.integer("toy.level") > 3)
      v.problem("toy.level", "above 3 needs a bigger toy");
  };
  s.why_unused = [](const json&, Role role) {
    return role == Role::kCritic ? std::string("toys have no critic") : std::string();
  };
  return s;
}

// Installs a schema for one test and puts the composed one back after it.
class InstalledSchema {
 public:
  explicit InstalledSchema(std::vector<SpecSection> sections) {
    install_job_schema(std::make_shared<const SpecSchema>(std::move(sections)));
  }
  ~InstalledSchema() { cli::install_composed_job_schema(); }
};

TEST(SpecSchema, AKeyDeclaredTwiceIsRefusedNamingItAndTheSecondOwner) {
  SpecSection again;
  again.owner = "again";
  again.keys = [](KeyTable& t) { t.integer("toy.level", 2, 0, 5, "The same key once more."); };
  try {
    SpecSchema schema({toy_section(), again});
    FAIL() << "a duplicate key was accepted";
  } catch (const std::logic_error& e) {
    EXPECT_EQ(std::string(e.what()), "spec key toy.level is declared twice (again by again)");
  }
}

TEST(SpecSchema, SectionsDecideKeysRulesAndRoles) {
  InstalledSchema toy({core_spec_section(), toy_section()});
  EXPECT_EQ(find_key("rollout.batch_size"), nullptr);  // not declared by these sections
  ASSERT_NE(find_key("toy.level"), nullptr);
  const JobSpec spec = JobSpec::parse(
      R"({"actor": {"model": "m"}, "critic": {"model": "c"}, "toy": {"level": 2}})", "toy.json");
  EXPECT_EQ(spec.get_int("toy.level"), 2);
  EXPECT_EQ(spec.used_roles(), std::vector<Role>{Role::kActor});
  EXPECT_TRUE(spec.trains(Role::kActor));
  EXPECT_EQ(spec.at("actor.devices"), json::array({0}));  // core placed it
  ASSERT_EQ(spec.warnings().size(), 1u);
  EXPECT_EQ(spec.warnings()[0],
            "critic is configured but not used by this ppo job (toys have no critic); its "
            "devices stay free");
  try {
    JobSpec::parse(R"({"actor": {"model": "m"}, "toy": {"level": 4}, "rollout": {"x": 1}})",
                   "toy.json");
    FAIL() << "the toy rule did not run";
  } catch (const SpecError& e) {
    ASSERT_EQ(e.problems().size(), 2u);
    EXPECT_EQ(e.problems()[0].path, "rollout.x");  // unknown to this schema
    EXPECT_EQ(e.problems()[1].path, "toy.level");
    EXPECT_EQ(e.problems()[1].message, "above 3 needs a bigger toy");
  }
  // No section runs dpo here: a defect of the composition, not of the spec.
  EXPECT_THROW(JobSpec::parse(R"({"kind": "dpo", "actor": {"model": "m"}})", "toy.json"),
               std::logic_error);
}

TEST(SpecSchema, DocumentationListsEachSectionWholeWhereItFirstAppears) {
  SpecSection late;
  late.owner = "late";
  late.keys = [](KeyTable& t) {
    t.string("extra.name", "", "A section only this folder declares.");
    t.boolean("actor.toy_flag", false, "A key added to the actor's section by another folder.");
  };
  InstalledSchema toy({core_spec_section(), toy_section(), late});
  const std::string md = spec_markdown();
  const auto actor = md.find("\n## actor\n"), flag = md.find("`actor.toy_flag`");
  const auto critic = md.find("\n## critic\n"), extra = md.find("\n## extra\n");
  ASSERT_NE(actor, std::string::npos);
  ASSERT_NE(flag, std::string::npos);
  EXPECT_LT(actor, flag);
  EXPECT_LT(flag, critic);  // listed with the actor's keys, before the next section
  EXPECT_LT(critic, extra);
  EXPECT_EQ(md.find("\n## actor\n", actor + 1), std::string::npos);  // one actor section
}

TEST(PythonRef, SplitsFileAndNameAtTheLastColon) {
  const auto ref = parse_python_ref("rewards/C:dir/score.py:grade");
  ASSERT_TRUE(ref);
  EXPECT_EQ(ref->file, "rewards/C:dir/score.py");
  EXPECT_EQ(ref->name, "grade");
  for (const char* bad : {"score.py", "score.py:", "score:grade", ".py:grade", "score.txt:f", ""})
    EXPECT_FALSE(parse_python_ref(bad)) << bad;
}

}  // namespace
}  // namespace rlhf
