"""An OpenAI-compatible chat-completions endpoint over a Hugging Face model, for measuring a
generative judge (rlhf's {"judge": {"url": ...}} reward source) without vLLM or SGLang.

    "$(scripts/python-env)" bench/judge_server.py --model DIR [--port 8011]
    -> POST http://127.0.0.1:8011/v1/chat/completions
       {"messages": [...], "n": N, "temperature": T, "max_tokens": M}

Each request's messages go through the model's chat template (the assistant's turn opened) and
are generated with transformers (greedy at temperature 0, sampled otherwise, n sequences);
the reply is {"choices": [{"index", "message": {"role", "content"}, "finish_reason"}]}. One
request at a time (a lock around the model), FP32 on the CPU. A benchmark's reference tool,
never a dependency of rlhf.
"""

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="HF model directory")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    lock = threading.Lock()

    def complete(body):
        ids = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)
        n = int(body.get("n", 1))
        temperature = float(body.get("temperature", 0.0))
        sample = temperature > 0
        with lock, torch.no_grad():
            out = model.generate(**ids, max_new_tokens=int(body.get("max_tokens", 64)),
                                 do_sample=sample, temperature=temperature if sample else None,
                                 top_p=None, top_k=None, num_return_sequences=n,
                                 pad_token_id=tokenizer.eos_token_id)
        prompt_len = ids["input_ids"].shape[1]
        choices = []
        for i, seq in enumerate(out):
            text = tokenizer.decode(seq[prompt_len:], skip_special_tokens=True)
            choices.append({"index": i, "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop"})
        return {"object": "chat.completion", "choices": choices}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            try:
                reply, status = complete(body), 200
            except Exception as e:  # the client sees the reason, as a server would say it
                reply, status = {"error": str(e)}, 500
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"judge_server: {args.model} on http://127.0.0.1:{args.port}/v1/chat/completions",
          flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
