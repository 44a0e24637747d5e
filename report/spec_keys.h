// logger.*: where a run's directory is and what it logs.
#pragma once

#include "core/spec_schema.h"

namespace rlhf::report {

SpecSection spec_section();

}  // namespace rlhf::report
