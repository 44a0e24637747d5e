// Continuous batching over one models::PagedKvCache (Generator::generate_paged, see
// generator.h): a batcher that decides which rows of a request wait, run and finish.
//
// The schedule, as vLLM's (v0) scheduler with recompute preemption:
// - waiting: prompts not yet started, and preempted rows (first, oldest first);
// - a prompt is admitted when max_num_seqs leaves room for its n samples and the pool has
//   blocks for its tokens (plus a small watermark while others run); it is prefilled once,
//   its first token sampled for every sample, and its n sequences share the prompt's blocks;
// - each decode step feeds every running row its last token; a row that needs a block when
//   none is free first waits for finished rows to be released, then the latest-admitted row
//   is preempted: its blocks return to the pool and it waits to be prefilled again with its
//   prompt and the tokens it had (its sampled tokens stay; the next one continues its
//   stream), so preemption changes no output;
// - finished rows leave at the next check of the device (every step on the CPU, every
//   sync_interval on a GPU) and new prompts join in their place;
// - multi-turn (a TurnHandler, rollout/trajectory.h): a row whose turn ended with a stop token
//   hands the turn to the handler and waits, keeping its blocks, while the others decode; the
//   handler is polled between decode steps (and waited on when nothing runs), and an answer's
//   tokens are written into the row's output (action mask 0) and prefilled over its cache
//   (PagedKvCache::plan_extend: the new tokens only) before the row decodes again. A waiting
//   row's blocks may be taken when the pool runs dry; it is then recomputed like a preempted
//   row. Up to max_turns model turns and max_new_tokens tokens (model and environment) a row;
// - a row may start from an opening (its prompt with its environment's initial observation,
//   TurnHandler::openings): a prompt's rows share the tokens their openings share as their
//   prompt (at most the P prompt columns), and each row's own rest (set_preambles) opens its
//   output like an answer, prefilled over the forked cache before its first model token.
//
// Called a batcher, not a scheduler: scheduler/ is the job's orchestration. Does not size
// the pool or assemble the output (generate_paged does).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <numeric>
#include <utility>
#include <vector>

#include "models/causal_lm.h"
#include "models/paged_kv_cache.h"
#include "rollout/generator.h"
#include "rollout/sampling.h"
#include "rollout/trajectory.h"

namespace rlhf::rollout {

class PagedDecoder;
class RouteLog;

class PagedBatcher {
 public:
  struct Limits {
    int64_t n_samples = 1;         // rows per prompt: row p * n + s is sample s of prompt p
    int64_t max_new_tokens = 1;    // R: a row ends after this many tokens, or a stop token
    int64_t max_seqs = 1;          // rows decoding at once (rollout.max_num_seqs)
    int64_t micro_batch_size = 1;  // waiting items per prefill forward
    int64_t watermark = 1;         // blocks left free when admitting while others run
    int64_t block_bytes = 0;       // bytes of one block, for the peak
    int64_t pad_token_id = 0;      // left padding of prefill batches
    int64_t max_turns = 1;         // model turns a row (with a TurnHandler)
  };
  // A waiting item: a whole prompt (its n rows), or one preempted row.
  struct Waiting {
    int64_t prompt = -1;
    int64_t row = -1;
  };

  // prompts: each prompt's tokens, no padding (every prompt waits, in order). The batcher
  // samples with `sampler` and writes the rows' tokens, log-probs and lengths into `outputs`
  // (Generator::DecodeState for the request's rows, on the model's device); `decoder`, when
  // not null, runs the decode steps padded (CUDA graphs on a GPU); `turns`, when not null,
  // makes each row a multi-turn trajectory. All must outlive it.
  PagedBatcher(models::CausalLM& model, models::PagedKvCache& cache, Sampler& sampler,
               PagedDecoder* decoder, Generator::DecodeState outputs,
               std::vector<std::vector<int64_t>> prompts, Limits limits,
               TurnHandler* turns = nullptr);

  // Multi-turn: tokens each row writes into its output before its first model token ([N]
  // lists, "" for none), outside the action mask and within max_new_tokens: the rest of a
  // row's opening (TurnHandler::openings) past its prompt's shared tokens. A row whose
  // preamble leaves no room for a model token ends at once, without a turn (empty output).
  void set_preambles(std::vector<std::vector<int64_t>> preambles) {
    preambles_ = std::move(preambles);
  }

  // In-flight weight updates: `poll` (called between two decode steps) applies the updates
  // that came and returns the weight version now; the rows start at `version`. Unset: one
  // version for every token.
  void set_version_poll(int64_t version, std::function<int64_t()> poll) {
    version_ = version;
    poll_ = std::move(poll);
  }
  // Streaming (issue 42.1): `done` is called with the prompts whose n rows have all ended,
  // in the order they ended, at each check of the device that ended some and at the end of
  // run(); every prompt once.
  void set_on_groups_done(std::function<void(const std::vector<int64_t>& prompts)> done) {
    on_groups_done_ = std::move(done);
  }
  // Routing replay: records each forward's routes into `log` (route_log.h) by row and
  // position. Not with padded decode steps (`decoder`).
  void set_route_log(RouteLog* log) { route_log_ = log; }
  // [N, R] int64: the version that sampled each output position (issue 42.3): a row's
  // positions from its token count at an update on carry the update's version.
  torch::Tensor token_versions(int64_t R) const;

  // Generates every row to its end: admits, decodes one position per running row per step,
  // and every `check_every` steps reads which rows ended, releases them and admits more.
  // Throws c10::Error when one sequence needs more blocks than the pool has.
  void run(int64_t check_every);

  // The items the next prefill takes from the front of the waiting queue, in order: while
  // max_seqs leaves room for each (a prompt is n rows, a preempted row one) and the free
  // blocks hold its tokens plus the watermark (no watermark for the first item when nothing
  // runs: only the blocks themselves matter then), at most micro_batch_size. Stops at the
  // first item that does not fit (first come, first served). Changes nothing.
  std::vector<Waiting> admissible() const;

  const std::deque<Waiting>& waiting() const { return waiting_; }
  const std::vector<int64_t>& running() const { return running_; }  // rows, decode order
  // Prefill time, preemptions, recomputed tokens, decode steps, peak KV bytes so far (the
  // caller adds the rest).
  const GenerationTimings& timings() const { return timings_; }
  // Tokens sampled by live rows in decode steps ([] int64 on the model's device).
  const torch::Tensor& decode_tokens() const { return live_tokens_; }
  // Multi-turn: row `row`'s model turns, and where the handler's tokens sit in its output
  // ([start, start + length) positions after the prompt).
  int64_t turns(int64_t row) const { return rows_[row].turns; }
  const std::vector<std::pair<int64_t, int64_t>>& env_spans(int64_t row) const {
    return rows_[row].env_spans;
  }

 private:
  // One output row's place in the schedule.
  struct RowState {
    int64_t seq = -1;              // its PagedKvCache sequence; -1 while not resident
    int64_t sampled = 0;           // tokens sampled so far
    bool done = false;             // ended (stop token or max_new_tokens), blocks released
    std::vector<int64_t> history;  // preempted: the tokens it had sampled (host copy)
    // Multi-turn.
    int64_t turns = 0;       // model turns ended
    int64_t turn_start = 0;  // output position where its current model turn began
    bool awaiting = false;   // its last turn is with the handler (seq >= 0: blocks kept)
    std::vector<std::pair<int64_t, int64_t>> env_spans;  // [start, length) of answer tokens
  };

  // Row `row`'s prompt tokens; prompt `prompt`'s rows.
  int64_t prompt_length(int64_t row) const {
    return static_cast<int64_t>(prompts_[static_cast<size_t>(row / limits_.n_samples)].size());
  }
  std::vector<int64_t> row_range(int64_t prompt) const {
    std::vector<int64_t> rows(static_cast<size_t>(limits_.n_samples));
    std::iota(rows.begin(), rows.end(), prompt * limits_.n_samples);
    return rows;
  }
  // Tokens the item's sequence holds after its prefill.
  int64_t held_tokens(const Waiting& w) const;
  // Admits waiting items while sequences and blocks allow, one prefill per admissible().
  void admit();
  // Prefills the admitted items in one forward and adds their rows to running_.
  void prefill(const std::vector<Waiting>& items);
  // What each item's sequence holds after prefill: a prompt's tokens, or a preempted row's
  // prompt and every sampled token but the last (which the next decode step feeds).
  std::vector<std::vector<int64_t>> prefill_tokens(const std::vector<Waiting>& items);
  // After a prefill of `items` into sequences `seqs` with last-position logits [b, V]: new
  // prompts fork to their n rows and sample their first tokens; preempted rows resume.
  void start_rows(const std::vector<Waiting>& items, const std::vector<int64_t>& seqs,
                  const torch::Tensor& logits);
  // Rows with a preamble (queued by start_rows): it joins their output, is prefilled over
  // their cache, and they decode after it.
  void start_preambles();
  // First tokens of `first_rows` from logits rows `from`; the rows join running_.
  void sample_first_tokens(const std::vector<int64_t>& first_rows, const std::vector<int64_t>& from,
                           const torch::Tensor& logits);
  // Ends rows that sampled max_new_tokens, without asking the device.
  void finish_full_rows();
  // One position for every running row; short of blocks, first releases rows that ended,
  // then preempts from the back (the row being served may be the one preempted).
  void reserve_decode_positions();
  // One decode step of every running row: forward, sample, write outputs, liveness.
  void decode_step();
  // Reads liveness (the loop's wait for the device) and releases rows that ended.
  void release_finished();
  // Evicts the latest-admitted running row: its blocks go back, it waits to be recomputed.
  void preempt_last();
  void finish_row(int64_t row);
  // A row stopped (stop token or budget): without a handler it is finished; with one, a turn
  // that ended with a stop token goes to the handler and the row waits for its answer.
  void end_row(int64_t row);
  // Applies the handler's ready answers (waiting up to wait_s for one).
  void serve_answers(double wait_s);
  // Appends answer tokens to rows holding their blocks, in one extend forward; rows short of
  // blocks are recomputed instead (requeue).
  void extend_rows(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& feed,
                   const std::vector<int64_t>& next);
  // Queues `row` to be prefilled again from its output so far (its blocks already released).
  void requeue(int64_t row);
  // Releases the blocks of one row waiting for its answer (recomputed when answered); false
  // when none holds any.
  bool evict_awaiting();
  // Rows waiting for an answer that hold their blocks (they count against max_seqs).
  int64_t held_awaiting() const;
  // Keeps running positions `keep` (host indices into running_), in order.
  void keep_running(const std::vector<int64_t>& keep);
  void note_peak();
  // Asks poll_ for the version now; a new one is recorded with each row's token count.
  void poll_version();
  // Hands the prompts ended since the last call to on_groups_done_.
  void flush_groups();

  models::CausalLM& model_;
  models::PagedKvCache& cache_;
  Sampler& sampler_;
  PagedDecoder* decoder_;
  Generator::DecodeState out_;
  std::vector<std::vector<int64_t>> prompts_;
  Limits limits_;
  torch::Device device_;

  std::vector<RowState> rows_;
  std::deque<Waiting> waiting_;
  // Running rows in decode order (admission order), with their next token [C] and liveness
  // [C] on the device, aligned with running_.
  std::vector<int64_t> running_;
  torch::Tensor next_;
  torch::Tensor live_;
  torch::Tensor live_tokens_;  // [] int64
  GenerationTimings timings_;
  TurnHandler* turns_ = nullptr;
  std::vector<int64_t> stop_ids_;                // host copy of outputs.stop_ids
  int64_t awaiting_ = 0;                         // rows whose turn is with the handler
  std::vector<std::vector<int64_t>> preambles_;  // per row (set_preambles), or empty
  std::vector<int64_t> preamble_rows_;           // prefilled, their preamble not yet started
  // In-flight updates: the version the rows started with, the poll, and each update's
  // version with every row's token count when it came.
  int64_t version_ = 0;
  std::function<int64_t()> poll_;
  std::vector<std::pair<int64_t, std::vector<int64_t>>> updates_;
  // Streaming: rows ended per prompt, and the prompts ended since the last flush.
  std::function<void(const std::vector<int64_t>&)> on_groups_done_;
  std::vector<int64_t> rows_ended_;
  std::vector<int64_t> groups_ended_;
  RouteLog* route_log_ = nullptr;
};

}  // namespace rlhf::rollout
