// The job spec's key table, composed from the section each folder declares (core, scheduler,
// data, rollout, engine, ppo, dpo, rewards, envs, report), in documentation order.
#pragma once

#include <memory>

#include "core/spec_schema.h"

namespace rlhf::cli {

std::shared_ptr<const SpecSchema> compose_job_schema();
// install_job_schema(compose_job_schema()): what main and the test binaries run first.
void install_composed_job_schema();

}  // namespace rlhf::cli
