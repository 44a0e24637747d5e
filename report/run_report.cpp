#include "report/run_report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/errors.h"
#include "report/svg.h"

namespace rlhf::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// One JSON object per non-blank line; in kLive a last line without its newline is still being
// written and is skipped.
std::vector<json> read_lines(const fs::path& path, ReadMode mode) {
  std::vector<json> rows;
  const std::string text = slurp(path);
  size_t start = 0;
  for (int64_t line = 1; start < text.size(); ++line) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) {
      if (mode == ReadMode::kLive) break;
      end = text.size();
    }
    const std::string row = text.substr(start, end - start);
    start = end + 1;
    if (row.find_first_not_of(" \t\r") == std::string::npos) continue;
    json value = json::parse(row, nullptr, /*allow_exceptions=*/false);
    if (!value.is_object())
      throw InputError(path.string() + ":" + std::to_string(line) +
                       ": expected one JSON object per line (a metrics record)");
    rows.push_back(std::move(value));
  }
  return rows;
}

// A record's number at `key`, a nested one as "distill/reverse_kl"; NaN where there is none.
double number(const json& record, const std::string& key) {
  const json::json_pointer at("/" + key);
  return record.contains(at) && record.at(at).is_number() ? record.at(at).get<double>() : NAN;
}

bool any_has(const std::vector<json>& records, const std::string& key) {
  for (const auto& r : records)
    if (std::isfinite(number(r, key))) return true;
  return false;
}

Series series_of(const std::vector<json>& records, const std::string& key, const std::string& name,
                 bool markers) {
  Series s{name, {}, markers};
  for (const auto& r : records) {
    const double v = number(r, key), step = number(r, "step");
    if (std::isfinite(v) && std::isfinite(step)) s.points.emplace_back(step, v);
  }
  return s;
}

struct ChartDef {
  const char* id;
  const char* title;
  const char* unit;
  std::vector<const char*> keys;       // from training records
  std::vector<const char*> eval_keys;  // from held-out records, drawn as dots
};

const std::vector<ChartDef>& chart_defs() {
  static const std::vector<ChartDef> kDefs = {
      {"chart-reward", "Reward", "", {"reward_mean", "return_mean"}, {}},
      // PPO-family held-out evaluation (data.eval_dataset): the verifier's accuracy.
      {"chart-eval", "Held-out accuracy", "", {}, {"accuracy", "accuracy_sampled", "pass_at_n"}},
      // With a teacher (on-policy distillation) also the reverse KL to it.
      {"chart-kl",
       "KL (nats)",
       "nats",
       {"kl", "approx_kl", "distill/reverse_kl"},
       {"distill/reverse_kl"}},
      {"chart-loss", "Losses", "", {"policy_loss", "value_loss", "loss"}, {"eval_loss"}},
      {"chart-accuracy", "Preference accuracy", "", {"accuracy"}, {"eval_accuracy"}},
      {"chart-margin", "Reward margin", "", {"margin"}, {"eval_margin"}},
      {"chart-length", "Response length (tokens)", "tokens", {"response_length"}, {}},
      {"chart-entropy", "Entropy (nats)", "nats", {"entropy"}, {}},
      {"chart-throughput", "Throughput", "samples/s", {"samples_per_s"}, {}},
      // Multi-turn rollouts (issue 31): how the trajectories use their tools.
      {"chart-tools",
       "Tool use (share of trajectories / tokens)",
       "",
       {"tool_call_rate", "masked_token_share"},
       {"tool_call_rate"}},
  };
  return kDefs;
}

// Phases of time_s in the order a step runs them; others after, by name.
std::vector<std::string> phase_order(const std::vector<json>& steps) {
  static const std::vector<std::string> kOrder = {"generate", "generate_ahead", "score", "train",
                                                  "sync"};
  std::set<std::string> seen;
  for (const auto& r : steps)
    if (r.contains("time_s") && r["time_s"].is_object())
      for (const auto& [k, v] : r["time_s"].items())
        if (k != "step" && v.is_number()) seen.insert(k);
  std::vector<std::string> parts;
  for (const auto& p : kOrder)
    if (seen.erase(p)) parts.push_back(p);
  parts.insert(parts.end(), seen.begin(), seen.end());
  return parts;
}

std::string timeline(const std::vector<json>& steps) {
  StackedBars c;
  c.id = "chart-phases";
  c.title = "Phase timeline per step (seconds)";
  c.unit = "s";
  c.parts = phase_order(steps);
  const bool phased = !c.parts.empty();
  if (!phased) c.parts = {"step"};  // dpo/sft/rm: time_s is the step's seconds
  c.total.name = "step (whole)";
  for (const auto& r : steps) {
    const double step = number(r, "step");
    if (!std::isfinite(step) || !r.contains("time_s")) continue;
    const json& t = r["time_s"];
    std::vector<double> values;
    if (phased && t.is_object()) {
      for (const auto& p : c.parts) values.push_back(number(t, p));
      const double whole = number(t, "step");
      if (std::isfinite(whole)) c.total.points.emplace_back(step, whole);
    } else if (t.is_number()) {
      values.push_back(t.get<double>());
    } else {
      continue;
    }
    c.columns.emplace_back(step, values);
  }
  return stacked_bars_svg(c);
}

// Issue 42.4: each role group's busy share of the step (busy_s / time_s.step), one line per
// group, and all devices together (devices_busy): which group the others wait on.
std::string busy_chart(const std::vector<json>& steps) {
  LineChart c{"chart-busy", "Busy share of each step per role group", "", {}};
  std::map<std::string, Series> by_role;
  for (const auto& r : steps) {
    const double step = number(r, "step");
    if (!std::isfinite(step) || !r.contains("busy_s") || !r["busy_s"].is_object() ||
        !r.contains("time_s") || !r["time_s"].is_object())
      continue;
    const double t = number(r["time_s"], "step");
    if (!(t > 0)) continue;
    for (const auto& [role, v] : r["busy_s"].items()) {
      if (!v.is_number()) continue;
      Series& series = by_role[role];
      series.name = role;
      series.points.emplace_back(step, v.get<double>() / t);
    }
  }
  if (by_role.empty()) return "";
  for (auto& [role, series] : by_role) c.series.push_back(std::move(series));
  c.series.push_back(series_of(steps, "devices_busy", "all devices", false));
  return line_chart_svg(c);
}

// Issue 42.4: the last steps' busy intervals per role group (the record's "timeline"), end to
// end: where each group waited on which within a step.
std::string lanes_chart(const std::vector<json>& steps) {
  constexpr size_t kShown = 5;
  std::vector<const json*> with;
  for (const auto& r : steps)
    if (r.contains("timeline") && r["timeline"].is_object() && r.contains("time_s") &&
        r["time_s"].is_object() && std::isfinite(number(r, "step")))
      with.push_back(&r);
  if (with.size() > kShown) with.erase(with.begin(), with.end() - kShown);
  Lanes c{"chart-lanes", "Busy role groups over the last steps", {}, {}};
  for (const json* r : with)
    for (const auto& [role, v] : (*r)["timeline"].items())
      if (std::find(c.lanes.begin(), c.lanes.end(), role) == c.lanes.end()) c.lanes.push_back(role);
  if (c.lanes.empty()) return "";
  for (const json* r : with) {
    LaneStep s;
    s.step = number(*r, "step");
    s.seconds = number((*r)["time_s"], "step");
    if (!(s.seconds > 0)) continue;
    for (const auto& role : c.lanes) {
      std::vector<std::pair<double, double>> busy;
      const json lane = (*r)["timeline"].value(role, json::array());
      for (const auto& iv : lane)
        if (iv.is_array() && iv.size() == 2 && iv[0].is_number() && iv[1].is_number())
          busy.emplace_back(iv[0].get<double>(), iv[1].get<double>());
      s.busy.push_back(std::move(busy));
    }
    c.steps.push_back(std::move(s));
  }
  return lanes_svg(c);
}

std::string ratio_note(double measured, double planned, const char* what) {
  if (!(measured >= 0) || !(planned > 0)) return "";
  std::ostringstream o;
  o.precision(3);
  o << what << " " << measured / planned << "x plan";
  return o.str();
}

// Memory per role and rank: measured (latest record with "memory") beside planned; before
// any measurement, plan.json alone.
std::string memory_charts(const RunRecords& run) {
  const json* memory = nullptr;
  for (auto it = run.steps.rbegin(); it != run.steps.rend() && !memory; ++it)
    if (it->contains("memory") && (*it)["memory"].is_object()) memory = &(*it)["memory"];
  GroupedBars process{"chart-memory-process",
                      "Process memory per worker: planned total vs measured peak RSS",
                      "bytes",
                      {"planned total", "measured RSS"},
                      {},
                      {}};
  GroupedBars tensors{"chart-memory-tensor",
                      "Tracked tensor memory per worker: planned vs measured peak",
                      "bytes",
                      {"planned tensor", "measured tensor"},
                      {},
                      {}};
  GroupedBars cuda{"chart-memory-cuda",
                   "CUDA allocator per worker: planned vs measured peak allocated",
                   "bytes",
                   {"planned allocated", "measured allocated", "measured reserved"},
                   {},
                   {}};
  const auto get = [](const json& o, const char* key) {
    return o.contains(key) && o[key].is_number() ? o[key].get<double>() : -1.0;
  };
  if (memory) {
    for (const auto& [role, ranks] : memory->items()) {
      if (!ranks.is_array()) continue;
      for (const auto& r : ranks) {
        const std::string label = role + "[" + std::to_string(r.value("rank", 0)) + "] " +
                                  r.value("device", std::string("?"));
        const double pt = get(r, "planned_total_bytes"), rss = get(r, "peak_rss_bytes");
        const double pe = get(r, "planned_tensor_bytes"), te = get(r, "peak_tensor_bytes");
        process.groups.push_back({label, {pt, rss}, ratio_note(rss, pt, "RSS"), false});
        if (pe >= 0 || te >= 0)
          tensors.groups.push_back({label, {pe, te}, ratio_note(te, pe, "tensor"), false});
        const double ca = get(r, "cuda_peak_allocated_bytes");
        if (ca >= 0)
          cuda.groups.push_back(
              {label,
               {get(r, "planned_cuda_allocated_bytes"), ca, get(r, "cuda_peak_reserved_bytes")},
               "",
               false});
      }
    }
  } else if (run.plan.is_object() && run.plan.contains("memory") &&
             run.plan["memory"].contains("roles")) {
    for (const auto& [role, p] : run.plan["memory"]["roles"].items()) {
      const int ranks = p.value("group_size", 1);
      for (int rank = 0; rank < ranks; ++rank) {
        const std::string label = role + "[" + std::to_string(rank) + "]";
        process.groups.push_back({label, {get(p, "device_total"), -1}, "not measured yet", false});
        tensors.groups.push_back({label, {get(p, "engine_peak"), -1}, "not measured yet", false});
      }
    }
  }
  std::string out = grouped_bars_svg(process) + grouped_bars_svg(tensors);
  if (!cuda.groups.empty()) out += grouped_bars_svg(cuda);
  return out;
}

// The latest value of each headline figure.
std::string summary(const RunRecords& run) {
  static const std::vector<std::pair<const char*, const char*>> kKeys = {
      {"reward_mean", ""},
      {"kl", "nats"},
      {"policy_loss", ""},
      {"value_loss", ""},
      {"loss", ""},
      {"accuracy", ""},
      {"margin", ""},
      {"response_length", "tokens"},
      {"tool_call_rate", ""},
      {"turns_mean", "turns"},
      {"entropy", "nats"},
      {"samples_per_s", "samples/s"},
      {"tokens_per_s", "tokens/s"},
      {"lr", ""},
      {"grad_norm", ""}};
  std::ostringstream o;
  o << "<table id=\"summary\"><tr><th>latest</th><th>value</th></tr>";
  if (!run.steps.empty()) {
    const json& last = run.steps.back();
    for (const auto& [key, unit] : kKeys) {
      const double v = number(last, key);
      if (!std::isfinite(v)) continue;
      o << "<tr><td class=\"key\">" << escape(key) << "</td><td class=\"value\" data-key=\""
        << escape(key) << "\">" << escape(format_value(v, unit)) << "</td></tr>";
    }
    if (last.contains("time_s")) {
      const json& t = last["time_s"];
      const double step_s = t.is_object()   ? number(t, "step")
                            : t.is_number() ? t.get<double>()
                                            : NAN;
      if (std::isfinite(step_s))
        o << "<tr><td class=\"key\">time_s.step</td><td class=\"value\" data-key=\"time_s.step\">"
          << escape(format_value(step_s, "s")) << "</td></tr>";
    }
  }
  if (!run.evals.empty()) {
    const json& e = run.evals.back();
    for (const char* key : {"eval_loss", "eval_accuracy", "eval_margin", "eval_perplexity"}) {
      const double v = number(e, key);
      if (std::isfinite(v))
        o << "<tr><td class=\"key\">" << key << " (" << escape(e.value("when", std::string()))
          << ", step " << format_value(number(e, "step"), "") << ")</td><td class=\"value\" "
          << "data-key=\"" << key << "\">" << escape(format_value(v, "")) << "</td></tr>";
    }
  }
  o << "</table>";
  return o.str();
}

std::string clip(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  size_t cut = n;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // UTF-8 start
  return s.substr(0, cut) + "...";
}

// A multi-turn sample's turns after the prompt, one block each with its role: the model's
// turns, the environment's answers (tool or user) and an initial observation.
std::string conversation_cell(const json& turns) {
  std::ostringstream o;
  for (const auto& t : turns) {
    const std::string role = t.value("role", std::string());
    if (role == "prompt" || !t.contains("content") || !t["content"].is_string()) continue;
    o << "<div class=\"turn " << escape(role) << "\"><b>" << escape(role) << "</b>"
      << (t.value("truncated", false) ? " (cut by the token budget)" : "") << ": "
      << escape(clip(t["content"].get<std::string>(), 400)) << "</div>";
  }
  return o.str();
}

std::string samples_table(const RunRecords& run) {
  if (run.samples.empty()) return "";
  std::ostringstream o;
  o << "<h2>Samples of step " << escape(run.samples.front().value("step", json(0)).dump())
    << "</h2><table id=\"samples\"><tr><th>prompt</th><th>response</th><th>reward</th></tr>";
  for (const auto& s : run.samples) {
    const auto str = [&s](const char* k) {
      return s.contains(k) ? (s[k].is_string() ? s[k].get<std::string>() : s[k].dump())
                           : std::string();
    };
    o << "<tr><td>" << escape(clip(str("prompt"), 400)) << "</td><td>"
      << (s.contains("conversation") ? conversation_cell(s["conversation"])
                                     : escape(clip(str("response"), 400)))
      << "</td><td>" << escape(format_value(number(s, "reward"), "")) << "</td></tr>";
  }
  o << "</table>";
  return o.str();
}

const char* kStyle =
    "body{font-family:sans-serif;margin:16px;color:#222;max-width:1400px}"
    "h1{font-size:20px}h2{font-size:16px;margin-top:24px}"
    ".meta{color:#555}.charts{display:flex;flex-wrap:wrap;gap:12px}"
    "svg.chart{border:1px solid #ddd;background:#fff}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;"
    "text-align:left;vertical-align:top}td.value{text-align:right;font-variant-numeric:"
    "tabular-nums}#samples td{max-width:500px;white-space:pre-wrap}"
    ".turn{margin:2px 0}.turn.tool,.turn.user,.turn.observation{background:#f3f3f3}"
    ".warning{color:#b35900}#live-status{color:#2e7d32}";

}  // namespace

RunRecords read_run(const std::string& dir, ReadMode mode) {
  RunRecords run;
  run.dir = dir;
  fs::path p(dir);
  run.name = (p.has_filename() ? p.filename() : p.parent_path().filename()).string();
  if (!fs::is_directory(p))
    throw InputError(dir + ": not a directory (expected a run directory, <logger.run_dir>/<name>)");
  const fs::path metrics = p / "metrics.jsonl";
  if (fs::exists(metrics)) {
    for (auto& r : read_lines(metrics, mode)) {
      if (r.value("split", std::string()) == "eval")
        run.evals.push_back(std::move(r));
      else
        run.steps.push_back(std::move(r));
    }
  } else if (mode == ReadMode::kComplete) {
    throw InputError(metrics.string() +
                     ": not found (expected a run directory that `rlhf run` has logged to)");
  }
  if (fs::exists(p / "plan.json")) {
    run.plan = json::parse(slurp(p / "plan.json"), nullptr, /*allow_exceptions=*/false);
    if (run.plan.is_discarded()) {
      if (mode == ReadMode::kComplete)
        throw InputError((p / "plan.json").string() + ": not valid JSON (written by `rlhf run`)");
      run.plan = nullptr;
    }
  }
  if (fs::exists(p / "samples.jsonl")) {
    std::vector<json> rows = read_lines(p / "samples.jsonl", mode);
    double last = -INFINITY;
    for (const auto& r : rows) last = std::max(last, number(r, "step"));
    for (auto& r : rows)
      if (number(r, "step") == last) run.samples.push_back(std::move(r));
  }
  return run;
}

std::string report_body(const RunRecords& run) {
  std::ostringstream o;
  o << "<div id=\"report-body\">";
  const json* last = run.steps.empty() ? nullptr : &run.steps.back();
  o << "<p class=\"meta\">run directory <code>" << escape(run.dir) << "</code>";
  if (last)
    o << " &middot; step <span id=\"last-step\">" << escape(last->value("step", json(0)).dump())
      << "</span> of " << escape(last->value("total_steps", json("?")).dump());
  else
    o << " &middot; <span id=\"last-step\">no step logged yet</span>";
  o << " &middot; " << run.steps.size() << " records";
  if (!run.evals.empty()) o << ", " << run.evals.size() << " held-out evaluations";
  o << "</p>";
  o << summary(run);
  o << "<h2>Training</h2><div class=\"charts\">";
  for (const ChartDef& d : chart_defs()) {
    LineChart c{d.id, d.title, d.unit, {}};
    for (const char* k : d.keys)
      if (any_has(run.steps, k)) c.series.push_back(series_of(run.steps, k, k, false));
    for (const char* k : d.eval_keys)
      if (any_has(run.evals, k))
        c.series.push_back(series_of(run.evals, k, std::string(k) + " (held-out)", true));
    if (!c.series.empty()) o << line_chart_svg(c);
  }
  o << timeline(run.steps) << busy_chart(run.steps) << lanes_chart(run.steps) << "</div>";
  o << "<h2>Memory per role and rank</h2><div class=\"charts\">" << memory_charts(run) << "</div>";
  o << samples_table(run);
  o << "</div>";
  return o.str();
}

std::string html_page(const std::string& title, const std::string& body,
                      const std::string& script) {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << escape(title)
    << "</title><style>" << kStyle << "</style></head><body><h1>" << escape(title) << "</h1>"
    << body;
  if (!script.empty()) o << "<script>" << script << "</script>";
  o << "</body></html>\n";
  return o.str();
}

std::string report_page(const RunRecords& run, PageKind kind) {
  if (kind == PageKind::kFile) return html_page("rlhf run " + run.name, report_body(run));
  // Live: the server's own rendering of the body every 2 s; when the job ends the server goes
  // and the page says so (the last figures stay on screen).
  const std::string status =
      "<p id=\"live-status\">live: serving while the job runs, refreshed every 2 s</p>";
  const char* script =
      "const st=document.getElementById('live-status');let n=0;"
      "async function tick(){try{const r=await fetch('/body',{cache:'no-store'});"
      "if(!r.ok)throw new Error('HTTP '+r.status);const t=await r.text();"
      "document.getElementById('report-body').outerHTML=t;n++;"
      "st.textContent='live: updated '+new Date().toLocaleTimeString()+' ('+n+' updates)';}"
      "catch(e){st.textContent='the job has ended or its server stopped ('+e.message+'); "
      "rlhf report RUN_DIR writes this page as a file';st.style.color='#b35900';"
      "clearInterval(timer);}}"
      "const timer=setInterval(tick,2000);tick();";
  return html_page("rlhf run " + run.name + " (live)", status + report_body(run), script);
}

}  // namespace rlhf::report
