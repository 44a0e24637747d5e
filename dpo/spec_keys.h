// algo.dpo.* and algo.rm.*: the DPO-family and reward-model losses; which roles the dpo,
// sft and rm kinds use.
#pragma once

#include "core/spec_schema.h"

namespace rlhf::dpo {

SpecSection spec_section();

}  // namespace rlhf::dpo
