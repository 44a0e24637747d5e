#include "data/spec_keys.h"

#include "core/spec_check.h"

namespace rlhf::data {

namespace {

void check_data(SpecCheck& v) {
  const std::string kind = v.kind();
  if (kind == "ppo" && v.str("data.prompt_dataset").empty())
    v.problem("data.prompt_dataset", "required for a ppo job: a JSONL file or synthetic:NAME");
  else if (kind != "ppo" && v.str("data.dataset").empty())
    v.problem("data.dataset", "required for a " + kind + " job: a JSONL file or synthetic:NAME");
  const int64_t prompt = v.integer("data.prompt_max_len"), max_len = v.integer("data.max_len");
  if (kind == "ppo" && v.ok({"data.prompt_max_len", "rollout.max_new_tokens", "data.max_len"})) {
    const int64_t gen = v.integer("rollout.max_new_tokens");
    if (prompt + gen > max_len)
      v.problem("data.max_len", std::to_string(max_len) + " is shorter than data.prompt_max_len (" +
                                    std::to_string(prompt) + ") + rollout.max_new_tokens (" +
                                    std::to_string(gen) + ") = " + std::to_string(prompt + gen));
  } else if (kind != "ppo" && v.ok({"data.prompt_max_len", "data.max_len"}) && prompt >= max_len) {
    v.problem("data.prompt_max_len", std::to_string(prompt) +
                                         " leaves no room for a response within data.max_len (" +
                                         std::to_string(max_len) + ")");
  }
  if (v.ok({"data.multiturn", "data.apply_chat_template"}) && v.flag("data.multiturn")) {
    if (kind != "sft")
      v.problem("data.multiturn",
                "trains on whole conversations in sft jobs only (kind is " + kind + ")");
    else if (!v.flag("data.apply_chat_template"))
      v.problem("data.multiturn",
                "conversations are rendered with the chat template: set "
                "data.apply_chat_template=true (chatml or llama3)");
  }
}

}  // namespace

SpecSection spec_section() {
  SpecSection s;
  s.owner = "data";
  s.keys = [](KeyTable& t) {
    t.file("data.prompt_dataset", "",
           "Prompt dataset for ppo: a JSONL or Parquet file, or synthetic:NAME for a built-in one "
           "(synthetic:letters, synthetic:arith, synthetic:calc).");
    t.file("data.dataset", "",
           "Training dataset for dpo, sft and rm: a JSONL file, or synthetic:NAME.");
    t.file("data.eval_dataset", "",
           "Held-out dataset (a file or synthetic:NAME), evaluated before training, every "
           "eval.steps and at the end (optional).");
    t.string("data.input_key", "input",
             "JSON key of the prompt in prompt datasets (dots reach into nested objects: "
             "extra_info.question).");
    t.choice("data.label_from", "field", {"field", "gsm8k"},
             "How the label is read from data.label_key's value: field (as it is), gsm8k (the "
             "number after \"####\" in a GSM8K answer, e.g. data.label_key answer).");
    t.string("data.label_key", "",
             "JSON key of a label passed to rule and remote rewards; for algo.dpo.loss kto, of "
             "the boolean desirable flag (empty: \"label\").");
    t.string("data.prompt_key", "prompt", "JSON key of the prompt in preference and SFT data.");
    t.string("data.chosen_key", "chosen", "JSON key of the preferred response.");
    t.string("data.rejected_key", "rejected", "JSON key of the dispreferred response.");
    t.string("data.output_key", "output",
             "JSON key of the target response in SFT data, and in a PPO job's prompt dataset "
             "with algo.distill.gkd.lambda < 1 (GKD's dataset responses).");
    t.boolean("data.multiturn", false,
              "SFT on whole conversations (OpenRLHF's --multiturn): data.prompt_key holds a list "
              "of {role, content} messages (system, user, assistant, tool) and the loss covers "
              "the assistant turns and their end-of-turn tokens, the other turns being context, "
              "rendered as a multi-turn rollout renders them. Needs data.apply_chat_template "
              "(chatml or llama3).");
    t.string(
        "data.margin_key", "",
        "JSON key of a per-pair reward margin for rm: -log sigmoid(r_c - r_r - margin) (empty: "
        "none).");
    t.string("data.input_template", "", "Prompt template with {} for the prompt text.");
    t.boolean("data.apply_chat_template", false, "Format prompts with the model's chat template.");
    t.choice("data.chat_template", "auto", {"auto", "chatml", "llama3", "llama2", "mistral"},
             "Chat template family; auto detects it from tokenizer_config.json.");
    t.integer("data.prompt_max_len", 1024, 1, kUnbounded,
              "Prompts are truncated to this many tokens.");
    t.integer("data.max_len", 2048, 2, kUnbounded,
              "Maximum total sequence length (prompt + response).");
    t.integer("data.max_samples", 0, 0, kUnbounded, "Use at most this many dataset rows (0: all).");
    t.choice("data.bad_lines", "fatal", {"fatal", "skip"},
             "A malformed dataset line stops the job (fatal) or is skipped and counted (skip).");
    t.boolean("data.packing", false, "Pack several SFT samples into one sequence.");
  };
  s.rules = check_data;
  return s;
}

}  // namespace rlhf::data
