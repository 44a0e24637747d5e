// A model reference, as a job spec's `*.model` keys and the CLI's --model / --adapter take
// it, resolved to a directory. In this order:
//   1. an existing directory (as given);
//   2. "preset:NAME", an architecture without weights (kept as it is: models/ reads it);
//   3. a name scripts/get-model makes (smollm2-135m-instruct), in rlhf's own model cache
//      ($RLHF_MODEL_CACHE, else ~/.cache/rlhf/models); made there only by that script;
//   4. ORG/NAME[@REVISION] in the Hugging Face Hub cache ($HF_HUB_CACHE, else $HF_HOME/hub,
//      else ~/.cache/huggingface/hub: models--ORG--NAME/snapshots/REVISION, refs/main naming
//      the default revision), offline: nothing is ever downloaded.
// Core knows only the file system here; what is inside the directory is models/'s business.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace rlhf {

struct ModelSource {
  std::string ref;       // as written: "HuggingFaceTB/SmolLM2-135M-Instruct@main"
  std::string path;      // the directory it resolved to ("preset:NAME" for a preset)
  std::string found_in;  // "directory", "preset", "rlhf model cache", "Hub cache"
  std::string revision;  // the Hub snapshot's hash ("" elsewhere)
  // "actor.model: REF -> PATH (Hub cache, revision R)": a run's first lines say this.
  std::string describe(const std::string& key) const;
};

// The models scripts/get-model makes: its name and the Hub name of the model it converts
// (scripts/convert_gguf_model.py's MODELS; a test keeps the two lists equal).
struct KnownModel {
  const char* name;
  const char* hub_id;
};
const std::vector<KnownModel>& known_models();

// $RLHF_MODEL_CACHE, else $XDG_CACHE_HOME/rlhf/models, else ~/.cache/rlhf/models.
std::string rlhf_model_cache();
std::string hub_cache();  // $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub

// The directory `ref` names, or nullopt when it resolves nowhere; `looked` (when given) gets
// one line per place tried, for the error. An empty ref resolves nowhere and looks nowhere.
std::optional<ModelSource> resolve_model_ref(const std::string& ref,
                                             std::vector<std::string>* looked = nullptr);

// True when `ref` is written as a name rather than a path: a name scripts/get-model makes or
// ORG/NAME[@REVISION] (one '/', no leading '.').
bool is_model_name(const std::string& ref);

// resolve_model_ref or an InputError naming `what` (a key or a flag), the reference and every
// place looked in.
ModelSource require_model_ref(const std::string& ref, const std::string& what);

}  // namespace rlhf
