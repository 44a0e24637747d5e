// Encode throughput (MB of UTF-8 text per second) of each real tokenizer on a few MB of mixed
// text (English-like prose, code, accents, CJK, emoji): single-threaded, and batch-parallel
// over std::thread workers (documents split across them). The limit for the parallel figure
// is workers x single; the ratio parallel/single is printed against it. Also the time to
// encode one long word at two lengths: ~10x for 10x the length means no O(n^2) merge loop.
// usage: bench_tokenizer [MB=4] [THREADS=2] [ONLY]  (repo root, after setup; ONLY: one name)
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/timing.h"
#include "tokenizer/tokenizer.h"

namespace {

using rlhf::seconds_since;

namespace tk = rlhf::tokenizer;
using Clock = std::chrono::steady_clock;

// CPU seconds used by all threads of this process: on a machine shared with other jobs the
// wall-clock ratio is capped by the cores we actually got; MB per CPU-second is not.
double process_cpu_seconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) {
    std::perror("clock_gettime");
    std::exit(1);
  }
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Documents of 1-4 KB; a fixed seed so every run encodes the same text.
std::vector<std::string> make_corpus(size_t total_bytes) {
  std::mt19937 rng(1234);
  const std::vector<std::string> syllables = {"ka",  "lo", "ren",  "st", "the", "in",
                                              "ver", "mo", "tion", "al", "pre", "com",
                                              "ing", "ed", "qu",   "ab", "ly",  "ou"};
  const std::vector<std::string> extras = {"Café déjà vu, naïve façade. ",
                                           "中文分词测试：你好，世界！",
                                           "日本語のテキストです。",
                                           "Emoji 😀🎉👍🏽 and ❤️. ",
                                           "def f(x):\n    return [i ** 2 for i in range(x)]\n",
                                           "int main() {\n\treturn 0;\n}\n",
                                           "  spaces   and\ttabs\n\n",
                                           "Numbers 3.14159 1,000,000. "};
  std::vector<std::string> docs;
  size_t bytes = 0;
  while (bytes < total_bytes) {
    std::string doc;
    const size_t target = 1024 + rng() % 3072;
    while (doc.size() < target) {
      if (rng() % 8 == 0) {
        doc += extras[rng() % extras.size()];
        continue;
      }
      std::string word;
      for (unsigned k = 1 + rng() % 4; k > 0; --k) word += syllables[rng() % syllables.size()];
      if (rng() % 10 == 0) word[0] = static_cast<char>(word[0] - 32);
      doc += word + (rng() % 12 == 0 ? ". " : " ");
    }
    bytes += doc.size();
    docs.push_back(std::move(doc));
  }
  return docs;
}

// Encodes docs[begin, end) and returns the number of tokens.
size_t encode_range(const tk::Tokenizer& tok, const std::vector<std::string>& docs, size_t begin,
                    size_t end) {
  size_t tokens = 0;
  for (size_t i = begin; i < end; ++i) tokens += tok.encode(docs[i], tk::AddSpecial::kNo).size();
  return tokens;
}

double parallel_seconds(const tk::Tokenizer& tok, const std::vector<std::string>& docs,
                        unsigned threads) {
  const auto t0 = Clock::now();
  tk::encode_batch(tok, docs, tk::AddSpecial::kNo, threads);
  return seconds_since(t0);
}

void bench(const std::string& name, const std::string& dir, const std::vector<std::string>& docs,
           double megabytes, unsigned threads, const std::string& only) {
  if (!only.empty() && only != name) return;
  if (!std::filesystem::exists(dir)) {
    std::printf("%-14s missing %s (run scripts/make-test-tokenizers)\n", name.c_str(), dir.c_str());
    return;
  }
  auto t0 = Clock::now();
  const auto tok = tk::load_tokenizer(dir);
  const double load_s = seconds_since(t0);
  t0 = Clock::now();
  const size_t tokens = encode_range(*tok, docs, 0, docs.size());  // cold word cache
  const double cold_s = seconds_since(t0);
  t0 = Clock::now();
  double cpu0 = process_cpu_seconds();
  encode_range(*tok, docs, 0, docs.size());
  const double single_s = seconds_since(t0), single_cpu = process_cpu_seconds() - cpu0;
  cpu0 = process_cpu_seconds();
  const double parallel_s = parallel_seconds(*tok, docs, threads);
  const double parallel_cpu = process_cpu_seconds() - cpu0;
  std::printf(
      "%-14s load %5.2f s  %8zu tokens  cold %6.2f MB/s  single %6.2f MB/s  parallel(%u) %6.2f MB/s"
      "  ratio %.2f (limit %u)\n",
      name.c_str(), load_s, tokens, megabytes / cold_s, megabytes / single_s, threads,
      megabytes / parallel_s, single_s / parallel_s, threads);
  std::printf(
      "%-14s per CPU-second: single %6.2f MB, parallel %6.2f MB (equal = no contention inside);"
      " cores obtained %.2f of %u\n",
      name.c_str(), megabytes / single_cpu, megabytes / parallel_cpu, parallel_cpu / parallel_s,
      threads);
  // One long word: 10x the length should take ~10x the CPU time (n log n), not 100x.
  // Best of 3 runs, in CPU seconds, so other jobs on the machine do not inflate it.
  std::string word;
  for (int i = 0; i < 100000; ++i) word += "abcdefghij"[(i * 7) % 10];
  const auto best_cpu = [&](size_t length) {
    double best = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      const double c0 = process_cpu_seconds();
      tok->encode(std::string_view(word).substr(0, length), tk::AddSpecial::kNo);
      best = std::min(best, process_cpu_seconds() - c0);
    }
    return best;
  };
  const double t10 = best_cpu(10000), t100 = best_cpu(100000);
  std::printf(
      "%-14s long word: 10k chars %.4f s, 100k chars %.4f s, ratio %.1f (linear 10, quadratic "
      "100)\n",
      name.c_str(), t10, t100, t100 / t10);
}

}  // namespace

int main(int argc, char** argv) {
  const double megabytes = argc > 1 ? std::atof(argv[1]) : 4.0;
  const unsigned threads = argc > 2 ? static_cast<unsigned>(std::atoi(argv[2])) : 2;
  const std::string only = argc > 3 ? argv[3] : "";
  const auto docs = make_corpus(static_cast<size_t>(megabytes * 1e6));
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  std::printf("corpus: %zu documents, %.2f MB; %u worker threads; hardware threads: %u\n",
              docs.size(), bytes / 1e6, threads, std::thread::hardware_concurrency());
  bench("llama3", ".cache/tokenizers/llama3", docs, bytes / 1e6, threads, only);
  bench("qwen2", ".cache/tokenizers/qwen2", docs, bytes / 1e6, threads, only);
  bench("mistral", ".cache/tokenizers/mistral", docs, bytes / 1e6, threads, only);
  bench("sentencepiece", "tests/fixtures/tokenizer/tiny_sp", docs, bytes / 1e6, threads, only);
  bench("sp_unigram", "tests/fixtures/tokenizer/tiny_sp_unigram", docs, bytes / 1e6, threads, only);
  return 0;
}
