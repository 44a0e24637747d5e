#include "cli/job_schema.h"

#include "data/spec_keys.h"
#include "dpo/spec_keys.h"
#include "engine/spec_keys.h"
#include "envs/spec_keys.h"
#include "ppo/spec_keys.h"
#include "report/spec_keys.h"
#include "rewards/spec_keys.h"
#include "rollout/spec_keys.h"
#include "scheduler/spec_keys.h"

namespace rlhf::cli {

std::shared_ptr<const SpecSchema> compose_job_schema() {
  return std::make_shared<const SpecSchema>(std::vector<SpecSection>{
      core_spec_section(), scheduler::spec_section(), data::spec_section(), rollout::spec_section(),
      engine::spec_section(), ppo::spec_section(), dpo::spec_section(), rewards::spec_section(),
      envs::spec_section(), report::spec_section()});
}

void install_composed_job_schema() {
  install_job_schema(compose_job_schema());
}

}  // namespace rlhf::cli
