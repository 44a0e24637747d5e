"""Hugging Face transformers as the reference for rlhf on a real pretrained model
(SmolLM2-135M-Instruct from scripts/get-model), run by tests/cli/real_model_test.cpp.

`--model DIR --out DIR` writes, for a few chat conversations:
  chats.jsonl      one message list per line (the test feeds these to rlhf)
  reference.json   {"chat_ids": [...]}    apply_chat_template(add_generation_prompt=True) ids
                   {"greedy": [...]}      HF generate(do_sample=False) new tokens, EOS dropped
                   {"log_probs": [...]}   FP32 log p(x[t+1] | x[..t]) of chat_ids + greedy
The model runs in FP32, eval mode, eager attention: the plainest reference.
"""

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

CHATS = [
    [{"role": "user", "content": "What is 17 + 25?"}],
    [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}],
    [{"role": "system", "content": "You are a careful math tutor."},
     {"role": "user", "content": "Compute 6 times 7. Answer with a number."}],
    [{"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello! How can I help you today?"},
     {"role": "user", "content": "Name a prime number greater than 10, with accents: café, naïve."}],
]
NEW_TOKENS = 24


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    os.makedirs(a.out, exist_ok=True)
    ref = {"chat_ids": [], "greedy": [], "log_probs": []}
    eos = model.config.eos_token_id
    with open(os.path.join(a.out, "chats.jsonl"), "w") as f:
        for chat in CHATS:
            f.write(json.dumps(chat) + "\n")
            ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            ids = list(ids)
            ref["chat_ids"].append(ids)
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos,
                                     pad_token_id=eos)
            new = out[0, len(ids):].tolist()
            if eos in new:
                new = new[:new.index(eos)]
            ref["greedy"].append(new)
            seq = torch.tensor([ids + new])
            with torch.no_grad():
                logits = model(seq).logits.float()
            lp = torch.log_softmax(logits[0, :-1], -1).gather(1, seq[0, 1:, None])[:, 0]
            ref["log_probs"].append(lp.tolist())
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump(ref, f)


if __name__ == "__main__":
    main()
