// Linked into each test binary that reads job specs: installs the composed key table before
// any test runs, as the rlhf binary's main does.
#include "cli/job_schema.h"

namespace {

const bool kInstalled = (rlhf::cli::install_composed_job_schema(), true);

}  // namespace
