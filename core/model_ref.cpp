#include "core/model_ref.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/errors.h"

namespace rlhf {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string home_path(const std::string& rest) {
  const std::string home = env("HOME");
  return (fs::path(home.empty() ? "/" : home) / rest).string();
}

// A model (config.json) or a PEFT adapter (adapter_config.json), which --adapter takes.
bool is_model_dir(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) &&
         (fs::exists(dir / "config.json", ec) || fs::exists(dir / "adapter_config.json", ec));
}

// ORG/NAME with letters, digits, '-', '_' and '.' in each part (the Hub's repo ids).
bool is_hub_id(const std::string& id) {
  const auto slash = id.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == id.size() ||
      id.find('/', slash + 1) != std::string::npos)
    return false;
  for (char c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' &&
        c != '/')
      return false;
  return id.front() != '.' && id.substr(slash + 1).front() != '.';
}

std::string read_first_line(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

// ORG/NAME[@REVISION] in the Hub cache: REVISION is a snapshot's hash or a ref (branch or tag:
// refs/REVISION holds the hash); without one, refs/main, else the only snapshot there is.
std::optional<ModelSource> from_hub_cache(const std::string& ref,
                                          std::vector<std::string>* looked) {
  const auto at = ref.find('@');
  const std::string id = ref.substr(0, at);
  const std::string asked = at == std::string::npos ? "" : ref.substr(at + 1);
  if (!is_hub_id(id)) return std::nullopt;
  const fs::path repo = fs::path(hub_cache()) / ("models--" + id.substr(0, id.find('/')) + "--" +
                                                 id.substr(id.find('/') + 1));
  auto note = [&](const std::string& line) {
    if (looked) looked->push_back(line);
  };
  std::error_code ec;
  if (!fs::is_directory(repo, ec)) {
    note(repo.string() + " (the Hub cache): not there");
    return std::nullopt;
  }
  std::string revision = asked.empty() ? "main" : asked;
  if (fs::exists(repo / "refs" / revision, ec))
    revision = read_first_line(repo / "refs" / revision);
  std::vector<std::string> snapshots;
  for (const auto& e : fs::directory_iterator(repo / "snapshots", ec))
    if (e.is_directory()) snapshots.push_back(e.path().filename().string());
  std::sort(snapshots.begin(), snapshots.end());
  if (asked.empty() && !fs::exists(repo / "refs" / "main", ec) && snapshots.size() == 1)
    revision = snapshots.front();  // no refs/main: the one snapshot there is
  const fs::path dir = repo / "snapshots" / revision;
  if (!is_model_dir(dir)) {
    std::string have;
    for (const auto& s : snapshots) have += (have.empty() ? "" : ", ") + s;
    note(dir.string() + " (the Hub cache, revision " + (asked.empty() ? "main" : asked) +
         "): " + (fs::is_directory(dir, ec) ? "no config.json" : "not there") +
         " (snapshots: " + (have.empty() ? "none" : have) + ")");
    return std::nullopt;
  }
  return ModelSource{ref, dir.string(), "Hub cache", revision};
}

}  // namespace

std::string ModelSource::describe(const std::string& key) const {
  std::string out = key + ": " + ref;
  if (path != ref) out += " -> " + path;
  out += " (" + found_in;
  if (!revision.empty()) out += ", revision " + revision;
  return out + ")";
}

const std::vector<KnownModel>& known_models() {
  static const std::vector<KnownModel> models = {
      {"smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"}};
  return models;
}

std::string rlhf_model_cache() {  // as scripts/convert_gguf_model.py finds it
  if (const std::string set = env("RLHF_MODEL_CACHE"); !set.empty()) return set;
  if (const std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty())
    return (fs::path(xdg) / "rlhf" / "models").string();
  return home_path(".cache/rlhf/models");
}

std::string hub_cache() {
  if (const std::string set = env("HF_HUB_CACHE"); !set.empty()) return set;
  if (const std::string home = env("HF_HOME"); !home.empty())
    return (fs::path(home) / "hub").string();
  return home_path(".cache/huggingface/hub");
}

std::optional<ModelSource> resolve_model_ref(const std::string& ref,
                                             std::vector<std::string>* looked) {
  if (ref.empty()) return std::nullopt;
  auto note = [&](const std::string& line) {
    if (looked) looked->push_back(line);
  };
  std::error_code ec;
  if (fs::is_directory(ref, ec)) return ModelSource{ref, ref, "directory", ""};
  note(fs::absolute(ref, ec).lexically_normal().string() + " (a directory): not there");
  if (ref.rfind("preset:", 0) == 0) return ModelSource{ref, ref, "preset", ""};
  for (const auto& known : known_models()) {
    if (ref != known.name) continue;
    const fs::path dir = fs::path(rlhf_model_cache()) / ref;
    if (is_model_dir(dir)) return ModelSource{ref, dir.string(), "rlhf model cache", ""};
    note(dir.string() + " (rlhf's model cache): not made yet: scripts/get-model " + ref +
         " makes it");
    return std::nullopt;
  }
  return from_hub_cache(ref, looked);
}

bool is_model_name(const std::string& ref) {
  for (const auto& known : known_models())
    if (ref == known.name) return true;
  return is_hub_id(ref.substr(0, ref.find('@')));
}

ModelSource require_model_ref(const std::string& ref, const std::string& what) {
  std::vector<std::string> looked;
  if (auto found = resolve_model_ref(ref, &looked)) return *found;
  std::string places;
  for (const auto& l : looked) places += (places.empty() ? "" : "; ") + l;
  throw InputError(what + ": model \"" + ref + "\" not found (looked in: " + places + ")");
}

}  // namespace rlhf
