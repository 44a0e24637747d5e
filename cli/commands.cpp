#include "cli/commands.h"

namespace rlhf::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"validate", "check a job spec: every problem at once, or a one-line summary", cmd_validate},
      {"plan",
       "show where every worker of a job will run and the memory each holds (--check RUN_DIR)",
       cmd_plan},
      {"sweep",
       "run (or only plan) every combination of a grid of spec values; csv, table and chart",
       cmd_sweep},
      {"report", "write a run's charts (reward, KL, losses, phases, memory) as one HTML file",
       cmd_report},
      {"spec", "print the job-spec reference (--markdown) or defaults (--defaults)", cmd_spec},
      {"init-model", "write a randomly initialised model (preset) in Hugging Face format",
       cmd_init_model},
      {"logprobs", "per-token log-probs of token-id sequences under a model (JSON lines)",
       cmd_logprobs},
      {"merge-adapter",
       "merge a PEFT LoRA adapter into its base model and write the HF model directory",
       cmd_merge_adapter},
      {"generate", "sample responses to prompts from a model (rollout engine; text or JSON lines)",
       cmd_generate},
      {"run", "start the workers of a job spec, run it, stop them (exit 1 names a failed worker)",
       cmd_run},
      {"worker", "internal: one worker process, started by `rlhf run`", cmd_worker},
      {"tokenize", "token ids of text (or text of ids) with a model's tokenizer", cmd_tokenize},
      {"reward", "score rows {prompt, response, label} with a spec's reward sources (no job)",
       cmd_reward},
      {"dataset", "rows of a built-in prompt dataset (synthetic:NAME) as JSON lines", cmd_dataset},
      {"version", "the versions this binary was built against (torch, CUDA, NCCL) and its GPUs",
       cmd_version},
  };
  return kCommands;
}

}  // namespace rlhf::cli
