// load_tokenizer(): which implementation a model directory's files call for.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/errors.h"
#include "tokenizer/byte_tokenizer.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace rlhf::tokenizer {

namespace fs = std::filesystem;

namespace {

// vocab_size from config.json (the embedding rows), or 259 when there is none.
int64_t byte_vocab_size(const fs::path& dir) {
  std::ifstream in(dir / "config.json");
  if (!in) return 259;
  try {
    const auto config = nlohmann::json::parse(in);
    return config.value("vocab_size", int64_t{259});
  } catch (const nlohmann::json::exception& e) {
    throw InputError((dir / "config.json").string() + ": not valid JSON: " + e.what());
  }
}

}  // namespace

std::vector<std::vector<TokenId>> encode_batch(const Tokenizer& tokenizer,
                                               const std::vector<std::string>& texts,
                                               AddSpecial add_special, unsigned threads) {
  std::vector<std::vector<TokenId>> out(texts.size());
  const auto encode_slice = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) out[i] = tokenizer.encode(texts[i], add_special);
  };
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(texts.size())));
  if (threads <= 1) {
    encode_slice(0, texts.size());
    return out;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> workers;
  for (unsigned w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      try {
        encode_slice(texts.size() * w / threads, texts.size() * (w + 1) / threads);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto& t : workers) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

namespace {

std::string id_text(std::optional<TokenId> id) {
  return id ? std::to_string(*id) : std::string("none");
}

// One id's text, or the error decoding it alone raises (both tokenizers should agree on that).
std::string token_text(const Tokenizer& t, TokenId id) {
  try {
    return t.decode({id}, SkipSpecial::kNo);
  } catch (const InputError& e) {
    return std::string("error: ") + e.what();
  }
}

}  // namespace

std::string tokenizer_difference(const Tokenizer& a, const Tokenizer& b) {
  if (a.vocab_size() != b.vocab_size())
    return "vocabularies of " + std::to_string(a.vocab_size()) + " and " +
           std::to_string(b.vocab_size()) + " tokens";
  if (a.kind() != b.kind()) return "a " + a.kind() + " and a " + b.kind() + " tokenizer";
  const SpecialIds &sa = a.special_ids(), &sb = b.special_ids();
  const std::pair<const char*, std::pair<std::optional<TokenId>, std::optional<TokenId>>>
      specials[] = {
          {"BOS", {sa.bos, sb.bos}}, {"EOS", {sa.eos, sb.eos}}, {"PAD", {sa.pad, sb.pad}}};
  for (const auto& [name, ids] : specials)
    if (ids.first != ids.second)
      return std::string(name) + " ids " + id_text(ids.first) + " and " + id_text(ids.second);
  for (TokenId id = 0; id < static_cast<TokenId>(a.vocab_size()); ++id) {
    const std::string ta = token_text(a, id), tb = token_text(b, id);
    if (ta != tb) return "token " + std::to_string(id) + " is \"" + ta + "\" and \"" + tb + "\"";
  }
  return "";
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
  const fs::path dir(model_dir);
  if (!fs::is_directory(dir))
    throw InputError(model_dir + ": not a directory (expected a model directory)");
  const TokenizerConfig config = read_tokenizer_config(model_dir);
  if (config.tokenizer_class == "RlhfByteTokenizer") {
    return std::make_unique<ByteTokenizer>(config.add_bos_token.value_or(true),
                                           byte_vocab_size(dir));
  }
  if (fs::exists(dir / "tokenizer.json")) {
    return std::make_unique<HfTokenizer>((dir / "tokenizer.json").string(), config);
  }
  if (fs::exists(dir / "tokenizer.model")) {
    return std::make_unique<SentencePieceTokenizer>((dir / "tokenizer.model").string(), config);
  }
  throw InputError(model_dir +
                   ": no tokenizer found (expected tokenizer.json, tokenizer.model, or "
                   "tokenizer_config.json with \"tokenizer_class\": \"RlhfByteTokenizer\")");
}

}  // namespace rlhf::tokenizer
