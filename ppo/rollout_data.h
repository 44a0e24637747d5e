// What a PPO-family step moves between its phases: the rollout's samples and the experience
// scored from them (OpenRLHF's Experience), and the helpers the phases share. Private to
// rlhf_ppo_driver.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/spec.h"
#include "ppo/advantages.h"
#include "ppo/rollout_correction.h"
#include "transport/message.h"

namespace rlhf::ppo::job {

using Clock = std::chrono::steady_clock;

// Worker compute of one role-group call on its critical path: a scatter's micro batches
// spread over the group's ranks (sum / ranks); call_all's ranks run together (max).
double scatter_compute(const Message& reply, int ranks);
// (A call_all's: slowest_compute, transport/operation.h.)
// {name: mean score} of each reward source ([S, B]; NaN scores, "not applicable", left out).
nlohmann::json source_means(const torch::Tensor& source_scores,
                            const std::vector<std::string>& names);

// Runs f on its own thread (role groups are independent, so their calls overlap).
template <typename F>
auto in_parallel(F&& f) {
  return std::async(std::launch::async, std::forward<F>(f));
}

// One step's samples, prompt-major (the n samples of a prompt are consecutive).
struct Rollout {
  torch::Tensor sequences;            // [B, T] prompt (left-padded) + response (right-padded)
  torch::Tensor attention_mask;       // [B, T]
  torch::Tensor action_mask;          // [B, A] tokens the model sampled (up to and including
                                      // EOS; an environment's turns between them are 0)
  torch::Tensor behaviour_log_probs;  // [B, A] FP32 log-probs the rollout sampled from
  std::vector<std::string> prompts, responses, labels;  // [B]
  std::vector<nlohmann::json> columns;  // [B] the rows' other columns for Python rewards
  torch::Tensor scores;         // [B] reward-source total when dynamic sampling needed it early
  torch::Tensor source_scores;  // [S, B] each source's scores, with `scores`
  nlohmann::json judges;        // judge sources: {NAME: {"votes", "unparsed"}} (null: none)
  nlohmann::json sampling;      // dynamic sampling's counts (null when off)
  int64_t weight_version = 0;   // the newest weights that sampled it
  // GKD's dataset step (algo.distill.gkd.lambda < 1): the prompts' dataset responses, not
  // sampled (behaviour log-probs are the actor's own, advantages 0, no staleness).
  bool from_dataset = false;
  torch::Tensor token_versions;  // [B, A] int64 the weight version that sampled each token
  // [B, T, S, k] int16: the experts each sparse layer ran for each token in the rollout
  // (algo.routing_stats / routing_replay; -1 where none), rollout/route_log.h.
  torch::Tensor routes;
  int64_t consumed = 0;   // prompts the stream had handed out once these were drawn
  double generate_s = 0;  // wall time of drawing them (generate, refills)
  // rollout.streaming: the scoring groups' replies made while the rollout generated, by role
  // (rows in this rollout's order), and their worker compute; score() calls the others.
  std::map<Role, Message> early;
  double early_compute_s = 0;
  double compute_s = 0;       // rollout workers' generate time on the critical path
  int64_t preempted = 0;      // sequences the rollout evicted and recomputed (paged KV)
  int64_t kv_peak_bytes = 0;  // most KV cache bytes in use on one rollout worker
  // Multi-turn rollouts (an environment; undefined / empty without one), per trajectory.
  torch::Tensor env_rewards;                  // [B] FP32 summed, added to the scores
  torch::Tensor turns;                        // [B] int64 model turns
  torch::Tensor tool_calls, tool_errors;      // [B] int64
  torch::Tensor env_timed_out;                // [B] int64: 1 where env.timeout_s ended it
  torch::Tensor env_seconds;                  // [B] FP32 its turns' waits for the environment
  std::vector<nlohmann::json> conversations;  // [B] [{"role", "content"}] after the prompt
  double env_stall_s = 0;  // summed over engines: time no row decoded (all waited)
};

// Rollout plus what the scorers returned: OpenRLHF's Experience, grouped by meaning.
struct Experience {
  // Per sequence.
  torch::Tensor scores;           // [B] weighted sum of the reward sources' scores
  torch::Tensor source_scores;    // [S, B] each source's own scores (NaN: not applicable)
  torch::Tensor response_length;  // [B] action tokens
  // Per token.
  torch::Tensor log_probs_old;        // [B, A] actor log pi_old(a|s)
  torch::Tensor log_probs_behaviour;  // [B, A] the rollout's, 0 outside the action mask
  torch::Tensor log_probs_ref;        // [B, A] reference log-probs (undefined without a ref)
  torch::Tensor values;               // [B, A] critic values (undefined without a critic)
  torch::Tensor kl;    // [B, A] policy-vs-reference KL estimate (zeros without a ref)
  double kl_mean = 0;  // sequence_mean_kl(kl): logged and fed to the KL controller
  // On-policy distillation (a teacher): its log-probs of the sampled tokens and the per-token
  // reverse KL log pi_actor - log pi_teacher (ppo/kl.h); undefined without a teacher.
  torch::Tensor log_probs_teacher;  // [B, A]
  torch::Tensor reverse_kl;         // [B, A], 0 off the action mask
  double reverse_kl_mean = 0;       // sequence_mean_kl(reverse_kl): distill/reverse_kl
  // GKD: the teacher's top-k tokens at each action position and their log-probs.
  torch::Tensor teacher_top_log_probs;  // [B, A, k] FP32
  torch::Tensor teacher_top_ids;        // [B, A, k] int64
  torch::Tensor teacher_top_rest;       // [B, A] FP32 log mass of the other tokens
  // |rollout log-probs - actor log-probs| over action tokens: the synced weights and the two
  // engines agree (with algo.max_staleness > 0 it includes the updates the rollout lags by).
  double logprob_diff_mean = 0, logprob_diff_max = 0;
  // Mixtures of experts with the rollout's routes: the share of the tokens it routed that the
  // actor's log-prob forward ran on other experts in some layer (0 with routing replay), and
  // that the actor's routers would have chosen otherwise. Negative when not measured.
  double route_differ_share = -1, router_differ_share = -1;
  RolloutMismatch mismatch;        // k3 KL and algo.rollout_correction's weights over action tokens
  torch::Tensor overlong_penalty;  // [B] DAPO soft length penalty added to the scores (<= 0)
  torch::Tensor entropy;           // [B, A] policy entropy at each action position
  BatchAdvantages adv;             // rewards, advantages, returns [B, A]
  double compute_s = 0;            // slowest scoring group's worker time
};

// The rows of prompt groups `groups` [G] of n samples each, in order: [G * n].
torch::Tensor group_rows(const torch::Tensor& groups, int64_t n);

// The sequences and attention mask (and the routes, when recorded), as a scatter's tensors.
std::vector<NamedTensor> sequence_tensors(const Rollout& r);
// The same of a streamed generate part (rollout.streaming), its rows `keep` (all when
// undefined): what the early scorers take.
std::vector<NamedTensor> part_tensors(const Message& part, const torch::Tensor& keep = {});
// Rows `index` [k] of a rollout (their texts too).
Rollout select_rows(const Rollout& r, const torch::Tensor& index);
// `a` then `b`, re-padded to the longer prompt (left) and response (right) of the two.
Rollout concat_rollouts(const Rollout& a, const Rollout& b, int64_t pad_id);

}  // namespace rlhf::ppo::job
