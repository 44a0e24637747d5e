#!/usr/bin/env bash
# How well a generative judge agrees with the math verifier (issue 44.3): SmolLM2-135M-Instruct,
# served by bench/judge_server.py (transformers, FP32 CPU), judges 200 held-out arithmetic
# answers through rlhf's judge reward source (`rlhf reward --verbose`), with and without the
# reference answer in its template; the verifier's verdict is the truth.
#
#   [JUDGE=local] bench/judge_agreement.sh ANSWERER_MODEL [OUT_DIR]
#
# ANSWERER_MODEL writes the answers (greedy, SmolLM2's chat template), e.g. the arithmetic GRPO
# example's export (runs/grpo_smollm2_arith/export/actor), so that right and wrong answers both
# occur. Prints, per template, the agreement, the confusion counts, Cohen's kappa and the
# unparsed verdicts.
set -euo pipefail
cd "$(dirname "$0")/.."
answerer=${1:?usage: bench/judge_agreement.sh ANSWERER_MODEL [OUT_DIR]}
out=${2:-runs/judge_agreement}
mkdir -p "$out"
out=$(realpath "$out")
py=$(scripts/python-env)
judge=$(scripts/get-model smollm2-135m-instruct)
rlhf=build/cli/rlhf
port=${JUDGE_PORT:-8011}

"$rlhf" dataset synthetic:arith_test --count 200 > "$out/problems.jsonl"
# The answers of an earlier run of this script are kept (delete answers.jsonl to redo them).
[ -s "$out/answers.jsonl" ] ||
  "$rlhf" generate --model "$answerer" --input "$out/problems.jsonl" --apply-chat-template \
    --temperature 0 --max-new-tokens 48 --output "$out/answers.jsonl"
# Rows for `rlhf reward`: the problem as written, the answer, the label.
"$py" - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
problems = [json.loads(l) for l in open(f"{out}/problems.jsonl")]
answers = [json.loads(l) for l in open(f"{out}/answers.jsonl")]
assert len(problems) == len(answers) == 200, (len(problems), len(answers))
with open(f"{out}/rows.jsonl", "w") as f:
    for p, a in zip(problems, answers):
        f.write(json.dumps({"prompt": p["prompt"], "response": a["response"],
                            "label": p["label"]}) + "\n")
EOF
printf '%s\n\nAnswer: {{ response }}\n\nIs this answer correct? Reply yes or no.' \
  'Problem: {{ prompt }}' > "$out/judge.jinja"
printf '%s\n\nAnswer: {{ response }}\n\nThe correct answer is {{ label }}. %s' \
  'Problem: {{ prompt }}' 'Is this answer correct? Reply yes or no.' > "$out/judge_label.jinja"

# JUDGE=local: the judge without a url, judge.model on rlhf's own engine (`rlhf reward` runs it
# in its process, as a job runs it on its judge group); otherwise behind bench/judge_server.py.
local_judge=$([ "${JUDGE:-server}" = local ] && echo 1 || echo 0)
if [ "$local_judge" = 0 ]; then
  OMP_NUM_THREADS=2 "$py" bench/judge_server.py --model "$judge" --port "$port" > "$out/server.log" 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null || true' EXIT
  for _ in $(seq 120); do grep -q "judge_server:" "$out/server.log" && break; sleep 1; done
fi

for template in judge judge_label; do
  if [ "$local_judge" = 1 ]; then
    endpoint=''
    where=(--set judge.model="$judge" --set judge.dtype=fp32 --set judge.colocate_with=rollout)
  else
    endpoint='"url": "http://127.0.0.1:'$port'/v1/chat/completions", "concurrency": 1, '
    where=()
  fi
  sources='[{"rule": "math", "name": "correct"}, {"name": "judge", "weight": 0, "judge": {'$endpoint'"template": "'$out/$template.jinja'", "score": "choice:yes,no", "max_tokens": 8}}]'
  start=$(date +%s)
  # A 135M judge on a busy 2-core CPU answers in seconds; the timeout is per request.
  "$rlhf" reward examples/grpo_smollm2_arith.json --set actor.model="$judge" --set reward.sources="$sources" \
    --set reward.remote_timeout_s=600 "${where[@]}" \
    --input "$out/rows.jsonl" --verbose > "$out/$template.scores.jsonl" 2> "$out/$template.err"
  seconds=$(( $(date +%s) - start ))
  "$py" - "$out/$template.scores.jsonl" "$template" "$seconds" "$out/$template.err" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
truth = [r["sources"]["correct"] >= 1 for r in rows]
said = [r["sources"]["judge"] >= 0.5 for r in rows]
n = len(rows)
tp = sum(t and s for t, s in zip(truth, said)); tn = sum(not t and not s for t, s in zip(truth, said))
fp = sum(not t and s for t, s in zip(truth, said)); fn = sum(t and not s for t, s in zip(truth, said))
agree = (tp + tn) / n
p_yes = (sum(truth) / n) * (sum(said) / n) + (1 - sum(truth) / n) * (1 - sum(said) / n)
kappa = (agree - p_yes) / (1 - p_yes) if p_yes < 1 else 0.0
print(f"{sys.argv[2]}: {n} answers, {sum(truth)} right by the verifier; judge said yes to {sum(said)}; "
      f"agreement {agree:.3f}, kappa {kappa:.3f}; right->yes {tp}, right->no {fn}, wrong->yes {fp}, "
      f"wrong->no {tn}; {sys.argv[3]} s; " + open(sys.argv[4]).read().strip())
EOF
done
