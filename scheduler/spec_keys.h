// scheduler.*: heartbeats, timeouts and back-pressure of the job's scheduler.
#pragma once

#include "core/spec_schema.h"

namespace rlhf::scheduler {

SpecSection spec_section();

}  // namespace rlhf::scheduler
