#include "rollout/spec_keys.h"

#include <filesystem>
#include <utility>
#include <vector>

#include "core/spec_check.h"

namespace rlhf::rollout {

using nlohmann::json;

namespace {

// rollout.tensor_parallel_size t: the rollout's workers form engines of t consecutive ranks
// (rank order as core/placement.cpp gives it: nodes in cluster order, then the listed ids).
// Distinct GPUs per engine need no rule of their own: a role never lists a device twice.
void check_rollout_engines(SpecCheck& v) {
  const std::string key = "rollout.tensor_parallel_size";
  const auto& group = v.group;
  if (!v.uses(Role::kRollout) || !v.ok({key})) return;
  const int64_t t = v.integer(key);
  if (t == 1 || !group.count("rollout") || !v.ok({"rollout.devices", "cluster.nodes"})) return;
  const int64_t workers = group.at("rollout");
  if (workers % t != 0) {
    v.problem(key, std::to_string(t) + " does not divide the rollout's " + std::to_string(workers) +
                       " worker" + (workers == 1 ? "" : "s") +
                       " (rollout.devices): each engine takes " + std::to_string(t) +
                       " consecutive workers; list a multiple of " + std::to_string(t) +
                       " devices");
    return;
  }
  const json& nodes = v.at("cluster.nodes");
  const json& devices = v.at("rollout.devices");
  std::vector<std::pair<std::string, bool>> node_of_rank;  // node name, cuda
  for (const auto& n : nodes) {
    const std::string name = n.value("name", std::string());
    const bool cuda = n.value("kind", std::string()) == "cuda";
    if (devices.is_array() && &n == &nodes[0])
      for (size_t i = 0; i < devices.size(); ++i) node_of_rank.emplace_back(name, cuda);
    if (devices.is_object() && devices.contains(name))
      for (size_t i = 0; i < devices.at(name).size(); ++i) node_of_rank.emplace_back(name, cuda);
  }
  for (size_t first = 0; first + static_cast<size_t>(t) <= node_of_rank.size();
       first += static_cast<size_t>(t)) {
    const size_t last = first + static_cast<size_t>(t) - 1;
    if (!node_of_rank[first].second || node_of_rank[first].first == node_of_rank[last].first)
      continue;
    v.problem(key, "engine " + std::to_string(first / static_cast<size_t>(t)) +
                       " (rollout workers " + std::to_string(first) + ".." + std::to_string(last) +
                       ") spans nodes \"" + node_of_rank[first].first + "\" and \"" +
                       node_of_rank[last].first +
                       "\": its ranks all-reduce in every layer, so list each engine's " +
                       std::to_string(t) + " GPUs on one node");
    return;
  }
  const bool cuda = !node_of_rank.empty() && node_of_rank.front().second;
  if (cuda && !v.str("rollout.colocate_with").empty())
    v.warnings.push_back(key + " " + std::to_string(t) +
                         " with rollout.colocate_with: the weight sync goes over NCCL or Gloo, "
                         "not CUDA IPC (IPC hands one whole model to one GPU)");
}

void add_generation_keys(KeyTable& t) {
  t.integer("rollout.batch_size", 1024, 1, kUnbounded,
            "Prompts per PPO step (rollout_batch_size).");
  t.number_or_auto(
      "rollout.kv_cache_memory_gb", "auto", 0,
      "KV cache budget per rollout worker in GiB (0: unbounded, sized for max_num_seqs "
      "sequences at full length). auto: on cuda nodes what the device has left in the "
      "generate phase after every other term the plan counts there (weights, the roles "
      "colocated with the rollout, activations, logits, the CUDA context), minus the headroom "
      "rollout.gpu_memory_utilization leaves (vLLM's meaning); `rlhf plan` shows the size "
      "and how many full-length sequences it holds; on cpu nodes auto is 0. The paged pool's size "
      "(never more than max_num_seqs full-length sequences): sequences join as others finish "
      "and are preempted and recomputed when blocks run out; outputs do not depend on it.");
  t.number("rollout.gpu_memory_utilization", 0.9, 0, 1,
           "With rollout.kv_cache_memory_gb auto: the share of each rollout GPU's memory "
           "(cluster.nodes[].memory_gb) the plan may fill in the generate phase, all roles "
           "on the device counted (vLLM's gpu_memory_utilization); the rest is headroom for "
           "the allocator's fragmentation and what no term counts.",
           true);
  t.integer("rollout.kv_block_size", 16, 1, 4096,
            "Tokens per KV cache block (vLLM's block_size): a sequence holds only the blocks "
            "it fills, a prompt's samples share its blocks, and new prompts join the decode "
            "batch as others finish.");
  t.integer("rollout.max_num_seqs", 0, 0, kUnbounded,
            "Sequences decoding at once with a paged KV cache (vLLM's max_num_seqs); 0: "
            "rollout.micro_batch_size x rollout.n_samples_per_prompt.");
  t.boolean("rollout.enforce_eager", false,
            "Run paged decode steps eagerly at their own shapes (vLLM's enforce_eager). By "
            "default a GPU rollout pads each decode step to a bucketed shape and replays it as "
            "a CUDA graph captured on first use (a small model's decode step is bound by "
            "kernel launches, not by the GPU). No effect on CPU nodes, which always run "
            "eagerly.");
  t.boolean("rollout.gpu_kernels", true,
            "On GPU nodes, generate with the FlashInfer kernels compiled into rlhf (`rlhf "
            "version` names them) where they have an instance for the model: paged decode "
            "attention reading the KV blocks in place, one-kernel RMSNorm. false: torch's "
            "operators (gather + SDPA), the reference path. No effect on CPU nodes.");
  t.integer("rollout.micro_batch_size", 8, 1, kUnbounded,
            "Prompts per generate call on one rollout engine (one worker, or the "
            "rollout.tensor_parallel_size workers of a tensor-parallel engine).");
  t.integer("rollout.tensor_parallel_size", 1, 1, kUnbounded,
            "Workers per rollout engine (vLLM's tensor_parallel_size): each layer is split "
            "over this many GPUs (column- and row-parallel attention and MLP, "
            "vocabulary-parallel embedding and head), so each holds about 1/t of the weights "
            "and KV cache. Rollout workers t*e .. t*e+t-1 form engine e; each micro batch goes "
            "to every worker of one engine. The rollout's worker count must be a multiple, "
            "t must divide the model's heads, KV heads, intermediate size and vocabulary, and "
            "on cuda nodes an engine's workers must be on one node. With t > 1 the weight sync "
            "goes over NCCL or Gloo (never CUDA IPC), each rank receiving only its slices.");
  t.integer("rollout.n_samples_per_prompt", 1, 1, 4096, "Responses sampled per prompt.");
  t.integer("rollout.max_new_tokens", 1024, 1, kUnbounded,
            "Maximum response length in tokens. A multi-turn trajectory's budget (veRL's "
            "response_length): its model and environment tokens together.");
  t.integer("rollout.max_turns", 1, 1, 1000,
            "Model turns per trajectory (veRL's multi_turn.max_assistant_turns). With an "
            "environment (env.*), a turn ends at a stop token (EOS, rollout.stop_token_ids and "
            "the template's end of turn, <|im_end|> or <|eot_id|>), the environment answers, its "
            "answer is "
            "appended as the template's tool or user turn over the same KV cache (chatml or "
            "llama3 templates) and the model goes on, up to "
            "this many turns and rollout.max_new_tokens tokens. Environment tokens are outside "
            "the action mask: no loss, KL or entropy on them. 1: one turn (an environment then "
            "only scores it).");
  t.number("rollout.temperature", 1.0, 0, 100, "Sampling temperature (0: greedy).");
  t.number("rollout.top_p", 1.0, 0, 1, "Nucleus sampling mass.", true);
  t.integer("rollout.top_k", -1, -1, kUnbounded,
            "Sample among the k most likely tokens (-1: off).");
  t.integers("rollout.stop_token_ids", {}, 0,
             "Extra token ids that end a response (EOS always does).");
  t.integer("rollout.max_refill_batches", 0, 0, 1000,
            "With algo.dynamic_sampling: up to this many extra batches of rollout.batch_size "
            "prompts are generated per step to replace the dropped groups (0: train on the "
            "kept groups only).");
}

// Where the rollout's model comes from, and how the actor's weights reach it after each step.
void add_sync_keys(KeyTable& t) {
  add_role_placement(t, "rollout",
                     "Generation model (default: actor.model; synced after each step).");
  t.number("rollout.sync_bucket_mb", 256.0, 0, 65536,
           "Actor -> rollout weight sync: the weights travel in wire dtype packed into flat "
           "buckets of this many MiB (a larger tensor is split), one bucket at a time, through "
           "CUDA IPC when the rollout shares the actor's GPU, NCCL when both have GPUs of their "
           "own, else Gloo; no rank holds more than one layer and one bucket beyond its model.",
           true);
  t.choice("rollout.lora_sync", "adapters", {"adapters", "merged"},
           "How a LoRA actor (actor.lora.rank > 0) syncs the rollout: `adapters` sends only "
           "the lora_A / lora_B tensors (a few MB) and each rollout worker merges them into "
           "the base it loaded, W = base + scale B A from a host copy of the base (needs "
           "rollout.model = actor.model); `merged` sends W + scale B A for the whole model, "
           "computed one layer at a time on the actor. Both give the rollout the same weights "
           "bit for bit; bench/RESULTS.md (issue 30.3) has the timings.");
  t.boolean("rollout.offload_while_training", true,
            "With rollout.colocate_with actor on cuda nodes (vLLM's sleep mode, level 1): the "
            "rollout's weights move to pinned host memory after generating and come back "
            "before the weight sync, so scoring and training have the GPU (the KV cache is "
            "freed after every generate call anyway); costs two host copies of the rollout's "
            "weights per step. A no-op on cpu nodes (host memory is the same memory), on GPUs "
            "of its own and with algo.max_staleness > 0 (generation overlaps training).");
  t.boolean("rollout.partial_rollout", true,
            "With algo.max_staleness > 0: the actor's new weights reach the rollout between two "
            "decode steps (in-flight updates, as slime and AReaL): the sequences in flight "
            "continue with the new weights and their KV cache as it is, and each token carries "
            "the version that sampled it. false: a weight sync waits for the generate call in "
            "progress to end. Not with rollout.tensor_parallel_size > 1.");
  t.boolean("rollout.streaming", false,
            "Each prompt's group of samples comes back from the rollout as soon as its last "
            "response ends, and scoring starts on it while generation goes on: the reference "
            "and reward model always, the actor's log-probs and the critic's values too with "
            "algo.max_staleness 0 (nothing trains meanwhile). With algo.dynamic_sampling each "
            "group is filtered as it arrives and only the kept ones are scored. Single-turn "
            "rollouts only, not with rollout.colocate_with.");
}

void check_rollout(SpecCheck& v) {
  check_rollout_engines(v);
  if (v.kind() != "ppo") return;
  if (v.ok({"rollout.micro_batch_size", "rollout.batch_size"}) &&
      v.integer("rollout.micro_batch_size") > v.integer("rollout.batch_size"))
    v.problem("rollout.micro_batch_size",
              "is " + std::to_string(v.integer("rollout.micro_batch_size")) +
                  ", larger than rollout.batch_size (" +
                  std::to_string(v.integer("rollout.batch_size")) + ")");
  if (v.ok({"rollout.max_turns", "data.apply_chat_template"}) &&
      v.integer("rollout.max_turns") > 1 && !v.flag("data.apply_chat_template"))
    v.problem("rollout.max_turns",
              "the environment's turns are rendered with the chat template: set "
              "data.apply_chat_template=true (chatml or llama3)");
  // The adapters-only sync merges into the rollout's own base: it must be the actor's.
  const bool lora = v.ok({"actor.lora.rank", "actor.lora.adapter"}) &&
                    (v.integer("actor.lora.rank") > 0 || !v.str("actor.lora.adapter").empty());
  if (lora && v.ok({"rollout.lora_sync", "rollout.model", "actor.model"}) &&
      v.str("rollout.lora_sync") == "adapters" &&
      std::filesystem::weakly_canonical(v.str("rollout.model")) !=
          std::filesystem::weakly_canonical(v.str("actor.model")))
    v.problem("rollout.lora_sync",
              "adapters needs the rollout to hold the actor's base (rollout.model " +
                  v.str("rollout.model") + " is not actor.model " + v.str("actor.model") +
                  "); set rollout.lora_sync merged");
}

}  // namespace

SpecSection spec_section() {
  SpecSection s;
  s.owner = "rollout";
  s.keys = [](KeyTable& t) {
    add_generation_keys(t);
    add_sync_keys(t);
  };
  s.rules = check_rollout;
  return s;
}

}  // namespace rlhf::rollout
