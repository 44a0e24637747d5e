// Moved to report/metrics.h (issue 29.11: the metrics and TensorBoard sinks live in report/).
// This forward stays only until ppo/driver.cpp, being split (issue 29.9), includes
// report/metrics.h and names report::MetricsSink; delete it then. Nothing else includes it.
#pragma once

#include "report/metrics.h"

namespace rlhf {
using report::MetricsSink;
}  // namespace rlhf
