// What a LoRA adapter is (rank, alpha, dropout, targets, init, rsLoRA), as a plain struct a
// role config can carry without the model headers. models/lora.h applies it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rlhf::models {

enum class LoraInit {
  kKaimingUniform,  // PEFT's default (init_lora_weights=True): A ~ kaiming_uniform(a=sqrt 5)
  kGaussian,        // PEFT's "gaussian": A ~ N(0, (1/r)^2)
};
LoraInit lora_init_from_name(const std::string& name);  // "default" | "gaussian"
std::string lora_init_name(LoraInit init);

struct LoraConfig {
  int64_t rank = 0;      // r; 0 = no adapters
  double alpha = 16.0;   // lora_alpha
  double dropout = 0.0;  // lora_dropout, on each adapter's input in training forwards
  // PEFT names: "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
  // or "all-linear" (every one of them; the LM head is never a target, as in PEFT).
  std::vector<std::string> target_modules = {"all-linear"};
  LoraInit init = LoraInit::kKaimingUniform;
  bool use_rslora = false;  // scale alpha / sqrt(r) (Kalajdzievski 2023) instead of alpha / r
  // PEFT's modules_to_save: whole modules trained and saved beside the adapters (a value-head
  // role's head, "score"); filled from an adapter file or a trainer's export, not the spec.
  std::vector<std::string> modules_to_save;
  // alpha / r, or alpha / sqrt(r) with rsLoRA (PEFT's LoraLayer.update_layer).
  double scale() const;
};

}  // namespace rlhf::models
