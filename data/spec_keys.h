// data.*: datasets, their keys, templates and lengths.
#pragma once

#include "core/spec_schema.h"

namespace rlhf::data {

SpecSection spec_section();

}  // namespace rlhf::data
