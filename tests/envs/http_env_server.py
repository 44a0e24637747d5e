"""A test HTTP environment for tests/envs/http_env_test.cpp, speaking docs/agentic.md's
protocol. Prints its port on the first line of stdout. Step actions: "slow" answers after
0.5 s, "hang" after 30 s, "bad" with HTTP 500; anything else at once. A row with "secret"
gets the initial observation "The secret is <secret>.", a turn containing it reward 1; a row
labelled "tools" is answered with its step's tool_calls as JSON. With env.options
{"calculator": true} it is a calculator: each parsed call "A*B" is answered with the product
(a tool turn), a turn without a call ends the trajectory."""
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

rows = {}
lock = threading.Lock()

def calculate(calls):
    if not calls:
        return {"observation": None, "done": True}
    lines, errors = [], 0
    for call in calls:
        try:
            a, b = call["arguments"]["expression"].split("*")
            lines.append(str(int(a) * int(b)))
        except (KeyError, ValueError) as e:
            lines.append(call.get("error") or f"error: {e}")
            errors += 1
    return {"observation": "\n".join(lines), "role": "tool", "done": False,
            "tool_calls": len(calls), "tool_errors": errors}

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = body["id"]
        if self.path == "/env/reset":
            if body["row"].get("label") == "hang_reset":
                time.sleep(30)
            secret = body["row"].get("secret")
            observation = None if secret is None else f"The secret is {secret}."
            with lock:
                rows[key] = {"label": body["row"].get("label"), "turns": 0,
                             "options": body.get("options"), "observation": observation}
            return self.reply(200, {"observation": observation})
        if self.path == "/env/close":
            with lock:
                rows.pop(key, None)
            return self.reply(200, {})
        if self.path != "/env/step":
            return self.reply(404, {"error": "no such path " + self.path})
        action = body["action"]
        if action == "slow":
            time.sleep(0.5)
        elif action == "hang":
            time.sleep(30)
        elif action == "bad":
            return self.reply(500, {"error": "bad action"})
        with lock:
            state = rows[key]
            state["turns"] += 1
        if (state["options"] or {}).get("calculator"):
            return self.reply(200, calculate(body["tool_calls"]))
        if state["observation"] is not None:
            return self.reply(200, {"observation": "ok", "done": True,
                                    "reward": 1.0 if state["observation"] in action else 0.0})
        text = f"{state['label']} {action} {state['turns']}"
        if state["label"] == "tools":
            text = json.dumps(body["tool_calls"])
        self.reply(200, {"observation": text, "role": "user", "reward": 0.5,
                         "done": action == "stop", "tool_calls": 1, "tool_errors": 0})

class Server(ThreadingHTTPServer):
    request_queue_size = 256  # listen() backlog: rlhf opens up to 64 connections at once

server = Server(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
