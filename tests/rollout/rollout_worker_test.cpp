// Rollout workers through the real scheduler: two `rlhf worker` processes load a model,
// receive new weights from this test process (the actor, rank 0 of a real Gloo group),
// and serve `generate` through a scatter whose micro batches land on both ranks. The result
// must equal generating locally with the actor's weights (same seed, same rows). A worker
// put to sleep (weights in host memory) refuses to generate until woken, and then
// generates exactly what it generated before. A sync in flight lands between two decode
// steps. A streaming generate sends each prompt group back as it ends.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <future>
#include <memory>
#include <set>

#include "core/errors.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "models/paged_kv_cache.h"
#include "models/tensor_parallel.h"
#include "rollout/generator.h"
#include "rollout/weight_sync.h"
#include "rollout/worker_ops.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"
#include "tests/support/collective.h"
#include "tests/support/processes.h"
#include "tests/support/scheduler_config.h"
#include "transport/collective_group.h"

namespace rlhf {
namespace {

using namespace std::chrono_literals;

// The actor's side of a weight sync: rank 0 of a Gloo group with every rollout rank after it,
// met at `store` (the rollout ranks join through their sync_weights call).
std::unique_ptr<transport::CollectiveGroup> actor_sync_group(const std::string& store,
                                                             int rollout_ranks) {
  return test::join_group(store, 0, rollout_ranks + 1, 60s);
}

// load_model's "generation": the engine's settings whole, as the PPO driver sends them.
rollout::GenerationConfig generation(int64_t max_new, int64_t n, int64_t micro_batch,
                                     std::vector<int64_t> stop = {}, int64_t block = 16,
                                     int64_t kv_bytes = 0) {
  rollout::GenerationConfig c;
  c.max_new_tokens = max_new;
  c.n_samples_per_prompt = n;
  c.micro_batch_size = micro_batch;
  c.stop_token_ids = std::move(stop);
  c.kv_block_size = block;
  c.kv_cache_bytes = kv_bytes;
  return c;
}

// load_model of a preset test model drawn from `seed`.
ops::LoadModel load_preset(const std::string& preset, uint64_t seed,
                           const rollout::GenerationConfig& generation) {
  ops::LoadModel request;
  request.preset = preset;
  request.seed = seed;
  request.generation = generation;
  return request;
}

// generate at `temperature` (top_p 1 unless given) with `seed`, n samples per prompt.
ops::Generate sampling(double temperature, uint64_t seed, int64_t n, double top_p = 1.0) {
  ops::Generate request;
  request.sampling.temperature = temperature;
  request.sampling.top_p = top_p;
  request.sampling.seed = seed;
  request.n_samples_per_prompt = n;
  return request;
}

// `ranks` rollout workers started through a real scheduler, run directory `name`.
struct RolloutWorkers {
  SchedulerConfig config;
  std::unique_ptr<Scheduler> scheduler;
  RolloutWorkers(const std::string& name, int ranks) : config(testing::scheduler_config(name)) {
    torch::set_num_threads(1);
    config.worker_timeout = 20000ms;  // heartbeats stay late on a loaded 2-core machine
    scheduler =
        std::make_unique<Scheduler>(config, testing::local_placement({{Role::kRollout, ranks}}));
    scheduler->start();
  }
  ~RolloutWorkers() { scheduler->shutdown(); }
  RoleGroup& group() { return scheduler->group(Role::kRollout); }
};

TEST(RolloutWorker, GeneratesThroughTheSchedulerWithWeightsSyncedFromTheActor) {
  torch::set_num_threads(1);
  SchedulerConfig config = testing::scheduler_config("rollout-workers");
  config.worker_timeout = 20000ms;  // heartbeats stay late on a loaded 2-core machine
  Scheduler scheduler(config, testing::local_placement({{Role::kRollout, 2}}));
  scheduler.start();
  auto& rollout = scheduler.group(Role::kRollout);

  const int64_t max_new = 6, n = 2;
  for (const auto& a : rollout.call_all(load_preset("tiny", 2, generation(max_new, n, 2, {7, 19}))))
    EXPECT_EQ(a.reply.weight_version, 0);

  // The actor: a different initialisation (seed 1), sent as version 5.
  auto actor = std::make_shared<models::CausalLM>(models::preset_config("tiny"));
  actor->init_weights(1);
  const std::string store = config.run_dir + "/weight-sync.store";
  auto receiving = std::async(std::launch::async, [&] {
    return rollout.call_all(ops::SyncWeights{store, "gloo"});
  });
  auto group = actor_sync_group(store, rollout.size());
  rollout::ModelWeights source(*actor);
  rollout::SyncOptions sync;
  sync.wire_dtype = torch::kFloat32;
  const auto sent = rollout::send_weights(source, group.get(), 5, sync);
  for (const auto& a : receiving.get()) {
    EXPECT_EQ(a.reply.weight_version, 5);
    EXPECT_EQ(a.reply.bytes, sent.bytes);
  }

  // 5 prompts of mixed lengths, left-padded; micro batches of 2 prompts over 2 ranks.
  const int64_t B = 5, P = 6;
  auto ids = torch::randint(1, 250, {B, P}, torch::kInt64);
  auto mask = torch::ones({B, P}, torch::kInt64);
  for (int64_t b = 0; b < B; ++b) mask[b].narrow(0, 0, b).fill_(0);  // row b has P - b tokens
  ids.masked_fill_(mask == 0, 0);
  auto out = rollout.scatter(sampling(1.0, 11, n, 0.95),
                             {{"prompt_ids", ids},
                              {"prompt_mask", mask},
                              {"prompt_index", torch::arange(B, torch::kInt64)}},
                             2);
  ASSERT_EQ(out.tensor("sequences").sizes(), (std::vector<int64_t>{B * n, P + max_new}));
  for (const auto& mb : micro_batch_replies<ops::Generate>(out)) EXPECT_EQ(mb.weight_version, 5);

  rollout::GenerationConfig local_config;
  local_config.max_new_tokens = max_new;
  local_config.n_samples_per_prompt = n;
  local_config.micro_batch_size = 2;
  local_config.stop_token_ids = {7, 19};
  rollout::Generator local(actor, local_config);
  rollout::SamplingParams params;
  params.top_p = 0.95;
  params.seed = 11;
  auto expected = rollout::concat_outputs({local.generate(ids, mask, params)}, max_new, 0);
  EXPECT_TRUE(torch::equal(out.tensor("sequences"), expected.sequences));
  EXPECT_TRUE(torch::equal(out.tensor("action_mask"), expected.action_mask));
  EXPECT_TRUE(torch::equal(out.tensor("response_lengths"), expected.response_lengths));
  // Same weights, same shapes, one thread on both sides: the same FP32 arithmetic.
  EXPECT_LT((out.tensor("log_probs") - expected.log_probs).abs().max().item<double>(), 1e-6);
  scheduler.shutdown();
}

// Issue 40.1: every request travels whole. A load_model whose "generation" lacks a field, or
// carries one this build does not know, fails naming the operation and the field (before,
// the worker filled a default of its own: rollout.kv_block_size 0 where the spec's is 16);
// nothing is loaded. The same for a field of the request itself, and for a train request.
TEST(RolloutWorker, LoadModelWithoutAGenerationFieldFailsNamingIt) {
  torch::set_num_threads(1);
  SchedulerConfig config = testing::scheduler_config("rollout-fields");
  config.worker_timeout = 20000ms;  // heartbeats stay late on a loaded 2-core machine
  Scheduler scheduler(config, testing::local_placement({{Role::kRollout, 1}}));
  scheduler.start();
  auto& rollout = scheduler.group(Role::kRollout);
  // The request as the wire carries it, edited the way another build's would differ.
  const nlohmann::json whole = request_args(load_preset("tiny", 0, generation(8, 2, 4)));
  const auto refused = [&](const std::string& op, const nlohmann::json& args) -> std::string {
    try {
      rollout.call_all(op, args);
    } catch (const RuntimeError& e) {
      return e.what();
    }
    return "(served)";
  };
  nlohmann::json args = whole;
  args["generation"].erase("kv_block_size");
  EXPECT_NE(
      refused("load_model", args).find("load_model: generation: missing field \"kv_block_size\""),
      std::string::npos)
      << refused("load_model", args);
  args = whole;
  args["generation"]["kv_block_sizes"] = 16;
  EXPECT_NE(refused("load_model", args).find("unknown field \"kv_block_sizes\""), std::string::npos)
      << refused("load_model", args);
  args = whole;
  args.erase("generation");
  EXPECT_NE(refused("load_model", args).find("load_model: missing field \"generation\""),
            std::string::npos)
      << refused("load_model", args);
  args = whole;
  args["max_turn"] = 2;  // a misspelt field
  EXPECT_NE(refused("load_model", args).find("load_model: unknown field \"max_turn\""),
            std::string::npos)
      << refused("load_model", args);
  args = whole;
  args["seed"] = "two";
  EXPECT_NE(refused("load_model", args).find("load_model: field \"seed\" has the wrong type"),
            std::string::npos)
      << refused("load_model", args);
  // The worker is still there and takes a whole request.
  EXPECT_EQ(
      rollout.call_all(load_preset("tiny", 0, generation(8, 2, 4))).at(0).reply.weight_version, 0);
  // A generate that lacks its sampling seed is refused before anything is generated.
  nlohmann::json gen = request_args(sampling(1.0, 5, 2));
  gen["sampling"].erase("seed");
  EXPECT_NE(refused("generate", gen).find("generate: sampling: missing field \"seed\""),
            std::string::npos)
      << refused("generate", gen);
  scheduler.shutdown();
}

TEST(RolloutWorker, SleepOffloadsTheWeightsAndWakeUpRestoresThemBitExactly) {
  torch::set_num_threads(1);
  SchedulerConfig config = testing::scheduler_config("rollout-sleep");
  config.worker_timeout = 20000ms;  // heartbeats stay late on a loaded 2-core machine
  Scheduler scheduler(config, testing::local_placement({{Role::kRollout, 1}}));
  scheduler.start();
  auto& rollout = scheduler.group(Role::kRollout);
  rollout.call_all(load_preset("tiny", 3, generation(8, 2, 4)));
  const auto ids = torch::randint(1, 250, {3, 5}, torch::kInt64);
  const auto mask = torch::ones({3, 5}, torch::kInt64);
  auto generate = [&] {
    return rollout.scatter(sampling(1.0, 5, 2), {{"prompt_ids", ids}, {"prompt_mask", mask}}, 4);
  };
  const Message before = generate();

  // The tiny preset in FP32: its parameters (tied embeddings once) and its buffers.
  models::CausalLM reference(models::preset_config("tiny"));
  int64_t weight_bytes = 0;
  for (const auto& p : reference.parameters()) weight_bytes += p.numel() * 4;
  const ops::OffloadReply slept = rollout.call_all(ops::Sleep{}).at(0).reply;
  EXPECT_GE(slept.offloaded_bytes, weight_bytes);
  EXPECT_LT(slept.offloaded_bytes, weight_bytes * 11 / 10);
  EXPECT_EQ(slept.cuda_reserved_bytes, 0);  // a cpu worker
  try {
    generate();
    FAIL() << "generate on a sleeping rollout must fail";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("call wake_up first"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rollout.call_all(ops::Sleep{}).at(0).reply.offloaded_bytes, 0);  // asleep already
  const ops::RestoreReply woke = rollout.call_all(ops::WakeUp{}).at(0).reply;
  EXPECT_EQ(woke.restored_bytes, slept.offloaded_bytes);
  const Message after = generate();
  for (const char* name : {"sequences", "action_mask", "log_probs"})
    EXPECT_TRUE(torch::equal(before.tensor(name), after.tensor(name))) << name;
  scheduler.shutdown();
}

// Tensor parallelism: one engine of two `rlhf worker` processes (TP ranks 0 and 1 over a real
// Gloo group), each holding half the heads, half the MLP rows and half the vocabulary, fed
// identical requests at once. Greedy and seeded sampling must give the tokens of one whole
// model (log-probs within 1e-5: the row-parallel sums add in another order), with the paged
// engine preempting under a small KV budget; a sync from the actor sends each rank only its
// slices, and generation then follows the actor's weights.
TEST(RolloutWorker, TensorParallelTwoRanksGenerateWhatOneWholeModelDoes) {
  torch::set_num_threads(1);
  SchedulerConfig config = testing::scheduler_config("rollout-tp");
  config.worker_timeout = 20000ms;  // heartbeats stay late on a loaded 2-core machine
  Scheduler scheduler(config, testing::local_placement({{Role::kRollout, 2}}));
  scheduler.start();
  auto& rollout = scheduler.group(Role::kRollout);

  const int64_t max_new = 10, n = 2, block = 4;
  // Room for 3 sequences of 6 + 10 positions at TP 1 (6 at TP 2: the kv heads are halved),
  // against 4 prompts x 2 samples: both preempt.
  const auto whole_config = models::preset_config("small");
  const double kv_gb = 3.0 * 4 *
                       models::PagedKvCache::block_bytes(whole_config, block, torch::kFloat32) /
                       static_cast<double>(1ll << 30);
  ops::LoadModel load = load_preset(
      "small", 2, generation(max_new, n, 4, {7}, block, static_cast<int64_t>(kv_gb * (1ll << 30))));
  load.dtype = "fp32";
  load.tensor_parallel_size = 2;
  load.tp_store_path = config.run_dir + "/tp.store";
  for (const auto& a : rollout.call_all(load)) EXPECT_EQ(a.reply.tensor_parallel_size, 2);

  const int64_t B = 4, P = 6;
  auto ids = torch::randint(1, 250, {B, P}, torch::kInt64);
  auto mask = torch::ones({B, P}, torch::kInt64);
  for (int64_t b = 0; b < B; ++b) mask[b].narrow(0, 0, b).fill_(0);
  ids.masked_fill_(mask == 0, 0);
  // Both TP ranks get the same request at once; they must answer alike.
  auto generate = [&](const ops::Generate& sampled) {
    Message request;
    request.op = ops::Generate::kName;
    request.args = request_args(sampled);
    request.add("prompt_ids", ids);
    request.add("prompt_mask", mask);
    auto other = std::async(std::launch::async, [&] { return rollout.call(1, request); });
    Message first = rollout.call(0, request);
    Message second = other.get();
    EXPECT_TRUE(torch::equal(first.tensor("sequences"), second.tensor("sequences")));
    EXPECT_TRUE(torch::equal(first.tensor("log_probs"), second.tensor("log_probs")));
    return first;
  };
  auto local_generate = [&](std::shared_ptr<models::CausalLM> model, double temperature) {
    rollout::GenerationConfig c;
    c.max_new_tokens = max_new;
    c.n_samples_per_prompt = n;
    c.micro_batch_size = 4;
    c.stop_token_ids = {7};
    rollout::Generator local(std::move(model), c);
    rollout::SamplingParams params;
    params.temperature = temperature;
    params.seed = 11;
    return rollout::concat_outputs({local.generate(ids, mask, params)}, max_new, 0);
  };
  auto expect_same = [&](const Message& tp, const rollout::GenerationOutput& whole,
                         const std::string& what) {
    EXPECT_TRUE(torch::equal(tp.tensor("sequences"), whole.sequences)) << what;
    EXPECT_TRUE(torch::equal(tp.tensor("response_lengths"), whole.response_lengths)) << what;
    EXPECT_LT((tp.tensor("log_probs") - whole.log_probs).abs().max().item<double>(), 1e-5) << what;
  };

  auto preset = std::make_shared<models::CausalLM>(whole_config);
  preset->init_weights(2);
  const ops::Generate greedy = sampling(0.0, 11, n);
  const ops::Generate sampled = sampling(1.0, 11, n);
  const Message g = generate(greedy);
  EXPECT_GT(reply_of<ops::Generate>(g).preempted, 0);  // the small KV budget bit
  expect_same(g, local_generate(preset, 0.0), "greedy, preset weights");
  expect_same(generate(sampled), local_generate(preset, 1.0), "sampled, preset weights");

  // The actor (seed 1) syncs into the two shards: each rank receives its slices only.
  auto actor = std::make_shared<models::CausalLM>(whole_config);
  actor->init_weights(1);
  const std::string store = config.run_dir + "/weight-sync.store";
  auto receiving = std::async(std::launch::async, [&] {
    return rollout.call_all(ops::SyncWeights{store, "gloo"});
  });
  auto group = actor_sync_group(store, rollout.size());
  rollout::ModelWeights source(*actor);
  rollout::SyncOptions sync;
  sync.wire_dtype = torch::kFloat32;
  sync.tensor_parallel_size = 2;
  sync.bucket_bytes = 64 << 10;  // many buckets, tensors split across them
  const auto sent = rollout::send_weights(source, group.get(), 3, sync);
  int64_t whole_bytes = 0, replicated_bytes = 0;
  for (const auto& [name, shape] : actor->parameter_shapes()) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    whole_bytes += numel * 4;
    if (models::tensor_parallel_dim(name) < 0) replicated_bytes += numel * 4;
  }
  EXPECT_EQ(sent.bytes, whole_bytes + replicated_bytes);  // the two ranks' slices
  for (const auto& a : receiving.get()) {
    EXPECT_EQ(a.reply.weight_version, 3);
    // Half of every split tensor plus the norms: what this rank holds, nothing more.
    EXPECT_EQ(a.reply.bytes, (whole_bytes + replicated_bytes) / 2);
  }
  expect_same(generate(greedy), local_generate(actor, 0.0), "greedy, synced weights");
  expect_same(generate(sampled), local_generate(actor, 1.0), "sampled, synced weights");

  // The rollout ranks' side of a sync that must fail: their error message.
  auto receive_error = [&] {
    return std::async(std::launch::async, [&] {
      try {
        rollout.call_all(ops::SyncWeights{store, "gloo"});
        return std::string("no error");
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
    });
  };
  // A sender that does not know about the split is refused on both sides, naming it.
  auto refused = receive_error();
  sync.tensor_parallel_size = 1;
  try {
    rollout::send_weights(source, group.get(), 4, sync);
    ADD_FAILURE() << "an unsplit sync into TP shards must fail";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("layout"), std::string::npos) << e.what();
  }
  const std::string error = refused.get();
  EXPECT_NE(error.find("tensor-parallel slices for 1 ranks"), std::string::npos) << error;

  // An actor whose vocabulary two ranks cannot split: refused after the header, so the
  // receivers fail at once instead of waiting for buckets.
  auto odd_config = whole_config;
  odd_config.vocab_size = 289;
  models::CausalLM odd(odd_config);
  rollout::ModelWeights odd_source(odd);
  auto refused_odd = receive_error();
  sync.tensor_parallel_size = 2;
  try {
    rollout::send_weights(odd_source, group.get(), 5, sync);
    ADD_FAILURE() << "a sync of a model TP cannot split must fail";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary it divides"), std::string::npos) << e.what();
  }
  const std::string odd_error = refused_odd.get();
  EXPECT_NE(odd_error.find("refused the sync"), std::string::npos) << odd_error;
  scheduler.shutdown();
}

// Issue 42.3: a weight sync that reaches a rollout worker while it generates (in-flight
// updates on) is applied between two decode steps: the sync answers before the generate
// call ends, every row's tokens from one position on carry the new version, and the output
// is exactly that of a local engine whose weights are replaced between the same two decode
// steps with its KV cache kept (tokens equal, log-probs within 1e-6: same FP32 arithmetic).
TEST(RolloutWorker, InFlightUpdateChangesTheWeightsBetweenTwoDecodeSteps) {
  RolloutWorkers workers("rollout-in-flight", 1);
  Scheduler& scheduler = *workers.scheduler;
  const SchedulerConfig& config = workers.config;
  auto& rollout = workers.group();
  const int64_t max_new = 200, B = 4, P = 6;  // no stop token: every row runs max_new steps
  rollout.call_all(load_preset("tiny", 2, generation(max_new, 1, B)));

  auto ids = torch::randint(1, 250, {B, P}, torch::kInt64);
  auto mask = torch::ones({B, P}, torch::kInt64);
  Message request;
  request.op = ops::Generate::kName;
  ops::Generate generate = sampling(1.0, 11, 1);
  generate.in_flight_updates = true;
  request.args = request_args(generate);
  request.add("prompt_ids", ids);
  request.add("prompt_mask", mask);
  // Submitted before the sync, so it reaches the worker first and the sync comes in flight.
  const uint64_t id = scheduler.submit(0, request);
  auto actor = std::make_shared<models::CausalLM>(models::preset_config("tiny"));
  actor->init_weights(1);
  const std::string store = config.run_dir + "/weight-sync.store";
  auto receiving = std::async(std::launch::async, [&] {
    return rollout.call_all(ops::SyncWeights{store, "gloo"});
  });
  auto group = actor_sync_group(store, rollout.size());
  rollout::ModelWeights source(*actor);
  rollout::SyncOptions sync;
  sync.wire_dtype = torch::kFloat32;
  rollout::send_weights(source, group.get(), 7, sync);
  EXPECT_EQ(receiving.get().at(0).reply.weight_version, 7);
  const Message reply = scheduler.await_any({id}, std::chrono::steady_clock::now() + 120s).second;
  ASSERT_TRUE(reply.error.empty()) << reply.error;
  EXPECT_EQ(reply_of<ops::Generate>(reply).weight_version, 7);

  // One switch position for every row (they decode in lockstep), strictly inside.
  const auto versions = reply.tensor("weight_versions");
  ASSERT_EQ(versions.sizes(), (std::vector<int64_t>{B, max_new}));
  const int64_t at = (versions[0] == 0).sum().item<int64_t>();
  ASSERT_GT(at, 1) << "the first decode step ran with the loaded weights";
  ASSERT_LT(at, max_new) << "the sync came after the last decode step";
  auto expected_versions = torch::full({B, max_new}, 7, torch::kInt64);
  expected_versions.narrow(1, 0, at).fill_(0);
  EXPECT_TRUE(torch::equal(versions, expected_versions));

  // Locally: the loaded weights, replaced in place after decode step at - 1.
  auto local_model = std::make_shared<models::CausalLM>(models::preset_config("tiny"));
  local_model->init_weights(2);
  rollout::GenerationConfig local_config = generation(max_new, 1, B);
  rollout::Generator local(local_model, local_config);
  int64_t steps = 0, version = 0;
  local.set_between_steps([&] {
    if (++steps == at - 1) {
      torch::NoGradGuard no_grad;
      auto to = local_model->state_tensors();
      auto from = actor->state_tensors();
      for (size_t i = 0; i < to.size(); ++i) to[i].second.copy_(from[i].second);
      version = 7;
    }
    return version;
  });
  rollout::SamplingParams params;
  params.seed = 11;
  const auto expected = rollout::concat_outputs({local.generate(ids, mask, params)}, max_new, 0);
  EXPECT_TRUE(torch::equal(expected.token_versions, versions));
  EXPECT_TRUE(torch::equal(reply.tensor("sequences"), expected.sequences));
  EXPECT_LT((reply.tensor("log_probs") - expected.log_probs).abs().max().item<double>(), 1e-6);
}

// Issue 42.1: a streaming generate sends each prompt's group back as soon as its last
// sample ends, before its reply: each part holds the groups that ended at one decode step
// (all of a part's groups share their longest response, parts in increasing order), every
// prompt comes once, the reply carries no rows, and the rows put back in prompt order are
// exactly the unstreamed call's (same seed).
TEST(RolloutWorker, StreamedGroupsArriveAsTheyEndAndMakeTheSameRows) {
  RolloutWorkers workers("rollout-stream", 1);
  auto& rollout = workers.group();
  const int64_t max_new = 24, n = 2, B = 8, P = 6;
  rollout.call_all(load_preset("tiny", 2, generation(max_new, n, B, {7, 19, 23, 31})));
  auto ids = torch::randint(1, 250, {B, P}, torch::kInt64);
  auto mask = torch::ones({B, P}, torch::kInt64);
  const std::vector<NamedTensor> batch = {{"prompt_ids", ids},
                                          {"prompt_mask", mask},
                                          {"prompt_index", torch::arange(B, torch::kInt64)}};
  const Message whole = rollout.scatter(sampling(1.0, 5, n), batch, B);
  ops::Generate streamed = sampling(1.0, 5, n);
  streamed.stream_groups = true;
  std::vector<Message> parts;
  const Message reply = rollout.scatter(streamed, batch, B, Dispatch::kLeastLoaded, std::nullopt,
                                        [&](int64_t micro_batch, Message part) {
                                          EXPECT_EQ(micro_batch, 0);
                                          parts.push_back(std::move(part));
                                        });
  EXPECT_TRUE(reply.tensors.empty()) << "the rows went ahead as parts";
  const auto lengths = whole.tensor("response_lengths").view({B, n}).amax(1);  // per group
  std::set<int64_t> ends;
  for (int64_t b = 0; b < B; ++b) ends.insert(lengths[b].item<int64_t>());
  ASSERT_EQ(parts.size(), ends.size()) << "one part per decode step that ended groups";
  std::vector<int> seen(B, 0);
  int64_t last_end = 0;
  for (const Message& part : parts) {
    const auto prompts = part.tensor("prompt_index");
    const int64_t end = lengths[prompts[0].item<int64_t>()].item<int64_t>();
    EXPECT_GT(end, last_end);
    last_end = end;
    for (int64_t i = 0; i < prompts.size(0); ++i) {
      const int64_t p = prompts[i].item<int64_t>();
      ++seen[p];
      EXPECT_EQ(lengths[p].item<int64_t>(), end) << "prompt " << p;
      for (const char* name : {"sequences", "action_mask", "log_probs", "weight_versions"})
        EXPECT_TRUE(torch::equal(part.tensor(name).narrow(0, i * n, n),
                                 whole.tensor(name).narrow(0, p * n, n)))
            << name << " of prompt " << p;
    }
  }
  for (int64_t p = 0; p < B; ++p) EXPECT_EQ(seen[p], 1) << "prompt " << p;
}

}  // namespace
}  // namespace rlhf
